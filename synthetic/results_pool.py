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

from synthetic.threshold_study import GEOMETRIC, REGIMES, collect, figure, table


def export(capacity_runs: Path, threshold_runs: Path, dest: Path) -> int:
    """Copies the pool capacity runs' JSON (``<capacity_runs>/pool_N*``) to ``dest/capacity`` and every finished
    threshold run's summary.json to ``dest/threshold`` (same layout): what a clone rebuilds the page from."""
    from mechfact.runs import read_json, write_json_atomic
    from synthetic.facts_study import export_run_json

    n = sum(export_run_json(folder, dest / "capacity" / folder.name)
            for folder in sorted(capacity_runs.glob("pool_N*")))
    for summ in sorted(threshold_runs.glob("N*_R*_A*/*/summary.json")):
        write_json_atomic(dest / "threshold" / summ.relative_to(threshold_runs), read_json(summ))
        n += 1
    return n


def pool_thresholds(src: Path, searched: str = "d", suffix: str = "") -> tuple[list[dict], list[str]]:
    """The threshold records of the pool capacity parts ``pool_N<N><suffix>`` under ``src/capacity`` that searched
    ``searched``: for ``d`` (d*) the trainable-embedding ones, for ``mlp-width`` (m*) every embedding regime; and
    the parts read. ``suffix`` "": the 2000-step d* parts; "_8k": the budget check; "_width": m*."""
    recs: dict[tuple, dict] = {}
    parts = []
    # a part of one pool (pool_N4096_A64, the one the mechanism runs take d* from) before the part of every pool
    for name, thresholds in sorted(_pool_parts(src, suffix), key=lambda p: ("_A" not in p[0], p[0])):
        got = [t for t in thresholds if t.get("searched", "d") == searched
               and (searched != "d" or t["embeddings"] == "trainable")]
        for t in got:  # a setting in two parts (pool_N4096 and pool_N4096_A64): the first that found a threshold
            key = (t["subjects"], t["relations"], t["attributes"], t["embeddings"], t["seed"],
                   t.get("d") if searched == "mlp-width" else t.get("mlp_width"))
            if key not in recs or (recs[key]["threshold"] is None and t["threshold"] is not None):
                recs[key] = t
        if got:
            parts.append(name)
    return list(recs.values()), sorted(parts)


def _pool_parts(src: Path, suffix: str = ""):
    """(name, threshold records) of each pool capacity part ``pool_N<N>[_A<A>][_R<R>[-<R>...]]<suffix>`` under
    ``src/capacity``, by name."""
    import re

    from mechfact.runs import read_json

    for f in sorted((src / "capacity").glob("pool_N*/result.json")):
        if re.fullmatch(r"pool_N\d+(_A(\d+|N))?(_R\d+(-\d+)*)?" + re.escape(suffix), f.parent.name):
            yield f.parent.name, read_json(f)["thresholds"]


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
            slope, icpt, r2 = _median_line(rows, xname)
            ci, distinct = slope_interval(rows, xname)  # seeds resampled within each setting
            band = f" [{ci.low:.3g}, {ci.high:.3g}]" if ci.low is not None else f" (no interval: {distinct} resamples)"
            fits.append(f"| {e} | m* = a {name} + b | {slope:.3g}{band} | {icpt:.1f} | {r2:.2f} | {len(reached)} |")
    if fits:
        lines += ["", "| regime | fit of the median m* (settings that reached) | slope [95%, seeds resampled within "
                  "each setting] | intercept | R^2 | points |", "|---|---|---|---|---|---|", *fits]
        n_seeds = len({t["seed"] for t in recs})
        lines += ["", f"The interval resamples the {n_seeds} seeds of each setting independently (a seed is a new world "
                  "and initialisation); with k seeds a setting has C(2k - 1, k) resamples (3 for two seeds), the "
                  f"fit their product over settings; below {MIN_DISTINCT} distinct resamples no interval is given. "
                  "With two seeds per setting it says how far the seeds agree, not the spread over worlds."]
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


