"""The page ``docs/results_pool.md`` (paper B in its own setting: attribute-pool worlds), written from run
folders alone, and the export that copies those run folders' JSON into ``docs/runs/pool``.

    python -m synthetic.results_pool --out runs/threshold --capacity-runs runs/facts --export docs/runs/pool
    python -m synthetic.results_pool --out docs/runs/pool --doc docs/results_pool.md   # the page, from runs alone

The runs themselves come from :mod:`synthetic.facts_study` (the capacity thresholds), :mod:`synthetic.threshold_study`
(the mechanism at d*) and :mod:`synthetic.regime_map` (the regime map); this module only reads them.
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

from synthetic.threshold_study import GEOMETRIC, collect, figure, table
from synthetic.pool_estimates import _device_line, _estimate, _map_estimate, _twice_line
from synthetic.pool_mechanism import _reading, mechanism_figure, mechanism_rows, mechanism_section
from synthetic.pool_runs import _capacity_part, export, pool_thresholds



WIDTH_REGIMES = ("trainable", "frozen-input", "frozen")


def width_table(recs: list[dict], grid_max: int | dict[int, int]) -> str:
    """m* per (N, R, A) for each embedding regime (per seed and median; "> g": never reached within the grid,
    "<= g": at the grid's smallest value in some seed), the frozen / trainable ratio of the medians, and per
    fixed-embedding regime least-squares lines of the median m* against N R and N R ln A, each slope with a 95%
    bootstrap interval over seeds (a seed's thresholds resampled together)."""
    import numpy as np

    from mechfact.facts.capacity import slope_interval
    from mechfact.stats import MIN_DISTINCT

    top = grid_max if isinstance(grid_max, dict) else {t["subjects"]: grid_max for t in recs}  # the grid's top per N
    cells: dict[tuple, dict[str, list]] = {}
    for t in recs:
        cells.setdefault((t["subjects"], t["attributes"], t["relations"]), {}).setdefault(t["embeddings"], []).append(t)
    regimes = [e for e in WIDTH_REGIMES if any(e in c for c in cells.values())]

    def median(ts):
        vals = [t["threshold"] for t in ts]
        return None if not vals or None in vals else float(np.median(vals))

    def cell(ts):
        if not ts:
            return "—"
        vals = ", ".join(f"> {top[t['subjects']]}" if t["threshold"] is None else str(t["threshold"])
                         for t in sorted(ts, key=lambda t: t["seed"]))
        med = median(ts)
        bound = "<= " if any(t.get("at_grid_min") for t in ts) else ""
        return f"{vals} ({'—' if med is None else f'{bound}{med:g}'})"

    head = ["N", "R", "A", "N R"] + [f"m* {e} (median)" for e in regimes]
    if "trainable" in regimes and "frozen" in regimes:
        head.append("frozen / trainable")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (n, a, r), c in sorted(cells.items()):
        row = [str(n), str(r), f"{a}{' (= N)' if a == n else ''}", str(n * r)] + [cell(c.get(e, [])) for e in regimes]
        if len(head) > len(row):
            mt, mf = median(c.get("trainable", [])), median(c.get("frozen", []))
            row.append("—" if mt is None or mf is None else f"{mf / mt:.0f}x")
        lines.append("| " + " | ".join(row) + " |")
    fits = []
    for e in regimes:
        if e == "trainable":
            continue
        reached = [(n, a, r) for (n, a, r), c in cells.items() if median(c.get(e, []))]
        if len(reached) < 3:
            continue
        rows = [{**t, "n_r": t["subjects"] * t["relations"],
                 "n_r_ln_a": t["subjects"] * t["relations"] * np.log(t["attributes"])}
                for k in reached for t in cells[k][e]]
        for name, xname in (("N R", "n_r"), ("N R ln A", "n_r_ln_a")):
            slope, icpt, r2 = median_line(rows, xname)
            ci, distinct = slope_interval(rows, xname)  # seeds resampled within each setting
            band = f" [{ci.low:.3g}, {ci.high:.3g}]" if ci.low is not None else f" (no interval: {distinct} resamples)"
            fits.append(f"| {e} | m* = a {name} + b | {slope:.3g}{band} | {icpt:.1f} | {r2:.2f} | {len(reached)} |")
    if fits:
        lines += ["", "| regime | fit of the median m* (settings that reached) | slope [95%, seeds resampled within "
                  "each setting] | intercept | R^2 | points |", "|---|---|---|---|---|---|", *fits]
        per: dict[tuple, set] = {}
        for t in recs:
            per.setdefault((t["subjects"], t["relations"], t["attributes"], t["embeddings"]), set()).add(t["seed"])
        lo, hi = min(map(len, per.values())), max(map(len, per.values()))
        k = str(lo) if lo == hi else f"{lo}-{hi}"
        lines += ["", f"The interval resamples the {k} seeds of each setting independently (a seed is a new world "
                  "and initialisation); with k seeds a setting has C(2k - 1, k) resamples (3 for two seeds, 10 for "
                  f"three), the fit their product over settings; below {MIN_DISTINCT} distinct resamples no interval "
                  f"is given. With {k} seeds per setting it says how far the seeds agree, not yet the spread over "
                  "worlds."]
    # the same number of facts in worlds of different N (N = 256, R = 8 beside N = 1024, R = 2): does m* follow N R?
    same = {}
    for (n, a, r), c in cells.items():
        if a != n:  # a pool of A attributes (A = N changes with N)
            same.setdefault((n * r, a), []).append((n, r, c))
    pairs = []
    for (nr, a), group in sorted(same.items()):
        if len({n for n, _, _ in group}) < 2:
            continue
        for e in regimes:
            cells_e = [(n, r, median(c.get(e, []))) for n, r, c in sorted(group) if c.get(e)]
            if len(cells_e) > 1:
                pairs.append(f"| {nr} | {a} | {e} | " + "; ".join(
                    f"N = {n}, R = {r}: {'—' if m is None else f'{m:g}'}" for n, r, m in cells_e) + " |")
    if pairs:
        lines += ["", "The same number of facts N R at different N (median m*; a dash: a seed never reached):", "",
                  "| N R | A | regime | median m* by N |", "|---|---|---|---|", *pairs]
    return "\n".join(lines)


def median_line(rows: list[dict], xname: str) -> tuple[float, float, float]:
    """Least-squares line of the per-setting median threshold of ``rows`` against their field ``xname`` (the
    point values whose slope :func:`~mechfact.facts.capacity.slope_interval` bootstraps): (slope, intercept,
    R^2); NaNs when fewer than two x values."""
    import numpy as np

    from mechfact.facts.capacity import line_fit

    med: dict[tuple, list] = {}
    for t in rows:
        med.setdefault((t["subjects"], t["attributes"], t["relations"]), []).append((t[xname], t["threshold"]))
    x = np.array([v[0][0] for v in med.values()], dtype=float)
    y = np.array([np.median([b for _, b in v]) for v in med.values()], dtype=float)
    if len(np.unique(x)) < 2:
        return float("nan"), float("nan"), float("nan")
    slope, icpt, r2 = line_fit(x, y)
    return slope, icpt, float("nan") if r2 is None else r2


def dstar_table(summ: dict) -> str:
    """The thresholds and fits of :func:`~mechfact.facts.experiments.summarise_thresholds`'s ``summ``."""
    lines = ["| N | R | A | R ln N | R ln A | d* per seed | median d* | d* / (R ln A) |",
             "|---|---|---|---|---|---|---|---|"]
    for t in sorted(summ["table"], key=lambda t: (t["subjects"], t["attributes"], t["relations"])):
        med = t["median_threshold"]
        vals = ", ".join("—" if v is None else str(v) for v in t["thresholds"])
        bound = "<= " if t["at_grid_min"] else ""
        bij = " (= N)" if t["attributes"] == t["subjects"] else ""
        median = "—" if med is None else f"{bound}{med:g}"
        ratio = "—" if med is None else f"{med / t['r_log_a']:.2f}"
        lines.append(f"| {t['subjects']} | {t['relations']} | {t['attributes']}{bij} | {t['r_log_n']:.1f} | "
                     f"{t['r_log_a']:.1f} | {vals} | {median} | {ratio} |")
    lines += ["", "| fit of the median d* (trainable embeddings) | slope [95%, seeds resampled within each setting] | "
              "distinct resamples | intercept | R^2 | points |", "|---|---|---|---|---|---|"]
    names = {"r_log_n": "R ln N", "r_log_a": "R ln A", "relations": "R", "n_facts": "N R"}
    for x, f in summ["fits"].get("trainable", {}).items():
        lo, hi = f["slope_ci"]
        ci = "" if lo is None else f" [{lo:.3g}, {hi:.3g}]"
        r2 = "—" if f["r2"] is None else f"{f['r2']:.2f}"
        dist = f.get("resamples_distinct")
        lines.append(f"| d* = a {names[x]} + b | {f['slope']:.3g}{ci} | {'—' if dist is None else f'{dist:.2g}'} | "
                     f"{f['intercept']:.2f} | {r2} | {f['n_points']} |")
    return "\n".join(lines)


def dstar_figure(summ: dict, path: Path) -> None:
    """Median d* against R ln A and against R ln N, one line per (N, A); hollow markers: at the grid minimum."""
    from mechfact.plotting import save, subplots

    table = [t for t in summ["table"] if t["median_threshold"] is not None]
    fig, axes = subplots(1, 2, figsize=(10.4, 4.0))
    series = sorted({(t["subjects"], t["attributes"]) for t in table})
    for i, (n, a) in enumerate(series):
        pts = sorted((t for t in table if (t["subjects"], t["attributes"]) == (n, a)), key=lambda t: t["relations"])
        label = f"N={n}, A={a}" + (" (bijection)" if a == n else "")
        for ax, x in zip(axes, ("r_log_a", "r_log_n")):
            ax.plot([t[x] for t in pts], [t["median_threshold"] for t in pts], "o-", color=f"C{i % 10}",
                    label=label, mfc="none" if all(t["at_grid_min"] for t in pts) else None)
    axes[0].set_xlabel(r"$R \ln A$")
    axes[1].set_xlabel(r"$R \ln N$")
    for ax in axes:
        ax.set_ylabel("d* (smallest d reaching 99%)")
    axes[1].legend(fontsize=7)
    save(fig, path)


def write_doc(src: Path, doc: Path, img: Path | None = None) -> None:
    """The page from ``src/capacity`` and ``src/threshold`` alone (figures into ``img`` when given)."""
    from mechfact.facts.experiments import summarise_thresholds
    from mechfact.facts.laws import laws_section

    recs, parts = pool_thresholds(src)
    summ = summarise_thresholds(recs) if recs else None
    rows = collect(src / "threshold")
    from synthetic import regime_map

    map_rows = regime_map.collect(src / "map")
    ns = sorted({t["subjects"] for t in recs})
    text = [
        "# Paper B in its own setting: attribute-pool worlds", "",
        "This page is written by `python -m synthetic.results_pool --out docs/runs/pool --doc "
        "docs/results_pool.md` from the run files under `docs/runs/pool` alone. They come from "
        f"`python -m synthetic.facts_study --out runs/facts --part {' '.join(parts) or 'pool_N256'}` (the "
        "thresholds), `python -m synthetic.threshold_study --out runs/threshold --subjects N --relations R "
        "--attributes A --capacity runs/facts/pool_N<N>` (the mechanism at d*, 1.5 d* and 3 d*; at N = 4096 "
        "`--capacity runs/facts/pool_N4096_A64`; `--executor ray` runs each model as a Ray task) and `python -m "
        "synthetic.results_pool --out runs/threshold --capacity-runs runs/facts --export docs/runs/pool`.", "",
        "The paper's setting: N subjects, R relations, each mapping every subject into a shared pool of A "
        "attributes (A = N: every relation a bijection, the setting of `results_facts.md`); the one-layer fact "
        "model predicts over the A attributes; a setting reaches when the accuracy over all N R facts is >= 99%; "
        "d* is the smallest grid value that reaches (bisection; MLP width 64, Adam 3e-2 with warm-up and cosine "
        "decay, 2000 steps, stopped at 99%).", "",
        *_device_line(src, recs, rows + map_rows),
        "## 1. The width threshold d*", "",
        dstar_table(summ) if summ else "(no capacity runs)", "",
        *_power_line(recs),
        *_twice_line(src),
        "Intervals: 95% percentile bootstrap that resamples the seeds of each setting independently, with "
        "replacement (a seed is a new world and initialisation; every setting keeps its seeds' count, none drops "
        "out); the tables give the scheme's number of distinct resamples, and below 100 no interval is given. With "
        "2-3 seeds per setting it measures how far the seeds agree, not yet the spread over worlds. `<=`: the "
        "threshold sat at the grid's smallest value in some seed. "
        + (f"With one N ({ns[0]}), R ln N and N R are proportional to R, so those three fits coincide; the "
           "N = 1024 and 4096 parts decide the ln N dependence." if len(ns) == 1 else ""), "",
        "![d* in pool worlds](img/dstar_pool.png)", "",
        *_scan_section(src, recs),
        *_budget_section(src, recs),
        *laws_section(recs, "2000-step"),
        *_width_section(src),
        *_width_budget_section(src),
        "## 2. The mechanism at the threshold", "",
        "For each world and regime, a model trained at d = ceil(f d*) for f = 1, 1.5, 3 (d*: the median of "
        "section 1), then every probe: held-out superposition R^2 (subject embeddings as sums of attribute "
        "vectors, fitted on training subjects) and its shuffled control, the readout of each relation's "
        "attribute from the subject embedding (worst relation), zero-shot freeze-and-swap (new facts written "
        "into embeddings built from the fitted maps) and its control, and the accuracy left when the MLP "
        "units most selective for one relation are ablated (on that relation, on the others, and on that "
        "relation when as many random units are ablated; means over the relations that have selective units). "
        "`default`: the capacity search's own training (cross-entropy); `geometric`: squared error + L2 1e-3 + "
        "zero-init subject embeddings, 3000 steps. Medians over seeds [range]. Read R^2 with the training "
        "accuracy beside it: "
        "in the geometric regime the subject embeddings start at zero, and the first gradient steps add to a "
        "subject's embedding one term per query that depends only on the query's relation and attribute, so "
        "those embeddings are close to sums of attribute vectors before much is stored; zero-shot transfer is "
        "the functional test.", "",
        table(rows) if rows else "(no threshold runs)", "",
    ]
    if rows:
        text += [_reading(rows), "", "![the mechanism against d / d*](img/threshold.png)", ""]
    text += _map_section(map_rows)
    points = mechanism_rows(rows + map_rows)
    text += mechanism_section(points)
    from synthetic import mechanism_curve

    ladder = mechanism_curve.collect(src / "curve")
    text += mechanism_curve.section(ladder)
    text += ["## Not run here", "", _estimate(src) + _map_estimate(map_rows), ""]
    from mechfact.runs import atomic_path

    with atomic_path(doc) as tmp:
        tmp.write_text("\n".join(text))
    if img is not None:
        if summ:
            dstar_figure(summ, img / "dstar_pool.png")
        if rows:
            figure(rows, img / "threshold.png")
        if map_rows:
            regime_map.figure(map_rows, img / "regime_map.png")
        if points:
            mechanism_figure(points, img / "mechanism_pool.png")
        if ladder:
            mechanism_curve.figure(ladder, img / "mechanism_ladder.png")


def _power_line(recs: list[dict]) -> list[str]:
    """The power-law fit of d* (:func:`mechfact.facts.capacity.power_law_fit`) as one paragraph (nothing when the
    settings cannot determine it)."""

    from mechfact.facts.capacity import power_law_fit

    fit = power_law_fit(recs) if recs else {}
    if not fit:
        return []
    ns = sorted({t["subjects"] for t in recs})
    parts = []
    for name, e in fit["exponents"].items():
        lo, hi = e["ci"]
        parts.append(f"{name}^{e['value']:.2f}" + ("" if lo is None else f" [{lo:.2f}, {hi:.2f}]"))
    text = (f"Power law over the {fit['n_points']} settings whose every seed reached above the grid's smallest value "
            f"(least squares on logs of the medians, 95% bootstrap with the seeds of each setting resampled, "
            f"{fit.get('resamples_distinct', 0):.2g} distinct resamples): d* ~ {' '.join(parts)} "
            f"(R^2 {fit['r2']:.2f}). Theta(R ln N) predicts an exponent 1 on R, 0 on A")
    if "N" in fit["exponents"]:
        local = math.log(math.log(ns[-1]) / math.log(ns[0])) / math.log(ns[-1] / ns[0])
        text += (f" and {local:.2f} on N between N = {ns[0]} and {ns[-1]} (the slope of ln ln N); d* proportional to "
                 "the facts N R predicts 1 on N")
    return [text + ".", ""]


def _scan_section(src: Path, base: list[dict]) -> list[str]:
    """Section 1: the 2000-step bisection thresholds beside an ascending scan of the same worlds and seeds (the
    ``pool_N*_asc`` parts, run over the bisection's evaluations): how many agree, per N, and each that does not
    (nothing without those parts)."""
    asc, names = pool_thresholds(src, "d", "_asc")
    if not asc:
        return []

    def key(t: dict) -> tuple:
        return t["subjects"], t["relations"], t["attributes"], t["seed"]

    bis = {key(t): t for t in base}
    pairs = sorted(((bis[key(t)], t) for t in asc if key(t) in bis), key=lambda p: key(p[0]))
    per_n = {}
    for b, a in pairs:
        per_n.setdefault(b["subjects"], []).append(b["threshold"] == a["threshold"])
    lines = ["### Bisection against an ascending scan", "",
             f"`python -m synthetic.facts_study --out runs/facts --part {' '.join(names)}`: the same worlds and "
             "seeds at 2000 steps, every grid value in ascending order until one reaches (the smallest d that "
             "reaches, whatever wider models do), reusing the bisection's evaluations (`--reuse-evaluations`). A "
             "bisection assumes that every width above one that reaches also reaches; where reaching is not "
             "monotone in d it reports a larger d*.", "",
             f"{sum(sum(v) for v in per_n.values())} of {len(pairs)} thresholds agree ("
             + "; ".join(f"N = {n}: {sum(v)} of {len(v)}" for n, v in sorted(per_n.items())) + ")."]
    differ = [(b, a) for b, a in pairs if b["threshold"] != a["threshold"]]
    if differ:
        lines += ["", "| N | R | A | seed | d* by bisection | d* by ascending scan |", "|---|---|---|---|---|---|"]
        lines += [f"| {b['subjects']} | {b['relations']} | {b['attributes']} | {b['seed']} | "
                  + " | ".join("never" if t["threshold"] is None else str(t["threshold"]) for t in (b, a)) + " |"
                  for b, a in differ]
    return lines + [""]


def _and(xs: list[str]) -> str:
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]


def _compared(pairs: list, min_lo, min_hi) -> tuple[list, list]:
    """A seed's thresholds at the two largest budgets, ``pairs`` of records (None: not run), split into those
    compared as values (neither a bound at the grid's smallest value, per ``min_lo`` / ``min_hi``) and those that
    moved although only a bound is known: reached at the grid's smallest value at the larger budget, below the
    smaller budget's value. Any other pair is not decided."""
    done = [(x, y) for x, y in pairs if x is not None and y is not None and x["threshold"] is not None
            and y["threshold"] is not None and not min_lo(x)]
    return ([(x, y) for x, y in done if not min_hi(y)],
            [(x, y) for x, y in done if min_hi(y) and y["threshold"] < x["threshold"]])


def _budget_section(src: Path, base: list[dict]) -> list[str]:
    """Section 1a: d* as a function of the step budget: the 2000-step d* of section 1 beside the same worlds and
    seeds at 4x and 16x the steps (the pool_N*_8k and pool_N*_32k parts); a seed's threshold has converged for
    this schedule where the two largest budgets give the same d* (nothing without budget parts)."""
    from synthetic.pool_budget import Ladder, laws_section

    lad = Ladder(src, base)
    if not lad.records:
        return []
    ladder, grids, parts, budgets = lad.records, lad.grids, lad.parts, lad.budgets

    at_min = lad.at_min  # reached at the grid's smallest value: d* <= it

    def shown(t: dict | None, steps: int) -> str:
        if t is None:
            return "not run"
        grid = lad.grid_of(t, steps)
        if t["threshold"] is None:
            return f"> {max(grid)}" if grid else "not reached"
        return f"<= {t['threshold']}" if at_min(t, steps) else str(t["threshold"])

    settings = lad.settings()
    lines = ["| N | R | A | " + " | ".join(f"d* per seed, {b} steps" for b in budgets)
             + " | the two largest budgets run agree |", "|---|---|---|" + "---|" * (len(budgets) + 1)]
    verdicts = []
    for (n, r, a), seeds in settings.items():
        run = lad.budgets_run((n, r, a), seeds)  # this setting's budgets
        cells = [", ".join(shown(ladder[(n, r, a, s)].get(b), b) for s in seeds) if b in run else "not run"
                 for b in budgets]
        if len(run) < 2:
            lines.append(f"| {n} | {r} | {a} | " + " | ".join(cells) + " | one budget |")
            continue
        lo, hi = run[-2], run[-1]
        pairs = [(ladder[(n, r, a, s)].get(lo), ladder[(n, r, a, s)].get(hi)) for s in seeds]
        decided, below = _compared(pairs, lambda x: at_min(x, lo), lambda y: at_min(y, hi))
        same = sum(x["threshold"] == y["threshold"] for x, y in decided)
        known = len(decided) + len(below)
        agree = f"{lo} / {hi}: {same} of {len(seeds)} seeds" + ("" if known == len(seeds) else
                                                                f" ({len(seeds) - known} not decided)")
        lines.append(f"| {n} | {r} | {a} | " + " | ".join(cells) + f" | {agree} |")
        if known:
            last = ", ".join(shown(y, hi) for _, y in sorted(decided + below, key=lambda p: p[1]["threshold"]))
            verdicts.append(f"N = {n}, R = {r}, A = {a}: " + (
                f"converged at d* = {last} ({lo} and {hi} steps agree)" if same == len(seeds)
                else f"not converged: {known - same} of {len(seeds)} seeds still move between {lo} and {hi} "
                     f"steps (d* {last} at {hi})" if known > same
                else f"not decided: {same} of {len(seeds)} seeds agree between {lo} and {hi} steps (d* {last} at "
                     f"{hi}), {len(seeds) - known} not decided"))
    # how d* grows with N at each budget, where two N share R and A: the ratio of the medians against R ln N's
    ratios = []
    for (r, a) in sorted({(r, a) for (_, r, a) in settings}):
        ns = sorted(n for (n, rr, aa) in settings if (rr, aa) == (r, a))
        for n1, n2 in zip(ns, ns[1:]):
            got = []  # (budget, ratio, "" / "<= " / ">= ": a median over bounds at the grid minimum bounds it)
            for b in budgets:
                x1, x2 = ([x for s in settings[(n, r, a)] if (x := ladder[(n, r, a, s)].get(b))
                           and x["threshold"] is not None] for n in (n1, n2))
                b1, b2 = (any(at_min(x, b) for x in xs) for xs in (x1, x2))
                if x1 and x2 and len(x1) == len(settings[(n1, r, a)]) and len(x2) == len(settings[(n2, r, a)]) \
                        and not (b1 and b2):
                    got.append((b, statistics.median(x["threshold"] for x in x2)
                                / statistics.median(x["threshold"] for x in x1), "<= " if b2 else ">= " if b1 else ""))
            if len(got) > 1:
                k = math.log(n2 / n1)
                ratios.append(
                    f"- d*(N = {n2}) / d*(N = {n1}) at R = {r}, A = {a}, medians: "
                    + ", ".join(f"{o}{q:.2f} at {b}" for b, q, o in got) + " steps (as a power of N: "
                    + ", ".join(f"{o}N^{math.log(q) / k:.2f}" for _, q, o in got) + f"); R ln N predicts "
                    f"{math.log(n2) / math.log(n1):.2f} (N^{math.log(math.log(n2) / math.log(n1)) / k:.2f} over this "
                    "range).")

    by_grid = {}  # (steps, grid, scan) -> {(N, R): [A]}: one clause per grid, naming the settings that ran it
    for b, by in grids.items():
        for (n, r, a), (g, sc) in by.items():
            by_grid.setdefault((b, tuple(g), sc), {}).setdefault((n, r), []).append(a)
    scans = [f"{b} steps: {'ascending scan' if sc == 'ascending' else 'bisection'} over {', '.join(map(str, g))} ("
             + "; ".join(f"N = {n}, R = {r}, A = {', '.join(map(str, sorted(a)))}" for (n, r), a in sorted(by.items()))
             + ")" for (b, g, sc), by in sorted(by_grid.items())]
    return ["### The step budget", "",
            f"`python -m synthetic.facts_study --out runs/facts --part {' '.join(parts)}`: the same worlds and seeds "
            f"with {_and([f'{b // 2000}x' for b in budgets[1:]])} the steps (the same warm-up and cosine schedule "
            "stretched, still stopped at 99%), on grids that start below the 2000-step thresholds (" + "; ".join(scans) + "). `<= g`: reached at the "
            "grid's smallest value (the threshold is at most g); `> g`: never reached. A threshold has converged "
            "for this schedule where the two largest budgets give the same d*.", "",
            *lines, "", *[f"- {v}." for v in verdicts], *ratios, "", *laws_section(lad)]


def _width_section(src: Path) -> list[str]:
    """Section 1b: m* with fixed entity embeddings, from the pool_N*_width parts (nothing without)."""
    from mechfact.facts.laws import width_laws_section
    from mechfact.runs import read_json

    recs, parts = pool_thresholds(src, "mlp-width", "_width")
    if not recs:
        return []
    cfgs = [read_json(src / "capacity" / p / "config.json")["config"] for p in parts]
    top: dict[int, int] = {}
    for c in cfgs:
        for n in c["subjects"]:
            top[n] = max(top.get(n, 0), *c["grid"])
    grids = "; ".join(f"up to {g} at N = {', '.join(str(n) for n in sorted(top) if top[n] == g)}"
                      for g in sorted(set(top.values())))
    ds = sorted({c["d"] for c in cfgs})
    return [
        "### Fixed entity embeddings: the MLP width m*", "",
        f"`python -m synthetic.facts_study --out runs/facts --part {' '.join(parts)}`: the smallest MLP width "
        f"reaching 99% at d = {', '.join(map(str, ds))} (powers of 2 {grids}; same training as above; "
        + ("each width in ascending order until one reaches, as at Adam 3e-2 a wider MLP can spike and fail where "
           "a narrower one reaches, which a bisection reads as a threshold above it"
           if {c.get("scan", "bisect") for c in cfgs} == {"ascending"} else "bisection") + ") with "
        "trainable entity embeddings, with the subjects' input embeddings fixed at their random initialisation "
        "(`frozen-input`: the A-way unembedding still learns, but with A outputs it has no per-subject column "
        "to store a fact in), and with both fixed (`frozen`). Per seed, median in brackets.", "",
        width_table(recs, top), "", *width_laws_section(recs)]


WIDTH_BUDGETS = ("_8k_width",)  # m* parts at more steps than the 2000 of the _width parts


def _width_budget_section(src: Path) -> list[str]:
    """m* as a function of the step budget: per (N, R, A, embeddings) the 2000-step m* of every seed beside the same
    world and seed at more steps (the ``pool_N*_8k_width`` parts); a seed's m* has converged for this schedule
    where the two largest budgets give the same m* (a line saying it is not measured, without such a part)."""
    from mechfact.runs import read_json

    base, _ = pool_thresholds(src, "mlp-width", "_width")
    ladder: dict[tuple, dict[int, dict]] = {}  # (N, R, A, embeddings, seed) -> {steps: record}
    parts, tops = [], {}
    for suffix in WIDTH_BUDGETS:
        recs, names = pool_thresholds(src, "mlp-width", suffix)
        parts += names
        for name in names:
            c = read_json(src / "capacity" / name / "config.json")["config"]
            tops[c["train"]["steps"]] = max(c["grid"])
            for t in recs:
                if t["subjects"] in c["subjects"] and t["relations"] in c["relations"]:
                    ladder.setdefault((t["subjects"], t["relations"], t["attributes"], t["embeddings"], t["seed"]),
                                      {})[c["train"]["steps"]] = t
    if not ladder:
        return ["Whether m* has converged with the step budget is not measured yet (`pool_N256_R2-4_8k_width`, "
                "under Not run here, runs the fixed-embedding regimes at 4x the steps).", ""]
    for t in base:
        key = (t["subjects"], t["relations"], t["attributes"], t["embeddings"], t["seed"])
        if key in ladder:
            ladder[key][2000] = t
    budgets = sorted({b for v in ladder.values() for b in v})

    def shown(t: dict | None, steps: int) -> str:
        if t is None:
            return "not run"
        if t["threshold"] is None:
            return f"> {tops.get(steps, '')}".strip()
        return f"<= {t['threshold']}" if t.get("at_grid_min") else str(t["threshold"])

    settings: dict[tuple, list] = {}
    for (n, r, a, e, seed) in sorted(ladder):
        settings.setdefault((n, r, a, e), []).append(seed)
    lines = ["| N | R | A | embeddings | " + " | ".join(f"m* per seed, {b} steps" for b in budgets)
             + " | the two largest budgets agree |", "|---|---|---|---|" + "---|" * (len(budgets) + 1)]
    moved = same_all = 0
    for (n, r, a, e), seeds in settings.items():
        cells = [", ".join(shown(ladder[(n, r, a, e, s)].get(b), b) for s in seeds) for b in budgets]
        lo, hi = budgets[-2:] if len(budgets) > 1 else (None, None)
        pairs = [(ladder[(n, r, a, e, s)].get(lo), ladder[(n, r, a, e, s)].get(hi)) for s in seeds]
        decided, below = _compared(pairs, lambda x: bool(x.get("at_grid_min")), lambda y: bool(y.get("at_grid_min")))
        same = sum(x["threshold"] == y["threshold"] for x, y in decided)
        known = len(decided) + len(below)
        moved += known - same
        same_all += same == len(seeds)
        lines.append(f"| {n} | {r} | {a} | {e} | " + " | ".join(cells) + f" | {same} of {len(seeds)} seeds"
                     + (f" ({len(seeds) - known} not decided)" if known < len(seeds) else "") + " |")
    return ["m* and the step budget: `python -m synthetic.facts_study --out runs/facts --part "
            f"{' '.join(parts)}`, the same worlds and seeds at {_and([f'{b // 2000}x' for b in budgets[1:]])} the "
            "steps (the same warm-up and cosine schedule stretched, stopped at 99%; every width from the grid's "
            "smallest in ascending order). `> g`: never reached within the grid; `<= g`: at its smallest value.", "",
            *lines, "", f"{same_all} of {len(settings)} settings have converged (every seed's m* the same at the two "
            f"largest budgets); {moved} seed threshold{'s' * (moved != 1)} moved.", ""]


def _map_section(rows: list[dict]) -> list[str]:
    """Section 3: the regime map of :mod:`synthetic.regime_map` from its runs' summaries (nothing without)."""
    from synthetic import regime_map

    if not rows:
        return []
    worlds = sorted({(r["subjects"], r["relations"], r["world_attributes"]) for r in rows})
    cmds = " and ".join(f"`python -m synthetic.regime_map --out runs/regime_map --subjects {n} --relations {r} "
                        f"--attributes {a} --capacity runs/facts/{_capacity_part(n, a)} [--variants ...]`"
                        for n, r, a in worlds)
    return [
        "## 3. What decides the regime: one factor at a time", "",
        f"{cmds} (exported with `--export docs/runs/pool`). The centre is the `default` "
        "regime of section 2 at d = 3 d*; each variant changes one factor (the loss, the coupled L2, the scale of "
        "the entity embeddings' initialisation, training on past 99% for the full budget, the width, the pool "
        "size with d kept); `budget-l2` changes two and `geometric` all of them at once (squared error, L2 1e-3, "
        "zero init, 3000 steps at lr 1e-2); the `geo-*` knock-outs put one of the geometric regime's factors back "
        "at its own shape (d = 128, MLP width 256). The coupled L2 pulls a parameter by L2 x its value whatever N, "
        "while one subject's share of the mean loss falls as 1/N: `geometric-l2-scaled` and `geo-l2-scaled` run "
        f"the geometric regime with its L2 scaled by {regime_map.L2_REF_SUBJECTS} / N (at N = "
        f"{regime_map.L2_REF_SUBJECTS} they are `geometric` and `geometric-wide`). Same probes as section 2; "
        "medians over seeds [range]; `geometric "
        f"(seeds)`: seeds with held-out R^2 and zero-shot accuracy both >= {GEOMETRIC}.", "",
        regime_map.table(rows), "", regime_map.reading(rows), "",
        "![regime map](img/regime_map.png)", ""]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/threshold", help="the threshold runs (--export) or an exported folder "
                    "(--doc)")
    ap.add_argument("--export", default=None, metavar="DIR",
                    help="copy the pool capacity runs (--capacity-runs) and the threshold runs (--out) to DIR")
    ap.add_argument("--capacity-runs", default="runs/facts", help="where facts_study wrote its pool_N* parts")
    ap.add_argument("--doc", default=None, metavar="MD",
                    help="write the page from --out (a folder made by --export) to MD, figures into --img")
    ap.add_argument("--img", default="docs/img")
    a = ap.parse_args(argv)
    if a.export:
        print(f"{export(Path(a.capacity_runs), Path(a.out), Path(a.export))} files copied to {a.export}")
    if a.doc:
        write_doc(Path(a.out), Path(a.doc), Path(a.img))
        print(f"{a.doc} written from {a.out}")
    if not (a.export or a.doc):
        ap.error("give --export DIR and / or --doc MD")


if __name__ == "__main__":
    main()
