"""The mechanism as a continuous outcome on a ladder of widths (paper B): in one attribute-pool world shape, each
regime trained at d = ratio x R A for every ratio of the ladder (R A: the width orthogonal attribute codes need),
so that zero-shot accuracy and held-out superposition R^2 are read as curves against d / (R A), each regime at its
own threshold (the smallest rung where it memorises), and at the same absolute d across N.

    python -m synthetic.mechanism_curve --out runs/curve --subjects 256 --relations 4 --attributes 16 \\
        [--ratios 0.25 0.5 0.75 1 1.5 2 4] [--seeds 0 1 2 3 4] [--executor ray]
    python -m synthetic.mechanism_curve --out runs/curve --export docs/runs/pool      # into DIR/curve

Each model is one run of :mod:`synthetic.threshold_study` (the same two regimes, training and probes), written to
``<out>/N<N>_R<R>_A<A>/<regime>_r<ratio>_seed<s>/summary.json``; a rerun skips finished models and resumes a stopped
one from its checkpoint. The page section: :func:`section` (in ``docs/results_pool.md``).
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

import numpy as np

from synthetic.threshold_study import REGIMES

RATIOS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0)  # d / (R A) of the ladder
MEMORISED = 0.99  # training accuracy over all N R facts at which a model memorises (the capacity search's target)


def width(ratio: float, r: int, a: int) -> int:
    """The ladder's d for ``ratio``: ceil(ratio R A)."""
    return int(math.ceil(ratio * r * a))


def specs(out: Path, n: int, r: int, a: int, ratios, regimes, seeds, mlp_width: int, steps: int, device: str):
    """(folder, keyword arguments of :func:`synthetic.threshold_study.run_one`) for every model of the ladder."""
    world = out / f"N{n}_R{r}_A{a}"
    return [(world / f"{regime}_r{ratio:g}_seed{s}",
             dict(regime=regime, n=n, r=r, a=a, d=width(ratio, r, a), mlp_width=mlp_width, seed=s, steps=steps,
                  device=device, extra={"ratio": float(ratio)}))
            for regime in regimes for ratio in ratios for s in seeds]


RUNS = "N*_R*_A*/*_r*_seed*/summary.json"  # a ladder model's summary under --out


def collect(out: Path) -> list[dict]:
    from synthetic.pool_runs import read_summaries

    return read_summaries(out, RUNS)


def export(out: Path, dest: Path) -> int:
    """Copies every finished ladder model's summary.json to ``dest/curve`` (same layout)."""
    from synthetic.pool_runs import copy_summaries

    return copy_summaries(out, RUNS, dest / "curve")


def _seed_mean(values: list[float]) -> str:
    """Mean over seeds with a bootstrap interval over the seeds where that scheme has enough distinct resamples;
    otherwise the seeds' range, said so."""
    from mechfact import stats

    est, _ = stats.stratified_bootstrap(values, lambda v: float(np.mean(v)), strata=[0] * len(values))
    if est.low is not None:
        return f"{est.value:.2f} [{est.low:.2f}, {est.high:.2f}]"
    return f"{est.value:.2f} (range {min(values):.2f}-{max(values):.2f})"


def _groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    g: dict[tuple, list[dict]] = {}
    for r in rows:
        g.setdefault((r["subjects"], r["relations"], r["attributes"], r["regime"], r["ratio"]), []).append(r)
    return {k: sorted(v, key=lambda x: x["seed"]) for k, v in sorted(g.items())}