def _median_line(rows: list[dict], xname: str) -> tuple[float, float, float]:
    """Least-squares line of the per-setting median threshold of ``rows`` against their field ``xname`` (the
    point values whose slope :func:`~mechfact.facts.capacity.slope_interval` bootstraps): (slope, intercept,
    R^2); NaNs when fewer than two x values."""
    import numpy as np

    med: dict[tuple, list] = {}
    for t in rows:
        med.setdefault((t["subjects"], t["attributes"], t["relations"]), []).append((t[xname], t["threshold"]))
    x = np.array([v[0][0] for v in med.values()], dtype=float)
    y = np.array([np.median([b for _, b in v]) for v in med.values()], dtype=float)
    if len(np.unique(x)) < 2:
        return float("nan"), float("nan"), float("nan")
    slope, icpt = np.polyfit(x, y, 1)
    ss = float(np.sum((y - y.mean()) ** 2))
    r2 = (1 - float(np.sum((y - (slope * x + icpt)) ** 2)) / ss) if ss > 0 else float("nan")
    return float(slope), float(icpt), r2


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
        *_budget_section(src, recs),
        *laws_section(recs, "2000-step"),
        *_width_section(src),
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


def _power_line(recs: list[dict]) -> list[str]:
    """The power-law fit of d* (:func:`mechfact.facts.capacity.power_law_fit`) as one paragraph (nothing when the
    settings cannot determine it)."""
    import math

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


def _budget_section(src: Path, base: list[dict]) -> list[str]:
    """Section 1a: d* with 4x the steps (the pool_N*_8k parts) beside the 2000-step d* of the same worlds and
    seeds (nothing without)."""
    from mechfact.runs import read_json

    recs, parts = pool_thresholds(src, "d", "_8k")
    if not recs:
        return []
    cfgs = {p: read_json(src / "capacity" / p / "config.json")["config"] for p in parts}
    steps = {p: c["train"]["steps"] for p, c in cfgs.items()}
    grids = {p: c["grid"] for p, c in cfgs.items()}
    two_k = {(t["subjects"], t["relations"], t["attributes"], t["seed"]): t["threshold"] for t in base}
    lines = ["| N | R | A | grid | d* per seed, 2000 steps | d* per seed, " + "/".join(f"{v}" for v in sorted(set(
        steps.values()))) + " steps | moved |", "|---|---|---|---|---|---|---|"]
    cells: dict[tuple, list] = {}
    part_of_n = {int(p.split("_")[1][1:]): p for p in parts}  # pool_N<N>_8k: one part per N
    for t in recs:  # pool_thresholds' records: trainable, searched d
        cells.setdefault((t["subjects"], t["relations"], t["attributes"], part_of_n[t["subjects"]]), []).append(t)
    for (n, r, a, p), ts in sorted(cells.items()):
        ts = sorted(ts, key=lambda t: t["seed"])
        short = [two_k.get((n, r, a, t["seed"])) for t in ts]
        lo = min(grids[p])

        def shown(t):
            if t["threshold"] is None:
                return f"> {max(grids[p])}"
            return f"<= {lo}" if t.get("at_grid_min") else str(t["threshold"])

        moved = sum(1 for t, b in zip(ts, short) if b is not None and t["threshold"] is not None
                    and t["threshold"] < b)
        lines.append(f"| {n} | {r} | {a} | {', '.join(map(str, grids[p]))} | "
                     f"{', '.join('—' if b is None else str(b) for b in short)} | {', '.join(map(shown, ts))} | "
                     f"{moved} of {len(ts)} seeds lower |")
    return ["### The step budget", "",
            f"`python -m synthetic.facts_study --out runs/facts --part {' '.join(parts)}`: the same worlds and seeds "
            "with 4x the steps (same schedule stretched, still stopped at 99%), on a grid that starts below the "
            "2000-step thresholds. `<= g`: reached at the grid's smallest value (the threshold is at most g).", "",
            *lines, ""]


def _width_section(src: Path) -> list[str]:
    """Section 1b: m* with fixed entity embeddings, from the pool_N*_width parts (nothing without)."""
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
        width_table(recs, top), ""]


