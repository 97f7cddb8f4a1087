"""One-layer fact-model training benchmark (run on demand, not in CI).

Prints, measured side by side in one run with one thread count:
  1. training throughput (examples/s = supervised queries per second) of full-batch
     Adam for a few (N, R, d, m) settings;
  2. achieved FLOP/s of those steps over this machine's float32 matmul peak
     (a square matmul timed in the same run), i.e. how much of the hardware the
     training loop uses;
  3. the step time with the (queries, N) logits materialised and a dense
     cross-entropy, over the step time with mechfact's chunked
     ``linear_cross_entropy`` (what training uses), and the share of the dense
     step spent in the N-way softmax cross-entropy (memory-bound: why the chunked
     form, whose working set stays in cache, pays off as N grows);
  2b. the same for the step's own matmuls alone (its GEMM shapes on random operands, back to back: the
     ceiling those thin shapes allow, as a fraction of the peak) and the step's FLOP/s over that ceiling;
  4. the step time with the block run at every position (``final_resid``, then
     the supervised rows) over the step with the block run at the supervised
     last position only (``FactModel.supervised_resid``, what training uses):
     the baseline a hand-written one-layer model would have.

Steps and the peak matmul are timed in turns (interleaved repeats, medians of
the per-repeat ratios), so the load of other jobs cancels; denormals are
flushed, as training does. Goal: >= 0.5 of the matmul peak at N >= 1024.

    python benchmarks/facts_bench.py --threads 1 [--device auto] [--steps 5] [--reps 3]

On a GPU (--device cuda) the same table is printed for the GPU.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported: idle OpenMP threads sleep

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from mechfact.device import flush_denormals, resolve_device  # noqa: E402
from mechfact.facts import FactModel, FactModelConfig, FactWorld  # noqa: E402
from mechfact.facts.evaluate import supervised_logits  # noqa: E402
from mechfact.facts.losses import linear_cross_entropy  # noqa: E402
from mechfact.facts.train import loss_fn  # noqa: E402
from mechfact.facts.world import IGNORE  # noqa: E402

from memory_bench import _sync, matmul_peak  # noqa: E402  (same folder)

GOAL_PEAK = 0.5  # >= 0.5 of the float32 matmul peak at N >= 1024


def attention_rows(model: FactModel, tokens: torch.Tensor) -> int:
    """Rows the head's value and output maps run on in a training step: one per query, or one per (position,
    token) pair where there are fewer of those (``FactModel.supervised_resid``'s per-token tables)."""
    pairs = tokens.shape[1] * model.W_E.shape[0]
    return pairs if model.blocks[0].attn.uniform and pairs < tokens.shape[0] else tokens.shape[0]


def step_flops(cfg: FactModelConfig, n_queries: int, seq: int = 1, attn_rows: int | None = None) -> float:
    """Matmul FLOPs of one forward+backward step (backward ~ 2x forward) with the block run at ``seq`` positions
    per query (training runs it at the supervised last position only: ``seq = 1``); the head's value and output
    maps on ``attn_rows`` rows (default: every query's ``seq`` positions)."""
    d, m, N = cfg.d, cfg.mlp_width, cfg.outputs
    rows = n_queries * seq if attn_rows is None else attn_rows
    fwd = rows * 2 * (2 * d * d) + n_queries * seq * 2 * (2 * d * m) + n_queries * 2 * d * N  # OV; MLP; unembedding
    return 3.0 * fwd


def own_matmuls(cfg: FactModelConfig, n: int, dev, steps: int, attn_rows: int | None = None) -> float:
    """FLOP/s of the step's own matmuls alone, on random operands of their shapes: forward ``(n, k) @ (k, k')``
    for the head's V and O maps, the MLP's in and out maps and the unembedding, and per map the two backward
    products (``dY @ W^T``, ``X^T @ dY``) -- the :func:`step_flops` count, run back to back. The ceiling these
    thin shapes (inner dimension d or m) allow on this device, beside the square matmul's peak."""
    d, m, A = cfg.d, cfg.mlp_width, cfg.outputs
    a = n if attn_rows is None else attn_rows
    maps = [(a, d, d), (a, d, d), (n, d, m), (n, m, d), (n, d, A)]
    ops = []
    for rows, k_in, k_out in maps:
        X, W, dY = (torch.randn(*s, device=dev) for s in ((rows, k_in), (k_in, k_out), (rows, k_out)))
        ops += [(X, W), (dY, W.T), (X.T, dY)]
    flops = sum(2.0 * a.shape[0] * a.shape[1] * b.shape[1] for a, b in ops)
    for a, b in ops:  # warm-up
        a @ b
    _sync(dev)
    t = time.perf_counter()
    for _ in range(steps):
        for a, b in ops:
            a @ b
    _sync(dev)
    return flops * steps / (time.perf_counter() - t)


def bench(N: int, R: int, d: int, m: int, dev, steps: int, reps: int, A: int = 0) -> dict:
    """One setting; ``A`` > 0: an attribute-pool world scored over its A attributes (the default there)."""
    world = FactWorld(N, R, 0, attributes=A or None)
    model = FactModel(FactModelConfig(N, R, d=d, mlp_width=m, n_outputs=A)).to(dev)
    q = world.single_hop()
    tokens, targets = q.tokens.to(dev), q.targets.to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    sup = targets != IGNORE

    def step(mode: str = "last"):
        opt.zero_grad(set_to_none=True)
        if mode == "dense":  # the (queries, N) logits materialised, as before mechfact.facts.losses
            F.cross_entropy(supervised_logits(model, tokens, sup), targets[sup]).backward()
        elif mode == "full":  # the block at every position, then the supervised rows
            linear_cross_entropy(model.final_resid(tokens)[sup], model.W_U, targets[sup]).backward()
        else:
            loss_fn(model, tokens, targets).backward()
        opt.step()

    def timed(mode: str) -> float:
        _sync(dev)
        t = time.perf_counter()
        for _ in range(steps):
            step(mode)
        _sync(dev)
        return (time.perf_counter() - t) / steps

    logits = torch.randn(len(q), model.cfg.outputs, device=dev, requires_grad=True)  # the CE alone, same shape
    tg = targets[:, -1]

    def ce() -> float:
        _sync(dev)
        t = time.perf_counter()
        for _ in range(steps):
            torch.nn.functional.cross_entropy(logits, tg).backward()
        _sync(dev)
        return (time.perf_counter() - t) / steps

    step("last"), step("dense"), step("full")  # warm-up
    dts, denses, fulls, ces, peaks, owns = [], [], [], [], [], []
    for _ in range(reps):  # in turns: the peaks, the chunked step, the dense step, the full-forward step, the CE
        peaks.append(matmul_peak(dev))
        owns.append(own_matmuls(model.cfg, len(q), dev, steps, attention_rows(model, tokens)))
        dts.append(timed("last"))
        denses.append(timed("dense"))
        fulls.append(timed("full"))
        ces.append(ce())
    dt, flops = statistics.median(dts), step_flops(model.cfg, len(q), attn_rows=attention_rows(model, tokens))
    return {"N": N, "R": R, "A": A or N, "d": d, "m": m, "queries": len(q), "s_per_step": dt, "examples_per_s": len(q) / dt,
            "flop_per_s": flops / dt, "peak_flop_per_s": statistics.median(peaks),
            "fraction_of_peak": statistics.median(flops / t / pk for t, pk in zip(dts, peaks)),
            "own_matmuls_flop_per_s": statistics.median(owns),
            "own_matmuls_over_peak": statistics.median(o / pk for o, pk in zip(owns, peaks)),
            "fraction_of_own_matmuls": statistics.median(flops / t / o for t, o in zip(dts, owns)),
            "dense_over_chunked": statistics.median(a / b for a, b in zip(denses, dts)),
            "full_over_last": statistics.median(a / b for a, b in zip(fulls, dts)),
            "ce_share_dense": min(1.0, statistics.median(c / a for c, a in zip(ces, denses)))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3, help="interleaved repeats (medians)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    flush_denormals()
    dev = resolve_device(a.device)
    rows = [bench(N, R, d, 64, dev, a.steps, a.reps, A)
            for N, R, d, A in ((256, 4, 16, 0), (1024, 4, 16, 0), (1024, 4, 32, 0), (1024, 8, 32, 0), (4096, 4, 32, 0),
                               (1024, 8, 16, 64), (4096, 8, 24, 64), (4096, 16, 32, 64))]
    peak = statistics.median(r["peak_flop_per_s"] for r in rows)
    print(f"device {dev}, threads {a.threads}, float32 matmul peak {peak / 1e9:.1f} GFLOP/s (median over the run), "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'N':>5} {'R':>2} {'A':>5} {'d':>3} {'queries':>8} {'ms/step':>8} {'examples/s':>11} {'GFLOP/s':>8} "
          f"{'/ peak':>7} {'GEMMs/peak':>10} {'/ GEMMs':>7} {'dense/chunked':>13} {'CE share (dense)':>16} "
          f"{'all pos/last':>12}  "
          f"goal (/ peak >= {GOAL_PEAK:g} at N >= 1024)")
    for r in rows:
        goal = "-" if r["N"] < 1024 else ("goal met" if r["fraction_of_peak"] >= GOAL_PEAK else "goal NOT met")
        print(f"{r['N']:>5} {r['R']:>2} {r['A']:>5} {r['d']:>3} {r['queries']:>8} {1e3 * r['s_per_step']:>8.1f} "
              f"{r['examples_per_s']:>11.0f} {r['flop_per_s'] / 1e9:>8.2f} {r['fraction_of_peak']:>7.3f} "
              f"{r['own_matmuls_over_peak']:>10.3f} {r['fraction_of_own_matmuls']:>7.3f} "
              f"{r['dense_over_chunked']:>13.2f} {r['ce_share_dense']:>16.2f} {r['full_over_last']:>12.2f}  {goal}")
    print(json.dumps({"device": str(dev), "threads": a.threads, "matmul_peak_flop_per_s": peak, "rows": rows}))


if __name__ == "__main__":
    main()