def own_thresholds(rows: list[dict]) -> list[dict]:
    """Per (world shape, regime, seed): the smallest rung whose model memorises (training accuracy >=
    :data:`MEMORISED`), with its zero-shot accuracy and R^2; ``at_min`` when that is the ladder's first rung (the
    threshold is at most there), ``None`` rung when no rung memorises."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault((r["subjects"], r["relations"], r["attributes"], r["regime"], r["seed"]), []).append(r)
    out = []
    for key, rs in sorted(by.items()):
        rs = sorted(rs, key=lambda x: x["ratio"])
        hit = next((r for r in rs if r["train_accuracy"] >= MEMORISED), None)
        out.append({"key": key, "ratio": None if hit is None else hit["ratio"], "at_min": hit is rs[0],
                    "zero_shot": None if hit is None else hit["zero_shot_accuracy"],
                    "r2": None if hit is None else hit["r2_heldout"], "rungs": [r["ratio"] for r in rs]})
    return out


def _own_by_world(rows: list[dict]) -> dict[tuple, list[dict]]:
    """:func:`own_thresholds` per (N, R, A, regime), seeds in order."""
    by: dict[tuple, list[dict]] = {}
    for t in own_thresholds(rows):
        by.setdefault(t["key"][:4], []).append(t)
    return by


def _reading(rows: list[dict]) -> list[str]:
    """One line per world shape and regime: the mean zero-shot accuracy at the ladder's ends and at its own
    threshold (the median rung over seeds where every seed memorises somewhere on the ladder)."""
    g = _groups(rows)
    out = []
    for key, ts in _own_by_world(rows).items():
        curve = sorted((k[4], np.mean([x["zero_shot_accuracy"] for x in v])) for k, v in g.items() if k[:4] == key)
        (lo, z_lo), (hi, z_hi) = curve[0], curve[-1]
        top = max(curve, key=lambda c: c[1])
        line = (f"- N = {key[0]}, R = {key[1]}, A = {key[2]}, {key[3]}: mean zero-shot {z_lo:.2f} at x = {lo:g}, "
                f"{z_hi:.2f} at x = {hi:g} (highest {top[1]:.2f}, at x = {top[0]:g})")
        if all(t["ratio"] is not None for t in ts):
            x = float(np.median([t["ratio"] for t in ts]))
            line += (f"; its own threshold at x = {x:g} (median over {len(ts)} seeds"
                     + (", a bound: the first rung" if all(t["at_min"] for t in ts) else "")
                     + f"), zero-shot there {np.median([t['zero_shot'] for t in ts]):.2f}")
        out.append(line + ".")
    return out


def _across_n(rows: list[dict]) -> list[str]:
    """At the same absolute d, R and A, the mean over seeds at each N and the difference between the largest and
    the smallest N, with a bootstrap over the (N, seed) units resampled within each N."""
    from mechfact import stats

    g = _groups(rows)
    ns = sorted({k[0] for k in g})
    if len(ns) < 2:
        return []
    lo, hi = ns[0], ns[-1]
    lines = [f"The same absolute d at N = {lo} and N = {hi} (same R, A and regime; each N its own worlds, so the "
             f"difference resamples the seeds of each N independently):", "",
             f"| R | A | regime | d | d / (R A) | zero-shot N = {lo} | zero-shot N = {hi} | difference [95%] | "
             f"R^2 N = {lo} | R^2 N = {hi} | difference [95%] |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (n, r, a, regime, ratio), small in g.items():
        big = g.get((hi, r, a, regime, ratio))
        if n != lo or not big:
            continue
        cells = []
        for key in ("zero_shot_accuracy", "r2_heldout"):
            x = np.array([[s[key], 0.0] for s in small] + [[b[key], 1.0] for b in big])

            def diff(v):
                return float(v[v[:, 1] == 1, 0].mean() - v[v[:, 1] == 0, 0].mean())
            est, _ = stats.stratified_bootstrap(x, diff, strata=list(x[:, 1]))
            ci = f" [{est.low:+.2f}, {est.high:+.2f}]" if est.low is not None else " (too few seeds for an interval)"
            cells += [f"{np.mean([s[key] for s in small]):.2f}", f"{np.mean([b[key] for b in big]):.2f}",
                      f"{est.value:+.2f}{ci}"]
        lines.append(f"| {r} | {a} | {regime} | {small[0]['d']} | {ratio:g} | " + " | ".join(cells) + " |")
    return lines + [""]


def _trends(rows: list[dict]) -> str:
    """Spearman's rho of zero-shot accuracy and of R^2 against d / (R A), per world shape and regime, over its
    models (permutation p, Holm over every test of the section)."""
    from mechfact import stats

    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault((r["subjects"], r["relations"], r["attributes"], r["regime"]), []).append(r)
    tests = []
    for (n, r, a, regime), rs in sorted(by.items()):
        for key, label in (("zero_shot_accuracy", "zero-shot"), ("r2_heldout", "R^2")):
            t = stats.spearman([x["ratio"] for x in rs], [x[key] for x in rs], seed=0)
            if t["p_value"] is not None:
                tests.append((f"N = {n}, R = {r}, A = {a}, {regime}, {label}", t, len(rs)))
    if not tests:
        return ""
    holm = stats.holm([t["p_value"] for _, t, _ in tests])
    return (f"Spearman's rho against d / (R A) over each ladder's models (permutation p; Holm over these {len(tests)} "
            "tests): " + "; ".join(f"{name}: {t['rho']:+.2f} (n {k}, p {t['p_value']:.3g}, Holm {h:.3g})"
                                   for (name, t, k), h in zip(tests, holm)) + ".")


def section(rows: list[dict]) -> list[str]:
    """The page's ladder subsection (nothing without runs)."""
    if not rows:
        return []
    worlds = sorted({(r["subjects"], r["relations"], r["attributes"]) for r in rows})
    ratios = sorted({r["ratio"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})
    cmds = " and ".join(f"`python -m synthetic.mechanism_curve --out runs/curve --subjects {n} --relations {r} "
                        f"--attributes {a}`" for n, r, a in worlds)
    out = ["### On a ladder of widths", "",
           f"{cmds} (exported with `--export docs/runs/pool`): both regimes of section 2 trained at d = ceil(x R A) "
           f"for x = {', '.join(f'{x:g}' for x in ratios)}, seeds {', '.join(map(str, seeds))} (a seed is a new "
           "world and initialisation), every model probed as in section 2. Mean over seeds; the interval is a "
           "percentile bootstrap over the seeds where that has at least 100 distinct resamples (5 seeds or more), "
           "otherwise the seeds' range is given.", "",
           "| N | R | A | regime | d / (R A) | d | seeds | train accuracy | zero-shot | R^2 held-out | "
           "zero-shot control |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (n, r, a, regime, ratio), g in _groups(rows).items():
        out.append(f"| {n} | {r} | {a} | {regime} | {ratio:g} | {g[0]['d']} | {len(g)} | "
                   f"{statistics.mean(x['train_accuracy'] for x in g):.2f} | "
                   f"{_seed_mean([x['zero_shot_accuracy'] for x in g])} | {_seed_mean([x['r2_heldout'] for x in g])} "
                   f"| {statistics.mean(x['zero_shot_control_accuracy'] for x in g):.2f} |")
    out += ["", f"Each regime at its own threshold on the ladder: per seed, the smallest rung whose model memorises "
            f"(training accuracy >= {MEMORISED} over all N R facts, the capacity search's criterion; `<= x`: it "
            "already memorises at the first rung) and what it shows there:", "",
            "| N | R | A | regime | own threshold d / (R A), per seed | zero-shot there | R^2 there |",
            "|---|---|---|---|---|---|---|"]
    for (n, r, a, regime), ts in _own_by_world(rows).items():
        def cell(t):
            if t["ratio"] is None:
                return f"> {max(t['rungs']):g}"
            return f"<= {t['ratio']:g}" if t["at_min"] else f"{t['ratio']:g}"
        hit = [t for t in ts if t["ratio"] is not None]
        z = ", ".join(f"{t['zero_shot']:.2f}" for t in hit) or "-"
        r2 = ", ".join(f"{t['r2']:.2f}" for t in hit) or "-"
        out.append(f"| {n} | {r} | {a} | {regime} | {', '.join(cell(t) for t in ts)} | {z} | {r2} |")
    out += ["", *_reading(rows), "", *_across_n(rows)]
    trends = _trends(rows)
    if trends:
        out += [trends, ""]
    out += ["![the mechanism on a ladder of widths](img/mechanism_ladder.png)", ""]
    return out


def figure(rows: list[dict], path: Path) -> None:
    from mechfact.plotting import save, subplots
    from synthetic.pool_mechanism import ratio_axis

    fig, axes = subplots(1, 2, figsize=(10, 4))
    colors = {"default": "tab:blue", "geometric": "tab:orange"}
    styles = ["-", "--", ":", "-."]
    worlds = sorted({(r["subjects"], r["relations"], r["attributes"]) for r in rows})
    groups = _groups(rows)
    ticks = sorted({r["ratio"] for r in rows})
    for ax, key, label in ((axes[0], "zero_shot_accuracy", "zero-shot accuracy"),
                           (axes[1], "r2_heldout", "held-out superposition R^2")):
        for i, (n, r, a) in enumerate(worlds):
            for regime in REGIMES:
                g = {k[4]: v for k, v in groups.items() if k[:4] == (n, r, a, regime)}
                if not g:
                    continue
                xs = sorted(g)
                vals = [[x[key] for x in g[ratio]] for ratio in xs]
                mean = [float(np.mean(v)) for v in vals]
                ax.errorbar(xs, mean, yerr=[[m - min(v) for m, v in zip(mean, vals)],
                                            [max(v) - m for m, v in zip(mean, vals)]],
                            color=colors.get(regime), ls=styles[i % len(styles)], marker="o", ms=3, capsize=2,
                            label=f"{regime}, N={n} R={r} A={a}")
        ratio_axis(ax, label, legend=7)
        ax.set_xticks(ticks, [f"{x:g}" for x in ticks])
        ax.minorticks_off()
    fig.suptitle("The mechanism on a ladder of widths (mean over seeds, bars: the seeds' range)")
    save(fig, path)


def main(argv=None) -> None:
    from synthetic import threshold_study as T

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/curve")
    ap.add_argument("--subjects", type=int, default=256)
    ap.add_argument("--relations", type=int, default=4)
    ap.add_argument("--attributes", type=int, default=16)
    ap.add_argument("--ratios", type=float, nargs="+", default=list(RATIOS), help="d / (R A) of each rung")
    ap.add_argument("--regimes", nargs="+", choices=REGIMES, default=list(REGIMES))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--mlp-width", type=int, default=64, help="the capacity search's width (default 64)")
    ap.add_argument("--steps", type=int, default=2000, help="default regime's budget (the capacity search's)")
    ap.add_argument("--device", default="cpu")
    T.add_executor_flags(ap)
    ap.add_argument("--export", default=None, metavar="DIR", help="copy the finished runs' summaries to DIR/curve")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.export:
        print(f"{export(out, Path(a.export))} files copied to {a.export}/curve")
        return
    bad = [x for x in a.ratios if not x > 0]
    if bad:
        ap.error(f"--ratios {' '.join(f'{x:g}' for x in bad)}: each must be > 0")
    with T.executor_of(ap, a) as ex:
        T.run_many(specs(out, a.subjects, a.relations, a.attributes, a.ratios, a.regimes, a.seeds, a.mlp_width,
                         a.steps, a.device), ex)
    print("\n".join(section(collect(out))))


if __name__ == "__main__":
    main()