def _capacity_part(n: int, a: int) -> str:
    """The facts_study part whose thresholds a map at (N, A) reads (its own A part where there is one)."""
    from synthetic.facts_study import PARTS

    return f"pool_N{n}_A{a}" if f"pool_N{n}_A{a}" in PARTS else f"pool_N{n}"


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


MAP_SCALE = (4096, 8, 64)  # the regime map the paper's scale asks for


def on_cpu(x: dict) -> bool:
    """A threshold or model summary made on the CPU (records from before ``device`` was recorded all were)."""
    return str(x.get("device", "cpu")).startswith("cpu")


def _twice_line(src: Path) -> list[str]:
    """The d* settings searched in two parts (a pool's own part and the part of every pool, on their own grids and
    perhaps devices): how many agree, and the ones that do not."""
    seen: dict[tuple, list] = {}
    for name, thresholds in _pool_parts(src):
        for t in thresholds:
            if t.get("searched", "d") == "d" and t["embeddings"] == "trainable":
                key = (t["subjects"], t["relations"], t["attributes"], t["seed"])
                seen.setdefault(key, []).append((name, t["threshold"], t.get("device", "cpu")))
    twice = {k: v for k, v in seen.items() if len(v) > 1}
    if not twice:
        return []
    same = [k for k, v in twice.items() if len({x[1] for x in v}) == 1]
    diff = [f"N = {k[0]}, R = {k[1]}, A = {k[2]}, seed {k[3]}: " + " vs ".join(
        f"{x[1]} ({x[0]}, {x[2]})" for x in v) for k, v in twice.items() if k not in same]
    return [f"Settings searched in two parts (their own grids, perhaps devices): {len(same)} of {len(twice)} give the "
            "same d*" + (f"; differ: {'; '.join(diff)} (the table takes the pool's own part)" if diff else "") + ".",
            ""]


def _device_line(src: Path, recs: list[dict], summaries: list[dict]) -> list[str]:
    """Which records of the page (d* thresholds ``recs``, m* thresholds, model ``summaries``) were made on a GPU
    (their ``device``); none: nothing."""
    gpu_t = [t for t in recs + pool_thresholds(src, "mlp-width", "_width")[0] if not on_cpu(t)]
    rows = [x for x in summaries if not on_cpu(x)]
    if not gpu_t and not rows:
        return []
    devs = sorted({x["device"] for x in gpu_t + rows})
    what = ([f"{len(gpu_t)} of the thresholds in section 1 (searched there, the rest on one CPU "
             "thread)"] if gpu_t else []) + \
        ([f"{len(rows)} of the trained models in sections 2 and 3 ("
          + ", ".join(f"N = {x['subjects']}, R = {x['relations']}, A = {x['world_attributes']} "
                      f"{x.get('variant') or x['regime'] + ' x' + format(x['factor'], 'g')} seed {x['seed']}"
                      if "world_attributes" in x else
                      f"N = {x['subjects']}, R = {x['relations']}, A = {x['attributes']} {x['regime']} "
                      f"x{x['factor']:g} seed {x['seed']}" for x in rows) + ")"] if rows else [])
    return [f"Made on a GPU ({', '.join(devs)}; each record's `device`): " + "; ".join(what) + ". Same code and "
            "seeds; floating-point sums differ between devices, so such a model is another draw of the same "
            "training, not the CPU's numbers. The CPU-hour estimates below use CPU-timed runs alone.", ""]


