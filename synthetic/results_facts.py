"""The page ``docs/results_facts.md`` (paper B, training side, bijection worlds) from run files alone.

    python -m synthetic.results_facts --run --out runs/facts               # the construction grid + its parts
    python -m synthetic.results_facts --out runs/facts --export docs/runs/facts
    python -m synthetic.results_facts --out docs/runs/facts --doc docs/results_facts.md

``--run`` evaluates the explicit construction on every (N, R) of :data:`CONSTRUCTION_GRID` (and the chain-of-thought
one on :data:`COT_GRID`) into ``<out>/construction/result.json``, written after each setting (a rerun skips what
is there), then runs the facts-study parts of :data:`PARTS_USED`. ``--doc`` reads ``--out`` (the export), the
pool runs (section 2: the A = N rows of the pool parts, ``--pool-runs``) and the multi-hop runs (section 5,
``--multihop-runs``); every table and every number in a sentence is computed here from those files.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

CONSTRUCTION_GRID = tuple((n, r) for n in (64, 256, 1024, 4096) for r in (2, 4, 8, 16))
COT_GRID = ((32, 2, 3), (64, 2, 3))  # (N, R, K): the chain-of-thought construction at K hops
PARTS_USED = ("width_d16",)  # the multi-hop parts are exported with --export-multihop (section 5)
CONSTRUCTION = "construction"  # the run folder of the construction grid under --out


def run_construction(out: Path) -> dict:
    """Every construction of the grids not yet in ``out/construction/result.json``, each written as it finishes."""
    from mechfact.facts import FactWorld
    from mechfact.facts.construct import construct
    from mechfact.runs import read_json, write_json_atomic

    path = out / CONSTRUCTION / "result.json"
    res = read_json(path) if path.is_file() else {"constructions": []}
    have = {(c["subjects"], c["relations"], c["hops"]) for c in res["constructions"]}
    todo = [(n, r, 1) for n, r in CONSTRUCTION_GRID] + list(COT_GRID)
    for n, r, k in todo:
        if (n, r, k) in have:
            continue
        _, info = construct(FactWorld(n, r, seed=0), hops=k, cot=k > 1)
        res["constructions"].append({"subjects": n, "relations": r, "hops": k, "cot": k > 1,
                                     "block_size": info.block_size, "d": info.d, "accuracy": info.accuracy,
                                     "scan": info.scan})
        print(f"construction N={n} R={r} k={k}: b={info.block_size}, d={info.d}, accuracy {info.accuracy:.3f}",
              flush=True)
        write_json_atomic(path, res)
    return res


def export(out: Path, dest: Path) -> int:
    """Copies the construction grid and the parts of :data:`PARTS_USED` under ``out`` to ``dest``."""
    from synthetic.facts_study import export_run_json

    return sum(export_run_json(out / name, dest / name) for name in (CONSTRUCTION, *PARTS_USED)
               if (out / name).is_dir())


def construction_section(cons: list[dict]) -> list[str]:
    single = sorted((c for c in cons if c["hops"] == 1), key=lambda c: (c["subjects"], c["relations"]))
    if not single:
        return ["## 1. The explicit construction", "", "(no construction runs)", ""]
    out = ["## 1. The explicit construction: d = R (b + 1), b = O(log N)", "",
           "`mechfact facts construct --subjects N --relations R --out DIR` builds the single-hop construction "
           "without training (subject embedding = block superposition of its R random attribute vectors of size "
           "b; a relation-gated ReLU selector MLP of width 2 R b copies the queried block to the output) and, "
           "without `--d`, scans b upwards until 99% of the N R facts are right:", "",
           "| N | R | smallest b | d = R (b+1) | d / (R ln N) | accuracy |", "|---|---|---|---|---|---|"]
    ratio = []
    for c in single:
        q = c["d"] / (c["relations"] * math.log(c["subjects"]))
        ratio.append(q)
        out.append(f"| {c['subjects']} | {c['relations']} | {c['block_size']} | {c['d']} | {q:.2f} | "
                   f"{c['accuracy']:.3f} |")
    nr = [c["subjects"] * c["relations"] for c in single]
    out += ["", f"d / (R ln N) stays within {min(ratio):.2f}-{max(ratio):.2f} while N R grows "
            f"{max(nr) // min(nr)}-fold "
            f"({len(single)} settings): the construction scales like R log N, as claimed."]
    cot = [c for c in cons if c["hops"] > 1]
    if cot:
        out[-1] += " The chain-of-thought construction (`--hops K --cot`, d = 2 R (b+1) + 2K): " + "; ".join(
            f"N = {c['subjects']}, R = {c['relations']}, K = {c['hops']}: b = {c['block_size']}, d = {c['d']}, "
            f"accuracy {c['accuracy']:.3f}" for c in cot) + "."
    return out + ["`tests/test_facts_experiments.py` checks both at small scale.", ""]


def bijection_section(recs: list[dict], cons: list[dict]) -> list[str]:
    """d* of trainable embeddings in the pool parts' bijection worlds (A = N), beside the construction's d."""
    rows: dict[tuple, list[dict]] = {}
    for t in recs:
        if t["attributes"] == t["subjects"]:
            rows.setdefault((t["subjects"], t["relations"]), []).append(t)
    head = ["## 2. Trained models with trainable embeddings: d* against R ln N", ""]
    if not rows:
        return head + ["(no A = N pool runs)", ""]
    built = {(c["subjects"], c["relations"]): c["d"] for c in cons if c["hops"] == 1}
    out = head + [
        "The bijection worlds (A = N: every relation a permutation of the N entities) of the pool parts (the "
        "2000-step thresholds of `results_pool.md`, section 1: MLP width 64, "
        "uniform attention, Adam 3e-2 with warm-up and cosine decay, 2000 steps, stopped at 99%), beside the "
        "construction of section 1:", "",
        "| N | R | R ln N | d* per seed | median d* | d* / (R ln N) | construction d | construction / trained |",
        "|---|---|---|---|---|---|---|---|"]
    med = {}
    for (n, r), ts in sorted(rows.items()):
        vals = [t["threshold"] for t in sorted(ts, key=lambda t: t["seed"])]
        cell = ", ".join("never" if v is None else str(v) for v in vals)
        if None in vals:
            out.append(f"| {n} | {r} | {r * math.log(n):.1f} | {cell} | — | — | {built.get((n, r), '—')} | — |")
            continue
        m = float(np.median(vals))
        med[(n, r)] = m
        c = built.get((n, r))
        out.append(f"| {n} | {r} | {r * math.log(n):.1f} | {cell} | {m:g} | {m / (r * math.log(n)):.2f} | "
                   f"{c if c else '—'} | {f'{c / m:.1f}x' if c else '—'} |")
    if len(med) >= 3:
        from synthetic.results_pool import median_line

        keys = sorted(med)
        reached = [t for k in keys for t in rows[k]]
        got = {name: median_line(reached, field)
               for name, field in (("R ln N", "r_log_n"), ("N R", "n_facts"), ("R", "relations"))}
        out += ["", "Least-squares lines through the medians (" + str(len(keys)) + " settings, N = "
                + ", ".join(str(n) for n in sorted({n for n, _ in keys})) + "): " + "; ".join(
                    f"d* = {a:.3g} {name} {'-' if b < 0 else '+'} {abs(b):.2f} (R^2 {r2:.2f})"
                    for name, (a, b, r2) in got.items()) + "."]
        ratios = [built[k] / med[k] for k in keys if k in built]
        if ratios:
            out[-1] += (f" The construction is {min(ratios):.1f}-{max(ratios):.1f}x wider than the trained "
                        "models at the same (N, R): the trained MLP and unembedding share the work.")
    return out + ["", "These are one slice of the pool grid. The laws compared on held-out N over every pool "
                  "(A = 16, 64, 256, N), intervals over seeds, the step-budget ladder and the cost of N = 4096 at "
                  "A = N (`pool_N4096_AN`) are on [results_pool.md](results_pool.md), section 1.", ""]


BUDGET = """## 3. The step budget

