"""Reproduce the paper-B training-side results in docs/results_facts.md.

    python -m synthetic.facts_study --out runs/facts [--part NAME ...]   # run (resumes)
    python -m synthetic.facts_study --out runs/facts --summarize         # markdown tables + combined figure
    python -m synthetic.facts_study --out runs/facts --part pool_N4096 --resume-from docs/runs/pool/capacity
    python -m synthetic.facts_study --out runs/facts --executor ray --workers 8   # jobs on 8 cores (or a cluster)

Every part is one ``mechfact facts ...`` command (listed in PARTS, exactly as
run for the note); each writes a standard run directory under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

GRID = "3 4 5 6 7 8 10 12 14 16 20 24 28 32 40 48 64".split()
POOL_GRID = ["1", "2", *GRID]  # a pool of A attributes holds R log A bits per subject: thresholds can sit below 3
COS = ["--lr", "3e-2", "--schedule", "warmup-cosine", "--patience", "0"]
MINIBATCH = ["--batch-size", "256", "--lr", "3e-3", "--schedule", "constant", "--eval-every", "100"]  # multihop_N1024_b256
CONST = ["--lr", "1e-2", "--patience", "0"]

PARTS: dict[str, list[str]] = {
    # d* against R ln N, trainable embeddings, MLP width 64 (the first attempt's m), improved schedule
    "N256_cos_2k": ["capacity", "--subjects", "256", "--relations", "2", "4", "8", "--grid", *GRID, "--steps", "2000",
                    *COS, "--seeds", "2"],
    "N256_R2_low": ["capacity", "--subjects", "256", "--relations", "2", "--grid", "1", "2", "3", "--steps", "2000",
                    *COS, "--seeds", "2"],
    **{f"N1024_R{R}_cos_2k": ["capacity", "--subjects", "1024", "--relations", str(R), "--grid", *GRID,
                              "--steps", "2000", *COS] for R in (2, 4, 8)},
    # N = 4096 (the paper's N), same protocol; affordable on CPU since the loss is computed in chunks
    **{f"N4096_R{R}_cos_2k": ["capacity", "--subjects", "4096", "--relations", str(R), "--grid", *GRID,
                              "--steps", "2000", *COS] for R in (2, 4, 8)},
    # a second seed at N = 1024 (world + init seed 1)
    **{f"N1024_R{R}_cos_2k_seed1": ["capacity", "--subjects", "1024", "--relations", str(R), "--grid", *GRID,
                                    "--steps", "2000", *COS, "--seed", "1"] for R in (2, 4, 8)},
    # a 4x longer budget near the 2000-step thresholds (grids start at or below them): how much of the
    # N-dependence is the step budget?
    **{f"N{N}_R{R}_cos_8k": ["capacity", "--subjects", str(N), "--relations", str(R), "--grid", *grid,
                             "--steps", "8000", *COS]
       for N, R, grid in ((256, 2, "2 3".split()), (256, 4, "4 5 6".split()), (256, 8, "8 10 12".split()),
                          (1024, 2, "3 4".split()), (1024, 4, "6 7 8 10".split()),
                          (1024, 8, "12 14 16 20".split()))},
    # the first attempt's protocol (constant lr 1e-2) at two step budgets: is the N-dependence optimisation?
    "N256_R4_const_2k": ["capacity", "--subjects", "256", "--relations", "4", "--grid", *GRID, "--steps", "2000",
                         *CONST, "--seeds", "2"],
    "N256_R4_const_8k": ["capacity", "--subjects", "256", "--relations", "4", "--grid", *GRID, "--steps", "8000",
                         *CONST, "--seeds", "2"],
    "N1024_R4_const_2k": ["capacity", "--subjects", "1024", "--relations", "4", "--grid", *GRID, "--steps", "2000",
                          *CONST],
    # a small MLP (width 16) at N = 64: d* against R
    "N64_m16": ["capacity", "--subjects", "64", "--relations", "1", "2", "4", "8", "--grid", "1", "2", "3", "4", "5",
                "6", "8", "10", "12", "16", "24", "32", "--mlp-width", "16", "--steps", "800", *COS],
    # frozen vs trainable: MLP width needed at d = 16 against the number of facts
    "width_d16": ["capacity", "--subjects", "64", "128", "--relations", "1", "2", "4", "--embeddings", "trainable",
                  "frozen", "frozen-input", "--search", "mlp-width", "--d", "16", "--grid", "2", "4", "8", "16", "32",
                  "64", "128", "256", "512", "1024", "--scan", "ascending", "--steps", "2000", *COS, "--seeds", "2"],
    # d* in attribute-pool worlds (the paper's setting: relations map the N subjects into a shared pool of A
    # attributes), scored over the pool (--outputs attributes); 3 seeds at N <= 1024, 2 at N = 4096. A training
    # step at N = 4096, R = 16, A = 64, d = 64 takes ~1.5 s on one CPU thread (benchmarks/outputs_bench.py): the
    # N = 4096 parts are for a cluster (--executor ray --ray-address ...) or a GPU (--device cuda)
    **{f"pool_N{N}": ["capacity", "--subjects", str(N), "--relations", "2", "4", "8", "16", "--attributes", "16", "64",
                      "256", "--outputs", "attributes", "--grid", *POOL_GRID, "--steps", "2000", *COS, "--seeds",
                      "2" if N == 4096 else "3"] for N in (256, 1024, 4096)},
    # N = 4096 with A = 64 alone (the worlds of the mechanism table) on a grid up to 128, since d* at R = 16 may pass
    # 64 (48 at N = 1024): the first N = 4096 settings the mechanism needs (ran in 61 min on one thread); pool_N4096
    # holds the other pools (the page reads both parts, each setting once)
    "pool_N4096_A64": ["capacity", "--subjects", "4096", "--relations", "2", "4", "8", "16", "--attributes", "64",
                       "--outputs", "attributes", "--grid", *POOL_GRID, "80", "96", "128", "--steps", "2000", *COS,
                       "--seeds", "2"],
    # N = 4096 with A = 256 alone on the same grid (pool_N4096 reaches A = 256 only after redoing A = 64's R = 8, 16,
    # which pool_N4096_A64 holds)
    "pool_N4096_A256": ["capacity", "--subjects", "4096", "--relations", "2", "4", "8", "16", "--attributes", "256",
                        "--outputs", "attributes", "--grid", *POOL_GRID, "80", "96", "128", "--steps", "2000", *COS,
                        "--seeds", "2"],
    # the bijection limit A = N (randperm % A is a permutation) at N = 1024, the figure's bijection line beside
    # pool_N256's A = 256
    "pool_N1024_AN": ["capacity", "--subjects", "1024", "--relations", "2", "4", "8", "16", "--attributes", "1024",
                      "--outputs", "attributes", "--grid", *POOL_GRID, "80", "96", "128", "--steps", "2000", *COS,
                      "--seeds", "2"],
    # the budget: 4x the steps on a grid just below the 2000-step thresholds (R = 8, A = 64): does d* move?
    **{f"pool_N{N}_8k": ["capacity", "--subjects", str(N), "--relations", "8", "--attributes", "64", "--outputs",
                         "attributes", "--grid", *grid, "--steps", "8000", *COS, "--seeds", "3"]
       for N, grid in ((256, "8 10 12".split()), (1024, "12 14 16 20".split()))},
    # 16x the steps, every grid value in ascending order (reaching is not monotone in d at a fixed budget): where
    # d*(8000) = d*(32000) the threshold has converged for this schedule
    **{f"pool_N{N}_32k": ["capacity", "--subjects", str(N), "--relations", "8", "--attributes", "64", "--outputs",
                          "attributes", "--grid", *grid, "--scan", "ascending", "--steps", "32000", *COS, "--seeds",
                          "3"]
       for N, grid in ((256, "6 7 8 9 10 12".split()), (1024, "10 11 12 13 14 16".split()))},
    # the same ladder at R = 4 (N = 256, A = 64: d* 6-7 at 2000 steps)
    **{f"pool_N256_R4_{k}": ["capacity", "--subjects", "256", "--relations", "4", "--attributes", "64", "--outputs",
                             "attributes", "--grid", "3", "4", "5", "6", "7", "--scan", "ascending", "--steps",
                             str(steps), *COS, "--seeds", "3"] for k, steps in (("8k", 8000), ("32k", 32000))},
    # 64x the steps at N = 256 (d* 12 -> 10 -> 9 over 2000 / 8000 / 32000 steps): does it stop at 9?
    "pool_N256_128k": ["capacity", "--subjects", "256", "--relations", "8", "--attributes", "64", "--outputs",
                       "attributes", "--grid", "7", "8", "9", "--scan", "ascending", "--steps", "128000", *COS,
                       "--seeds", "3"],
    # seeds 3 and 4 (new worlds and inits) of the ladder's settings at every budget, so that each has 5 seeds:
    # N = 256 at R = 4 and 8, N = 1024 at R = 8 (A = 64), the grids and scans of the parts above
    **{f"pool_N{N}_s3{k}": ["capacity", "--subjects", str(N), "--relations", *rs, "--attributes", "64", "--outputs",
                            "attributes", "--grid", *grid, *scan, "--steps", str(steps), *COS, "--seed", "3",
                            "--seeds", "2"]
       for N, k, rs, grid, scan, steps in (
           (256, "", ("4", "8"), POOL_GRID, (), 2000), (1024, "", ("8",), POOL_GRID, (), 2000),
           (256, "_8k", ("8",), "8 10 12".split(), (), 8000), (1024, "_8k", ("8",), "12 14 16 20".split(), (), 8000),
           (256, "_32k", ("8",), "6 7 8 9 10 12".split(), ("--scan", "ascending"), 32000),
           (1024, "_32k", ("8",), "10 11 12 13 14 16".split(), ("--scan", "ascending"), 32000),
           (256, "_128k", ("8",), "7 8 9".split(), ("--scan", "ascending"), 128000))},
    **{f"pool_N256_R4_s3_{k}": ["capacity", "--subjects", "256", "--relations", "4", "--attributes", "64", "--outputs",
                                "attributes", "--grid", "3", "4", "5", "6", "7", "--scan", "ascending", "--steps",
                                str(steps), *COS, "--seed", "3", "--seeds", "2"]
       for k, steps in (("8k", 8000), ("32k", 32000))},
    # the 8000-step budget at every other setting of N = 256 (R = 2-16; A = 16, 64, N), 5 seeds, on the grids the
    # ladder above uses at the same R (R = 4: ascending 3-7; R = 8: bisection over 8, 10, 12) and, at R = 2 and 16,
    # ascending scans from about half the 2000-step d*; at R = 8, A = 16 (4 of 5 seeds reached d = 8, the bisection's
    # smallest) an ascending scan from 5; then the same settings at 32000 steps, so that 8000 and 32000 can agree
    **{f"pool_N256{tag}_{k}": ["capacity", "--subjects", "256", "--relations", r, "--attributes", *a, "--outputs",
                               "attributes", "--grid", *grid, *scan, "--steps", str(steps), *COS, "--seeds", "5"]
       for k, steps in (("8k", 8000), ("32k", 32000))
       for tag, r, a, grid, scan in (
           ("_R2", "2", ("16", "64", "256"), "1 2 3 4".split(), ("--scan", "ascending")),
           ("_A16_R4", "4", ("16",), "3 4 5 6 7".split(), ("--scan", "ascending")),
           ("_AN_R4", "4", ("256",), "3 4 5 6 7".split(), ("--scan", "ascending")),
           ("_A16_R8", "8", ("16",), "5 6 7 8 9 10 12".split(), ("--scan", "ascending")),
           ("_AN_R8", "8", ("256",), ("8 10 12" if k == "8k" else "6 7 8 9 10 12").split(),
            () if k == "8k" else ("--scan", "ascending")),
           ("_R16", "16", ("16", "64", "256"), "12 14 16 18 20 22 24 28".split(), ("--scan", "ascending")))},
    # the same ladder at N = 1024 (R = 2, 4, 16: A = 16, 64, N; R = 8: A = 16, N, beside pool_N1024_8k's A = 64; 5
    # seeds) and N = 4096 (A = 16, 64; R = 8: A = 16, beside pool_N4096_8k's A = 64; 3 seeds), at 8000 and 32000
    # steps, ascending scans from about half the 2000-step d* (R = 2 from d = 1: at N = 1024, 8000 steps, 3 of 5
    # seeds reached the first grid's smallest value, d = 2)
    **{f"pool_N{N}{tag}_{k}": ["capacity", "--subjects", str(N), "--relations", r, "--attributes", *a, "--outputs",
                               "attributes", "--grid", *grid.split(), "--scan", "ascending", "--steps", str(steps),
                               *COS, "--seeds", "5" if N == 1024 else "3"]
       for k, steps in (("8k", 8000), ("32k", 32000))
       for N, tag, r, a, grid in (
           (1024, "_R2", "2", ("16", "64", "1024"), "1 2 3 4 5 6"),
           (1024, "_R4", "4", ("16", "64", "1024"), "4 5 6 7 8 9 10 12"),
           (1024, "_A16_R8", "8", ("16",), "8 10 12 14 16 18 20"),
           (1024, "_AN_R8", "8", ("1024",), "10 12 14 16 18 20 24"),
           (1024, "_R16", "16", ("16", "64", "1024"), "16 20 24 28 32 36 40 48"),
           (4096, "_R2", "2", ("16", "64"), "1 2 3 4 5 6"),
           (4096, "_R4", "4", ("16", "64"), "5 6 7 8 9 10 12 14"),
           (4096, "_A16_R8", "8", ("16",), "10 12 14 16 18 20"),
           (4096, "_R16", "16", ("16", "64"), "24 28 32 36 40 48 56 64"))},
    # seeds 3 and 4 at the other 2000-step settings of N <= 1024 (R = 2-16; A = 16, 64 and N), and seed 2 at
    # N = 1024, A = N (pool_N1024_AN has 2), so that every setting there has 5 seeds
    **{f"pool_N{N}{tag}": ["capacity", "--subjects", str(N), "--relations", *rs, "--attributes", a, "--outputs",
                           "attributes", "--grid", *grid, "--steps", "2000", *COS, "--seed", s0, "--seeds", k]
       for N, tag, rs, a, grid, s0, k in (
           (256, "_A16_s3", ("2", "4", "8", "16"), "16", POOL_GRID, "3", "2"),
           (256, "_A64_R2-16_s3", ("2", "16"), "64", POOL_GRID, "3", "2"),
           (256, "_AN_s3", ("2", "4", "8", "16"), "256", POOL_GRID, "3", "2"),
           (1024, "_A16_s3", ("2", "4", "8", "16"), "16", POOL_GRID, "3", "2"),
           (1024, "_A64_R2-4-16_s3", ("2", "4", "16"), "64", POOL_GRID, "3", "2"),
           (1024, "_AN_s2", ("2", "4", "8", "16"), "1024", (*POOL_GRID, "80", "96", "128"), "2", "3"))},
    # the 2000-step d* of every setting and seed of N = 256 and 1024 (A = 16, 64, N) again with an ascending scan
    # (the smallest d that reaches, whatever wider models do), over the bisection parts' shipped evaluations: only
    # the grid values a bisection skipped are trained
    **{f"pool_N{N}_asc": ["capacity", "--subjects", str(N), "--relations", "2", "4", "8", "16", "--attributes", "16",
                          "64", str(N), "--outputs", "attributes", "--grid", *POOL_GRID, "--scan", "ascending",
                          "--steps", "2000", *COS, "--seeds", "5", "--reuse-evaluations",
                          *(f"docs/runs/pool/capacity/pool_N{N}{p}" for p in parts)]
       for N, parts in ((256, ("", "_s3", "_A16_s3", "_A64_R2-16_s3", "_AN_s3")),
                        (1024, ("", "_s3", "_A16_s3", "_A64_R2-4-16_s3", "_AN", "_AN_s2")))},
    # for a GPU or a cluster (the pool page prints each one's cost, scaled from the timed CPU parts): a third seed
    # at N = 4096 (A = 64), the budget ladder at N = 4096 (R = 8, A = 64; ascending scans below the 2000-step d* of
    # 28) and N = 16384 at R = 2, 4
    "pool_N4096_A64_s2": ["capacity", "--subjects", "4096", "--relations", "2", "4", "8", "16", "--attributes", "64",
                          "--outputs", "attributes", "--grid", *POOL_GRID, "80", "96", "128", "--steps", "2000", *COS,
                          "--seed", "2", "--seeds", "1"],
    "pool_N4096_A16_s2": ["capacity", "--subjects", "4096", "--relations", "2", "4", "8", "16", "--attributes", "16",
                          "--outputs", "attributes", "--grid", *POOL_GRID, "80", "96", "128", "--steps", "2000", *COS,
                          "--seed", "2", "--seeds", "1"],
    # the bijection limit A = N at N = 4096 (pool_N1024_AN's at the paper's N), three seeds
    "pool_N4096_AN": ["capacity", "--subjects", "4096", "--relations", "2", "4", "8", "16", "--attributes", "4096",
                      "--outputs", "attributes", "--grid", *POOL_GRID, "80", "96", "128", "--steps", "2000", *COS,
                      "--seeds", "3"],
    **{f"pool_N4096_{k}": ["capacity", "--subjects", "4096", "--relations", "8", "--attributes", "64", "--outputs",
                           "attributes", "--grid", *grid.split(), "--scan", "ascending", "--steps", str(steps), *COS,
                           "--seeds", "3"]
       # 32000 steps from 15: on a grid from 16, every seed reached at 16 (a bound, below the 8000-step 20-22)
       for k, grid, steps in (("8k", "18 20 22 24 28", 8000), ("32k", "15 16 18 20 22 24 28", 32000))},
    "pool_N16384_R2-4": ["capacity", "--subjects", "16384", "--relations", "2", "4", "--attributes", "16", "64",
                         "--outputs", "attributes", "--grid", *POOL_GRID, "--steps", "2000", *COS, "--seeds", "3"],
    # the same worlds with fixed entity embeddings: the MLP width m* at d = 16. trainable: the embeddings can store
    # the facts; frozen-input: the subjects' input embeddings fixed, the A-way unembedding and the MLP learn (with
    # A outputs the unembedding has no per-subject column to store a fact in); frozen: both fixed. Every width in
    # ascending order until one reaches: at Adam 3e-2 a wider MLP can spike and fail where a narrower one reaches
    # (N = 1024, R = 4, A = 16, frozen-input, seed 0: 256 reaches, 1024 does not), which a bisection reads as
    # m* > 1024. N = 256 on a grid to 2^11; N = 1024 and 4096 on grids to 2^13 and 2^15 (m* grows with N R), split
    # by R so that a part fits one run here: R = 2 and R = 4 at N = 1024 do; the rest is for a cluster or a GPU
    # (the pool page estimates their cost from the finished width parts); `_s2`: a third seed (seed 2) of the parts
    # that ran here
    **{name: [
        "capacity", "--subjects", str(N), "--relations", *rs, "--attributes", "16", "64", "256", "--outputs",
        "attributes", "--embeddings", "trainable", "frozen-input", "frozen", "--search", "mlp-width", "--scan",
        "ascending", "--d", "16", "--grid", *(str(2**i) for i in range(1, top + 1)), "--steps", "2000", *COS,
        *seeds]
       for name, N, top, rs, seeds in (
           ("pool_N256_width", 256, 11, ["2", "4", "8", "16"], ["--seeds", "2"]),
           ("pool_N1024_R2_width", 1024, 13, ["2"], ["--seeds", "2"]),
           ("pool_N1024_R4_width", 1024, 13, ["4"], ["--seeds", "2"]),
           ("pool_N1024_R8-16_width", 1024, 13, ["8", "16"], ["--seeds", "2"]),
           ("pool_N4096_width", 4096, 15, ["2", "4", "8", "16"], ["--seeds", "2"]),
           ("pool_N256_s2_width", 256, 11, ["2", "4", "8", "16"], ["--seed", "2", "--seeds", "1"]),
           ("pool_N1024_R2_s2_width", 1024, 13, ["2"], ["--seed", "2", "--seeds", "1"]),
           ("pool_N1024_R4_s2_width", 1024, 13, ["4"], ["--seed", "2", "--seeds", "1"]))},
    # m* at 4x the steps (the same schedule stretched): the fixed-embedding regimes, every pool, 3 seeds, every
    # width from 2 in ascending order; where m*(8000) = m*(2000) the threshold has converged. N = 256 at R = 2 and 4
    # (run here), then R = 8 and 16, and N = 1024 at R = 2 and 4 (costed on the pool page)
    **{name: [
        "capacity", "--subjects", str(N), "--relations", *rs, "--attributes", "16", "64", str(A), "--outputs",
        "attributes", "--embeddings", "frozen-input", "frozen", "--search", "mlp-width", "--scan", "ascending", "--d",
        "16", "--grid", *(str(2**i) for i in range(1, top + 1)), "--steps", "8000", *COS, "--seeds", "3"]
       for name, N, A, top, rs in (("pool_N256_R2-4_8k_width", 256, 256, 11, ["2", "4"]),
                                   ("pool_N256_R8-16_8k_width", 256, 256, 11, ["8", "16"]),
                                   ("pool_N1024_R2-4_8k_width", 1024, 256, 13, ["2", "4"]))},
    # multi-hop, direct vs chain of thought (defaults: N=32, R=4, d=16, width 32, learned attention)
    **{f"multihop_seed{s}": ["multihop", "--seed", str(s)] for s in range(3)},
    # multi-hop as d grows, k = 1..4, R = 4: N = 64 here (N R^4 = 16,384 direct chains), N = 1024 (262,144) for a
    # cluster or a GPU (MULTIHOP_TABLE prints both beside the construction's d)
    **{f"multihop_N{N}_d{d}": ["multihop", "--subjects", str(N), "--relations", "4", "--hops", "1", "2", "3", "4",
                               "--d", str(d), "--mlp-width", "64"]
       for N, ds in ((64, (8, 16, 32, 64)), (1024, (16, 32, 64, 128))) for d in ds},
    # the same at N = 1024 with minibatches: full-batch training (Adam 3e-2, warm-up and cosine) leaves the
    # chain-of-thought model on a loss plateau at ln R (its answer spread evenly over R candidates) at every
    # width; batches of 256 at a constant 3e-3 leave it from d = 64 (a step sees 64x fewer chains than a full
    # batch at k = 2)
    **{f"multihop_N1024_b256_d{d}{f'_seed{s}' if s else ''}": [
        "multihop", "--subjects", "1024", "--relations", "4", "--hops", "1", "2", "3", "4", "--d", str(d),
        "--mlp-width", "64", *MINIBATCH, "--steps", "6000", *(["--seed", str(s)] if s else [])]
       for d, s in ((16, 0), (32, 0), (64, 0), (128, 0), (64, 1), (128, 1))},  # a second seed where CoT trains
    # k = 4 chain of thought at d = 64 with a longer budget (262,144 chains: 6000 steps of 256 are 6 epochs)
    "multihop_N1024_b256_d64_k4": ["multihop", "--subjects", "1024", "--relations", "4", "--hops", "4", "--d", "64",
                                   "--mlp-width", "64", *MINIBATCH, "--steps", "20000"],
}


def part_command(name: str) -> argparse.Namespace:
    """Part ``name``'s command as the project's CLI parses it, its defaults included."""
    from mechfact.cli import build_parser

    return build_parser().parse_args(["facts", *PARTS[name], "--out", name])


def run(out: Path, parts: list[str], executor_flags: list[str] = ()) -> None:
    """Each part as a ``mechfact facts`` command; ``executor_flags`` (e.g. ``--executor ray --workers 2``,
    ``--device cuda``) spread its jobs over cores or a cluster, or onto a GPU."""
    from mechfact.cli import main

    for name in parts:
        argv = ["facts", *PARTS[name], "--out", str(out / name), "--threads", "1", "--quiet", *executor_flags]
        print("mechfact", " ".join(argv), flush=True)
        if main(argv) != 0:
            raise SystemExit(f"part {name} failed")


def summarize(out: Path) -> None:
    rows = []
    for name in PARTS:
        f = out / name / "result.json"
        if not f.exists() or not PARTS[name][0] == "capacity" or "summary" not in json.loads(f.read_text()):
            continue
        res = json.loads(f.read_text())
        for t in res["summary"]["table"]:
            rows.append((name, t))
    print("| run | regime | N | R | R ln N | N R | thresholds (per seed) |\n|---|---|---|---|---|---|---|")
    for name, t in rows:
        print(f"| {name} | {t['embeddings']} | {t['subjects']} | {t['relations']} | {t['r_log_n']:.1f} | "
              f"{t['n_facts']} | {t['thresholds']} |")
    for name in PARTS:
        f = out / name / "result.json"
        if f.exists() and PARTS[name][0] == "multihop":
            res = json.loads(f.read_text())
            print(name, {f"k={p['hops']} {p['mode']}": round(p["accuracy"], 4) for p in res["points"]})
    _figure(out, rows)


CONSTRUCTION_MAX_CHAINS = 65_536  # the table's construction column: N = 1024, k = 3 takes ~20 s, k = 4 over 7 min


def construction_d(n: int, r: int, k: int) -> int:
    """The explicit construction's width for k-hop answers of an (N, R) bijection world: a direct lookup stores
    one composite relation per relation sequence (R^k of them: d = R^k (b + 1) at the smallest block size b that
    reaches 99%); chain of thought answers one single-hop fact per step (the R-relation construction). The scan
    for R^k relations starts at the single-hop block size (with more relations to get right the block size does
    not fall: 15 at N = 64 for R = 4, 16 and 64 relations), which keeps k = 4 to one or two evaluations."""
    from mechfact.facts import min_block_size

    b1, _ = min_block_size(n, r)
    b, _ = min_block_size(n, r**k, start=b1) if k > 1 else (b1, None)
    return r**k * (b + 1)


def multihop_table(out: Path) -> str:
    """Exact-chain accuracy of the multihop parts under ``out``: one row per (N, batch, steps, d, MLP width, seed)
    (the part's queries per step, ``full`` for a full batch, and step budget), direct / CoT per k, and the construction's
    d for a direct lookup at each k (CoT's: the k = 1 value), cached in ``out/construction_d.json``."""
    rows = []
    for name in PARTS:
        f = out / name / "result.json"
        if not (name.startswith("multihop_") and f.is_file()):
            continue
        a = part_command(name)
        pts = {(p["hops"], p["mode"]): p["accuracy"] for p in json.loads(f.read_text())["points"]}
        rows.append((a.subjects, a.relations, a.batch_size, a.steps, a.d, a.mlp_width, a.seed, pts))  # batch 0: full
    if not rows:
        return "(no multihop parts)"
    ks = sorted({k for *_, pts in rows for k, _ in pts})
    head = ["N", "R", "batch", "steps", "d", "MLP width", "seed"] + [f"k = {k} {m}" for k in ks
                                                        for m in (("direct",) if k == 1 else ("direct", "CoT"))]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n, r, batch, steps, d, m, seed, pts in sorted(rows, key=lambda row: row[:7]):
        cells = [f"{pts[(k, m)]:.3f}" if (k, m) in pts else "—" for k in ks
                 for m in (("direct",) if k == 1 else ("direct", "cot"))]
        lines.append(f"| {n} | {r} | {batch or 'full'} | {steps} | {d} | {m} | {seed} | " + " | ".join(cells) + " |")
    from mechfact.runs import read_json, write_json_atomic

    cache = out / "construction_d.json"  # the constructions are deterministic; k = 4 at N = 64 takes ~2 min
    known = read_json(cache) if cache.is_file() else {}
    for n, r in sorted({(n, r) for n, r, *_ in rows}):
        for k in ks:
            if n * r**k <= CONSTRUCTION_MAX_CHAINS and f"{n},{r},{k}" not in known:
                known[f"{n},{r},{k}"] = construction_d(n, r, k)
                write_json_atomic(cache, known)
        cons = [f"k = {k}: {known[f'{n},{r},{k}']}" for k in ks if f"{n},{r},{k}" in known]
        # a k not evaluated: the scan starts at the single-hop block size, so its d is at least R^k (b1 + 1)
        big = [k for k in ks if f"{n},{r},{k}" not in known and f"{n},{r},1" in known]
        cons += [f"k = {k}: at least {r**k * known[f'{n},{r},1'] // r}" for k in big]
        lines.append(f"\nConstruction's d for a direct lookup at N = {n}, R = {r} ({', '.join(cons)}); chain of "
                     "thought needs the k = 1 value at every k."
                     + (f" The 'at least' values were not evaluated ({', '.join(f'{n * r**k:,}' for k in big)} "
                        f"chains, over {CONSTRUCTION_MAX_CHAINS:,}): the block-size scan starts at the single-hop "
                        "block size, so R^k (that size + 1) bounds the width from below." if big else ""))
    return "\n".join(lines)


def export_run_json(folder: Path, dest: Path) -> int:
    """Copies a run folder's config.json, result.json and meta.json (those present) to ``dest``, the config
    without its ``out`` (a path of the machine that ran it), the evaluations of searches stopped part way
    (:func:`mechfact.executor.read_spills`) folded into the result's; the number of files copied."""
    from mechfact.executor import merge_evaluations, read_spills
    from mechfact.runs import read_json, write_json_atomic

    n = 0
    for name in ("config.json", "result.json", "meta.json"):
        if (folder / name).is_file():
            data = read_json(folder / name)
            if name == "config.json":
                data.get("config", {}).pop("out", None)
            if name == "result.json" and isinstance(data.get("evaluations"), dict):
                merge_evaluations(data["evaluations"], {k: v for k, v in read_spills(folder).items()
                                                        if k not in data["evaluations"]})
            write_json_atomic(dest / name, data)
            n += 1
    return n


def resume_shipped(shipped: Path, out: Path, parts: list[str]) -> list[str]:
    """Copies the exported parts (:func:`export_run_json`'s JSON, e.g. under docs/runs/pool/capacity) of ``parts``
    that ``out`` lacks into ``out``, so that running them continues the shipped runs (their evaluations are
    memoised, a finished threshold is not searched again) instead of starting over; the run checks the copied
    config against the part's own as any resume does. Returns the parts copied."""
    from mechfact.runs import read_json, write_json_atomic

    copied = []
    for name in parts:
        src, dest = shipped / name, out / name
        if dest.exists() or not (src / "result.json").is_file():
            continue
        for f in ("config.json", "meta.json", "result.json"):  # result.json last: it makes the folder a run
            if (src / f).is_file():
                write_json_atomic(dest / f, read_json(src / f))
        copied.append(name)
    return copied


def export_multihop(out: Path, dest: Path) -> int:
    """Copies the multihop parts' JSON (and the construction cache) to ``dest``: what the multi-hop table of
    docs/results_facts.md is rebuilt from (``--out dest --multihop-table``)."""
    from mechfact.runs import read_json, write_json_atomic

    n = sum(export_run_json(out / name, dest / name) for name in PARTS if name.startswith("multihop_"))
    if (out / "construction_d.json").is_file():  # merged into dest's: a run folder may hold fewer constructions
        old = read_json(dest / "construction_d.json") if (dest / "construction_d.json").is_file() else {}
        write_json_atomic(dest / "construction_d.json", {**old, **read_json(out / "construction_d.json")})
        n += 1
    return n


def _figure(out: Path, rows) -> None:
    import numpy as np

    from mechfact.plotting import save, subplots

    series = (("N256_cos_2k", "o", "N = 256, m = 64"), ("N1024_R", "s", "N = 1024, m = 64"),
              ("N4096_R", "D", "N = 4096, m = 64"), ("N64_m16", "^", "N = 64, m = 16 (800 steps)"))
    fig, ax = subplots(figsize=(6.4, 4.4))
    fit_pts = []
    for name, marker, label in series:
        pts = sorted((t["r_log_n"], t["median_threshold"], t["relations"]) for n, t in rows
                     if n.startswith(name) and n.endswith("cos_2k" if name in ("N1024_R", "N4096_R") else "")
                     and t["median_threshold"] is not None)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, ls="-", label=label)
            if name != "N64_m16":
                fit_pts += pts
    if fit_pts:  # least squares through the origin over the m = 64, 2000-step points
        x, y = np.array([p[0] for p in fit_pts]), np.array([p[1] for p in fit_pts])
        c = float(x @ y / (x @ x))
        xs = np.linspace(0, x.max() * 1.05, 2)
        ax.plot(xs, c * xs, "k--", lw=1, label=f"fit d* = {c:.2f} R ln N (m = 64)")
    ax.set_xlabel(r"$R \ln N$")
    ax.set_ylabel("d* (smallest d reaching 99%)")
    ax.set_title("Trainable embeddings: memorisation threshold (2000 steps, R = 1, 2, 4, 8)")
    ax.legend(fontsize=8)
    save(fig, out / "fig_dstar_all.png")
    print("figure:", out / "fig_dstar_all.png", "| ln(1024)/ln(256) =", round(math.log(1024) / math.log(256), 3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/facts"))
    ap.add_argument("--part", nargs="+", choices=sorted(PARTS), default=None, help="default: all parts")
    ap.add_argument("--summarize", action="store_true")
    ap.add_argument("--multihop-table", action="store_true", help="print the multihop parts' table")
    ap.add_argument("--export-multihop", type=Path, default=None, metavar="DIR",
                    help="copy the multihop parts' JSON to DIR (the table is rebuilt with --out DIR)")
    ap.add_argument("--resume-from", type=Path, default=None, metavar="DIR",
                    help="first copy the exported parts in DIR (e.g. docs/runs/pool/capacity) that --out lacks, so "
                         "they continue where the shipped runs stopped")
    ap.add_argument("--executor", default="local", choices=("local", "ray"))
    ap.add_argument("--workers", default=None, help="Ray: jobs at once (default: every core)")
    ap.add_argument("--ray-address", default=None, help="Ray: join a running cluster ('auto' or HOST:PORT)")
    from mechfact.device import DEVICE_CHOICES

    ap.add_argument("--device", default=None, choices=DEVICE_CHOICES,
                    help="passed to every part's command (default: the command's own, auto)")
    a = ap.parse_args()
    if a.export_multihop:
        print(f"{export_multihop(a.out, a.export_multihop)} files copied to {a.export_multihop}")
    elif a.multihop_table:
        print(multihop_table(a.out))
    elif a.summarize:
        summarize(a.out)
    else:
        if a.resume_from is not None:
            if not a.resume_from.is_dir():
                ap.error(f"--resume-from {a.resume_from}: no such folder (an export, e.g. docs/runs/pool/capacity)")
            got = resume_shipped(a.resume_from, a.out, a.part or list(PARTS))
            print(f"copied from {a.resume_from}: {', '.join(got) or 'nothing'}")
        flags = ["--executor", a.executor] + (["--workers", a.workers] if a.workers else []) + \
                (["--ray-address", a.ray_address] if a.ray_address else [])
        run(a.out, a.part or list(PARTS), (flags if a.executor == "ray" else []) +
            (["--device", a.device] if a.device else []))


if __name__ == "__main__":
    main()