def _map_estimate(rows: list[dict]) -> str:
    """The regime map at N = 4096, R = 8, A = 64: what is left of it and its cost from the measured models (each
    missing model at its variant's finished seed's time, else at a finished variant's of the same regime, width
    and MLP width, else the median model's); before any model there, the largest measured map's CPU time scaled
    by the facts (a lower bound)."""
    from synthetic import regime_map

    if not rows:
        return ""
    n, r, a = MAP_SCALE
    cmd = (f"`python -m synthetic.regime_map --out runs/regime_map --subjects {n} --relations {r} --attributes {a} "
           f"--capacity runs/facts/{_capacity_part(n, a)} --executor ray --ray-address HEAD:6379` (each variant and "
           "seed a task), or `--device cuda`")
    big = [x for x in rows if (x["subjects"], x["relations"], x["world_attributes"]) == MAP_SCALE]
    if big:
        done = {(x["variant"], x["seed"]) for x in big}
        big = [x for x in big if on_cpu(x)] or big  # CPU hours from CPU-timed models
        missing = [(v, s) for v in regime_map.VARIANTS for s in regime_map.SEEDS if (v, s) not in done]
        if not missing:
            return ""
        median = statistics.median(x["wall_time_s"] for x in big)
        own = {x["variant"]: x["wall_time_s"] for x in big}

        def shape(v: str) -> tuple:
            var = regime_map.VARIANTS[v]
            return var.regime, var.factor, var.mlp_width, var.pool(n, a) > a

        def cost(v: str) -> float:  # its own time, else a measured variant of the same regime and shape, else median
            same = [t for u, t in own.items() if u in regime_map.VARIANTS and shape(u) == shape(v)]
            return own.get(v, statistics.median(same) if same else median)

        larger = sorted({v for v, _ in missing if regime_map.VARIANTS[v].pool(n, a) > a and not any(
            u in regime_map.VARIANTS and shape(u) == shape(v) for u in own)})
        hours = sum(cost(v) for v, _ in missing) / 3600
        return (f"\n- The regime map at N = {n}, R = {r}, A = {a}: {len(done)} of "
                f"{len(regime_map.VARIANTS) * len(regime_map.SEEDS)} models in section 3; the other {len(missing)} ("
                + ", ".join(f"{v} seed {s}" for v, s in missing)
                + f") about {hours:.1f} CPU hours on one thread (each at its variant's measured time, else at that of "
                "a measured variant of the same regime and shape, else the median model's, "
                f"{median / 60:.0f} min"
                + (f"; a lower bound for {', '.join(larger)}, whose pool is larger than any measured model's"
                   if larger else "") + f"): {cmd}, after `cp -r docs/runs/pool/map runs/regime_map` (a rerun skips the "
                "finished models in its `--out` and resumes a stopped one's training from its checkpoint).")
    world = max({(x["subjects"], x["relations"], x["world_attributes"]) for x in rows}, key=lambda w: (w[1], w))
    total = sum(x["wall_time_s"] for x in rows if (x["subjects"], x["relations"], x["world_attributes"]) == world)
    hours = total * n / world[0] / 3600
    return (f"\n- The regime map at N = {n}, R = {r} (the same variants and seeds): about {hours:.1f} CPU hours on "
            f"one thread (the N = {world[0]}, R = {world[1]}, A = {world[2]} map took {total / 60:.0f} min, scaled "
            "by the number of facts; d* and the steps to 99% grow with N, and the map ran before training ran the "
            "block at the supervised position alone and the per-token part on tables, 2-3x faster in pool worlds): "
            f"{cmd}.")