The thresholds of section 2 are 2000-step thresholds. Whether d* moves with the budget (4x, 16x and 64x the steps,
the same worlds and seeds, ascending scans below the 2000-step values) is measured in the pool worlds:
[results_pool.md](results_pool.md), "The step budget", with the settings that have and have not converged.
"""


def width_section(recs: list[dict]) -> list[str]:
    """m* at d = 16 in small bijection worlds, per embedding regime (the part ``width_d16``)."""
    from synthetic.results_pool import width_table

    head = ["## 4. Frozen entity embeddings: the MLP must store the facts", ""]
    recs = [{**t, "attributes": t.get("attributes") or t["subjects"]} for t in recs
            if t.get("searched") == "mlp-width"]
    if not recs:
        return head + ["(no width_d16 run)", ""]
    seeds = sorted({t["seed"] for t in recs})
    return head + [
        "`python -m synthetic.results_facts --run --out runs/facts` runs the part `width_d16` (`mechfact facts "
        "capacity --subjects 64 128 --relations 1 2 4 --embeddings trainable frozen frozen-input --search "
        "mlp-width --d 16 --scan ascending`, grid 2-1024, 2000 steps, warm-up + cosine lr 3e-2, seeds "
        f"{', '.join(map(str, seeds))}): the smallest MLP width reaching 99% at d = 16, with trainable entity "
        "embeddings, with both the entity embeddings and the unembedding fixed at random (`frozen`: the MLP must "
        "store the facts) and with only the input side fixed (`frozen-input`: the unembedding over the N entities "
        "can store them itself). Per seed, median in brackets; A = N (bijections).", "",
        width_table(recs, 1024), "",
        "The laws of m* compared on held-out settings, at N = 256 and 1024 in pool worlds, are on "
        "[results_pool.md](results_pool.md) (\"Fixed entity embeddings\").", ""]


def write_doc(src: Path, doc: Path, pool: Path, multihop: Path) -> None:
    from mechfact.runs import atomic_path, read_json
    from synthetic import results_facts_prose as prose
    from synthetic.facts_study import multihop_table
    from synthetic.pool_runs import pool_thresholds

    cpath = src / CONSTRUCTION / "result.json"
    cons = read_json(cpath)["constructions"] if cpath.is_file() else []
    wpath = src / "width_d16" / "result.json"
    width = read_json(wpath)["thresholds"] if wpath.is_file() else []
    text = [
        "# Geometric factual recall, training side (paper B): bijection worlds", "",
        "This page is written by `python -m synthetic.results_facts --out docs/runs/facts --doc "
        "docs/results_facts.md` from run files alone: `docs/runs/facts` (the construction grid and the "
        "frozen-embedding widths, made by `python -m synthetic.results_facts --run --out runs/facts` and copied "
        "by `--export docs/runs/facts`), `docs/runs/pool` (section 2) and `docs/runs/multihop` (section 5). "
        "`python -m synthetic.facts_study --out DIR --part NAME` runs any part (`synthetic/facts_study.py` lists "
        "them).", "",
        prose.SETUP,
        *construction_section(cons),
        *bijection_section(pool_thresholds(pool)[0], cons),
        BUDGET,
        *width_section(width),
        prose.MULTIHOP_HEAD + prose.MULTIHOP_INTRO,
        multihop_table(multihop), "",
        prose.MULTIHOP_NARRATIVE,
        prose.POOL,
    ]
    with atomic_path(doc) as tmp:
        tmp.write_text("\n".join(text))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/facts"),
                    help="the runs (--run, --export) or an exported folder (--doc)")
    ap.add_argument("--run", action="store_true", help="evaluate the construction grid and run the parts")
    ap.add_argument("--export", type=Path, default=None, metavar="DIR", help="copy the runs' JSON to DIR")
    ap.add_argument("--doc", type=Path, default=None, metavar="MD", help="write the page from --out to MD")
    ap.add_argument("--pool-runs", type=Path, default=Path("docs/runs/pool"))
    ap.add_argument("--multihop-runs", type=Path, default=Path("docs/runs/multihop"))
    a = ap.parse_args(argv)
    if not (a.run or a.export or a.doc):
        ap.error("give --run, --export DIR and / or --doc MD")
    if a.run:
        from synthetic.facts_study import run

        run_construction(a.out)
        run(a.out, list(PARTS_USED))  # a finished part is read back, an unfinished one resumes
    if a.export:
        print(f"{export(a.out, a.export)} files copied to {a.export}")
    if a.doc:
        write_doc(a.out, a.doc, a.pool_runs, a.multihop_runs)
        print(f"{a.doc} written from {a.out}")


if __name__ == "__main__":
    main()
