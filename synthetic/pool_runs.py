"""Reading the pool capacity runs (the d* and m* thresholds of :mod:`synthetic.facts_study`'s ``pool_N*`` parts)
and exporting them with the threshold runs into ``docs/runs/pool``: what :mod:`synthetic.results_pool` and its
sections read."""

from __future__ import annotations

from pathlib import Path


def read_summaries(out: Path, pattern: str) -> list[dict]:
    """Every finished run's summary.json under ``out`` matching ``pattern`` (e.g. ``N*_R*_A*/*/summary.json``)."""
    from mechfact.runs import read_json

    return [read_json(f) for f in sorted(out.glob(pattern))]


def copy_summaries(out: Path, pattern: str, dest: Path) -> int:
    """Copies every finished run's summary.json under ``out`` matching ``pattern`` to ``dest`` (same layout);
    how many."""
    from mechfact.runs import read_json, write_json_atomic

    files = sorted(out.glob(pattern))
    for f in files:
        write_json_atomic(dest / f.relative_to(out), read_json(f))
    return len(files)


def export(capacity_runs: Path, threshold_runs: Path, dest: Path) -> int:
    """Copies the pool capacity runs' JSON (``<capacity_runs>/pool_N*``) to ``dest/capacity`` and every finished
    threshold run's summary.json to ``dest/threshold`` (same layout): what a clone rebuilds the page from."""
    from synthetic.facts_study import export_run_json

    n = sum(export_run_json(folder, dest / "capacity" / folder.name)
            for folder in sorted(capacity_runs.glob("pool_N*")))
    return n + copy_summaries(threshold_runs, "N*_R*_A*/*/summary.json", dest / "threshold")


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
    """(name, threshold records) of each pool capacity part ``pool_N<N>[_A<A>][_R<R>[-<R>...]][_s<seed>]<suffix>``
    under ``src/capacity`` (``_s<seed>``: more seeds of the same settings, from that seed on), by name."""
    import re

    from mechfact.runs import read_json

    for f in sorted((src / "capacity").glob("pool_N*/result.json")):
        if re.fullmatch(r"pool_N\d+(_A(\d+|N))?(_R\d+(-\d+)*)?(_s\d+)?" + re.escape(suffix), f.parent.name):
            yield f.parent.name, read_json(f)["thresholds"]


def on_cpu(x: dict) -> bool:
    """A threshold or model summary made on the CPU (records from before ``device`` was recorded all were)."""
    return str(x.get("device", "cpu")).startswith("cpu")


def _capacity_part(n: int, a: int) -> str:
    """The facts_study part whose thresholds a map at (N, A) reads (its own A part where there is one)."""
    from synthetic.facts_study import PARTS

    return f"pool_N{n}_A{a}" if f"pool_N{n}_A{a}" in PARTS else f"pool_N{n}"