def _estimate(src: Path) -> str:
    """The pool parts not in ``src/capacity``, each with a cost estimate scaled from the finished part of its kind
    (same name but N) with the largest N by N (the parts share their R and A grids) and the seeds: a lower bound
    (d*, fixed costs and early stopping also move it)."""
    import re

    from mechfact.runs import read_json
    from synthetic.facts_study import PARTS, part_command

    def kind(p: str) -> tuple[str, int]:
        m = re.fullmatch(r"pool_N(\d+)(.*)", p)
        return m.group(2), int(m.group(1))

    pools = [p for p in PARTS if p.startswith("pool_N")]
    done = {p: read_json(src / "capacity" / p / "meta.json") for p in pools
            if (src / "capacity" / p / "meta.json").is_file()}
    lines = []
    for p in pools:
        cmd = (f"`python -m synthetic.facts_study --out runs/facts --part {p} --executor ray "
               "--ray-address HEAD:6379`")
        if p in done:
            continue
        same = [q for q in done if kind(q)[0] == kind(p)[0]]
        cost = ""
        if p.endswith("_width"):
            cost = _width_cost(p, src, [q for q in done if q.endswith("_width")])
        elif same:
            base = max(same, key=lambda q: kind(q)[1])
            n0, n1 = kind(base)[1], kind(p)[1]
            s0, s1 = (part_command(q).seeds for q in (base, p))
            hours = done[base]["wall_time_s"] * (n1 / n0) * (s1 / s0) / 3600
            cost = (f"about {hours:.1f} CPU hours on one thread in all ({base} took "
                    f"{done[base]['wall_time_s'] / 60:.0f} min, scaled by N and the seeds; more where d* grows "
                    "faster than ln N)")
        # a part of one pool at the same N (pool_N4096_A64 beside pool_N4096) holds some of this part's settings
        alone = [f"A = {q.rsplit('_A', 1)[1]} is {q} ({'finished' if q in done else 'unfinished'})" for q in pools
                 if re.fullmatch(rf"{re.escape(p)}_A\d+", q)]
        if alone:
            cost += ("; " if cost else "") + f"of its settings, {' and '.join(alone)}"
        if (src / "capacity" / p / "result.json").is_file():
            got = read_json(src / "capacity" / p / "result.json")["thresholds"]
            if _covered(p, got, [q for q in done if re.fullmatch(rf"{re.escape(p)}_A\d+", q)]):
                continue  # what it lacks ran to the end in its finished _A parts
            got = len(got)
            lines.append(f"- `{p}`: unfinished, {got} thresholds so far (in the tables above){'; ' + cost if cost else ''}; "
                         f"it continues from the shipped runs with {cmd[:-1]} --resume-from docs/runs/pool/capacity`.")
        elif cost:
            lines.append(f"- `{p}`: {cost}: {cmd}, or `--device cuda`.")
        else:
            lines.append(f"- `{p}`: {cmd} (or `--device cuda`).")
    return "\n".join(lines) if lines else "Every pool part has run."


def _width_cost(part: str, src: Path, finished: list[str]) -> str:
    """An m* part's CPU hours on one thread, and the memory its widest model needs: each setting's search over the
    part's grid (its scan: bisection, or every width in ascending order) run to a predicted m* (the finished width
    parts' median m* of the same R, A and embeddings at their largest N, scaled by N, as m* grows with N R; above
    the grid when that one never reached), every evaluation at its full budget and at the cost per fact, MLP unit
    and step measured over the evaluations of the finished parts at the largest N (their wall time over the sum of
    N R m steps). "" without a finished width part."""
    import re

    from mechfact.facts.capacity import scan_grid
    from mechfact.runs import read_json
    from synthetic.facts_study import part_command

    if not finished:
        return ""
    work = wall = 0.0
    best: dict[tuple, tuple[int, list]] = {}  # (R, A, embeddings) -> (N, thresholds) at the largest finished N
    n_of = {q: int(re.match(r"pool_N(\d+)", q).group(1)) for q in finished}
    timed = [q for q in finished if n_of[q] == max(n_of.values())]  # the rate at the largest N run
    for q in finished:
        res = read_json(src / "capacity" / q / "result.json")
        if q in timed:
            wall += read_json(src / "capacity" / q / "meta.json")["wall_time_s"]
            for key, ev in res.get("evaluations", {}).items():
                f = dict(re.findall(r"(\w+)=(\S+)", key))
                work += int(f["N"]) * int(f["R"]) * int(f["m"]) * ev["steps"]
        for t in res["thresholds"]:
            k = (t["relations"], t["attributes"], t["embeddings"])
            if best.get(k, (0,))[0] < t["subjects"]:
                best[k] = (t["subjects"], [])
            if best[k][0] == t["subjects"]:
                best[k][1].append(t["threshold"])
    if not work:
        return ""
    rate = wall / work  # seconds per fact, MLP unit and step
    cmd = part_command(part)
    grid = sorted(set(cmd.grid))
    seconds, guessed = 0.0, 0
    for n in cmd.subjects:
        for r in cmd.relations:
            for a in cmd.attributes:
                for e in cmd.embeddings:
                    if (r, a, e) in best:
                        n0, ts = best[(r, a, e)]
                        m = math.inf if None in ts else statistics.median(ts) * n / n0
                    else:
                        m, guessed = grid[-1], guessed + 1
                    tried = []  # the widths the search's own scan evaluates, were m its threshold

                    def reaches(i: int, m=m) -> bool:
                        tried.append(grid[i])
                        return grid[i] >= m

                    scan_grid(len(grid), cmd.scan, reaches)
                    seconds += sum(rate * n * r * g * cmd.steps * cmd.seeds for g in tried)
    from mechfact.facts.spec import ModelSpec, training_cost

    need = max(training_cost(max(cmd.subjects), max(cmd.relations), cmd.d, grid[-1], ModelSpec(outputs=cmd.outputs),
                             embeddings=e, attributes=min(cmd.attributes))[0] for e in cmd.embeddings)
    hours = seconds / 3600
    return (f"about {f'{hours:.2g}' if hours < 10 else f'{hours:.0f}'} CPU hours on one thread in all (each setting's "
            f"{'scan' if cmd.scan == 'ascending' else 'bisection'} to the m* of "
            f"{', '.join(finished)} at the same R and A scaled by N, every evaluation at its full budget at "
            f"{rate * 1e9:.2f} s per 10^9 facts x MLP units x steps, measured over {', '.join(timed)}"
            + (f"; {guessed} settings with no measured m*, at the grid's top" if guessed else "") + ")"
            + f"; its widest model needs about {need / 2**30:.2g} GiB to train (the run refuses to start where that "
            "does not fit)")


def _covered(part: str, thresholds: list[dict], finished: list[str]) -> bool:
    """Whether every (R, A, seed) setting of ``part``'s command has a threshold, in ``thresholds`` (the part's own)
    or in one of the ``finished`` parts that run one of its pools alone (``pool_N4096_A64``: every setting of
    A = 64, since that part has finished)."""
    from synthetic.facts_study import part_command

    cmd = part_command(part)
    alone = {int(q.rsplit("_A", 1)[1]) for q in finished}
    have = {(t["relations"], t["attributes"], t.get("embeddings", "trainable"), t["seed"]) for t in thresholds}
    return all((r, a, e, s) in have or a in alone for r in cmd.relations for a in cmd.attributes
               for e in cmd.embeddings for s in range(cmd.seeds))


MECHANISM_BINS = (0.0, 0.05, 0.1, 0.25, 1.0, float("inf"))  # edges of d / (R A) for the mechanism's curve


def _ratio(r: dict) -> float:
    return r["d"] / (r["relations"] * r["attributes"])


def mechanism_rows(rows: list[dict]) -> list[dict]:
    """Every trained model of sections 2 and 3 (threshold and regime-map runs) as one point: its loss, d / (R A),
    training accuracy, held-out superposition R^2 and zero-shot accuracy."""
    return [{"loss": r["train_config"]["loss"], "ratio": _ratio(r), "train_accuracy": r["train_accuracy"],
             "r2_heldout": r["r2_heldout"], "zero_shot_accuracy": r["zero_shot_accuracy"]}
            for r in rows if r.get("zero_shot_accuracy") is not None and r.get("r2_heldout") is not None]


def mechanism_section(points: list[dict]) -> list[str]:
    """The mechanism as a continuous outcome: per training loss and band of d / (R A) (the width over what
    orthogonal attribute codes would need), the models' mean zero-shot accuracy and held-out R^2 with 95%
    bootstrap intervals over models, and per loss Spearman's rho of each against d / (R A) (permutation p, Holm
    over the four tests). No cutoff decides anything here."""
    from mechfact import stats

    if not points:
        return []
    losses = sorted({p["loss"] for p in points})
    name = {"ce": "cross-entropy", "mse": "squared error"}
    out = ["## The mechanism as a continuous outcome", "",
           f"Every trained model of sections 2 and 3 ({len(points)} models) by its training loss and by d / (R A), "
           "its width over the R A that orthogonal attribute codes would need: mean zero-shot accuracy and held-out "
           "superposition R^2 with 95% bootstrap intervals over models (n: models; each a world, seed and "
           "configuration), the mean training accuracy beside them. The models were trained for sections 2 and 3, "
           "not for this curve: the bands are unevenly filled and N, R and A vary inside each.", "",
           "| loss | d / (R A) | n | train accuracy | zero-shot [95%] | R^2 held-out [95%] |", "|---|---|---|---|---|---|"]
    tests = []
    for loss in losses:
        mine = [p for p in points if p["loss"] == loss]
        for lo, hi in zip(MECHANISM_BINS[:-1], MECHANISM_BINS[1:]):
            b = [p for p in mine if lo <= p["ratio"] < hi]
            if not b:
                continue
            z = stats.bootstrap([p["zero_shot_accuracy"] for p in b], seed=0)
            r2 = stats.bootstrap([p["r2_heldout"] for p in b], seed=0)
            band = f"{lo:g}-{hi:g}" if hi != float("inf") else f">= {lo:g}"

            def ci(e):
                return f"{e.value:.2f}" if e.low is None else f"{e.value:.2f} [{e.low:.2f}, {e.high:.2f}]"
            out.append(f"| {name.get(loss, loss)} | {band} | {len(b)} | "
                       f"{statistics.mean(p['train_accuracy'] for p in b):.2f} | {ci(z)} | {ci(r2)} |")
        for key in ("zero_shot_accuracy", "r2_heldout"):
            t = stats.spearman([p["ratio"] for p in mine], [p[key] for p in mine], seed=0)
            if t["p_value"] is not None:
                tests.append((loss, key, t, len(mine)))
    if tests:
        holm = stats.holm([t[2]["p_value"] for t in tests])
        out += ["", "Spearman's rho against d / (R A), per loss (permutation p; Holm over these "
                f"{len(tests)} tests): " + "; ".join(
                    f"{name.get(loss, loss)}, {'zero-shot' if key == 'zero_shot_accuracy' else 'R^2'}: rho "
                    f"{t['rho']:+.2f} [{t['rho_ci'][0]:+.2f}, {t['rho_ci'][1]:+.2f}] (n {n}, p "
                    f"{t['p_value']:.3g}, Holm {h:.3g})" for (loss, key, t, n), h in zip(tests, holm)) + ".", ""]
    out += ["![the mechanism against d / (R A)](img/mechanism_pool.png)", ""]
    return out


def mechanism_figure(points: list[dict], path: Path) -> None:
    from mechfact.plotting import save, subplots

    fig, axes = subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "zero_shot_accuracy", "zero-shot accuracy"),
                           (axes[1], "r2_heldout", "held-out superposition R^2")):
        for loss, color, name in (("ce", "tab:blue", "cross-entropy"), ("mse", "tab:orange", "squared error")):
            mine = [p for p in points if p["loss"] == loss]
            if mine:
                ax.scatter([p["ratio"] for p in mine], [p[key] for p in mine], s=12, alpha=0.6, color=color,
                           label=f"{name} ({len(mine)} models)")
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("d / (R A)  (dashed: d = R A)")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.suptitle("The geometric mechanism against width over R A (every model of sections 2 and 3)")
    save(fig, path)


def _reading(rows: list[dict]) -> str:
    """Per regime and factor: how many (world, seed) models show the geometric mechanism (held-out R^2 and
    zero-shot accuracy both >= GEOMETRIC), with the medians."""
    out = [f"Models showing the geometric mechanism (held-out R^2 >= {GEOMETRIC} and zero-shot accuracy >= "
           f"{GEOMETRIC}), over every world and seed:", ""]
    ns = sorted({r["subjects"] for r in rows})
    for regime, n in ((g, n) for g in REGIMES for n in ns):
        parts = []
        for f in sorted({r["factor"] for r in rows if r["regime"] == regime and r["subjects"] == n}):
            g = [r for r in rows if r["regime"] == regime and r["factor"] == f and r["subjects"] == n]
            k = sum(r["r2_heldout"] >= GEOMETRIC and r["zero_shot_accuracy"] >= GEOMETRIC for r in g)
            parts.append(f"{f:g} d*: {k} of {len(g)} (train accuracy "
                         f"{statistics.median(r['train_accuracy'] for r in g):.2f}, "
                         f"R^2 {statistics.median(r['r2_heldout'] for r in g):.2f}, "
                         f"zero-shot {statistics.median(r['zero_shot_accuracy'] for r in g):.2f})")
        if parts:
            out.append(f"- {regime}" + (f", N = {n}" if len(ns) > 1 else "") + ": " + "; ".join(parts) + ".")
    return "\n".join(out)


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
