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
     form, whose working set stays in cache, pays off as N grows).

    python benchmarks/facts_bench.py --threads 2 [--device auto]

On a GPU (--device cuda) the same table is printed for the GPU.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from mechfact.device import resolve_device
from mechfact.facts import FactModel, FactModelConfig, FactWorld
from mechfact.facts.evaluate import supervised_logits
from mechfact.facts.train import loss_fn
from mechfact.facts.world import IGNORE

from memory_bench import _sync, matmul_peak  # noqa: E402  (same folder)


def step_flops(cfg: FactModelConfig, n_queries: int, seq: int = 2) -> float:
    """Matmul FLOPs of one forward+backward step (backward ~ 2x forward)."""
    d, m, N = cfg.d, cfg.mlp_width, cfg.n_entities
    per_token = 2 * (2 * d * d) + 2 * (2 * d * m)  # OV of the head, MLP in+out
    fwd = n_queries * (seq * per_token + 2 * d * N)  # unembedding at the supervised position only
    return 3.0 * fwd


def bench(N: int, R: int, d: int, m: int, dev, steps: int) -> dict:
    world = FactWorld(N, R, 0)
    model = FactModel(FactModelConfig(N, R, d=d, mlp_width=m)).to(dev)
    q = world.single_hop()
    tokens, targets = q.tokens.to(dev), q.targets.to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    sup = targets != IGNORE

    def step(dense: bool = False):
        opt.zero_grad(set_to_none=True)
        if dense:  # the (queries, N) logits materialised, as before mechfact.facts.losses
            F.cross_entropy(supervised_logits(model, tokens, sup), targets[sup]).backward()
        else:
            loss_fn(model, tokens, targets).backward()
        opt.step()

    def timed(dense: bool) -> float:
        for _ in range(2):
            step(dense)
        _sync(dev)
        t = time.perf_counter()
        for _ in range(steps):
            step(dense)
        _sync(dev)
        return (time.perf_counter() - t) / steps

    dt, dense_dt = timed(False), timed(True)
    logits = torch.randn(len(q), N, device=dev, requires_grad=True)  # the CE alone, same shape
    tg = targets[:, -1]
    _sync(dev)
    t = time.perf_counter()
    for _ in range(steps):
        torch.nn.functional.cross_entropy(logits, tg).backward()
    _sync(dev)
    ce = (time.perf_counter() - t) / steps
    return {"N": N, "R": R, "d": d, "m": m, "queries": len(q), "s_per_step": dt, "examples_per_s": len(q) / dt,
            "flop_per_s": step_flops(model.cfg, len(q)) / dt, "dense_over_chunked": dense_dt / dt,
            "ce_share_dense": min(1.0, ce / dense_dt)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dev = resolve_device(a.device)
    peak = matmul_peak(dev)
    rows = [bench(N, R, d, 64, dev, a.steps) for N, R, d in ((256, 4, 16), (1024, 4, 16), (1024, 8, 32), (4096, 4, 32))]
    print(f"device {dev}, threads {a.threads}, float32 matmul peak {peak / 1e9:.1f} GFLOP/s")
    print(f"{'N':>5} {'R':>2} {'d':>3} {'queries':>8} {'ms/step':>8} {'examples/s':>11} {'GFLOP/s':>8} "
          f"{'/ peak':>7} {'dense/chunked':>13} {'CE share (dense)':>16}")
    for r in rows:
        print(f"{r['N']:>5} {r['R']:>2} {r['d']:>3} {r['queries']:>8} {1e3 * r['s_per_step']:>8.1f} "
              f"{r['examples_per_s']:>11.0f} {r['flop_per_s'] / 1e9:>8.2f} {r['flop_per_s'] / peak:>7.3f} "
              f"{r['dense_over_chunked']:>13.2f} {r['ce_share_dense']:>16.2f}")
    print(json.dumps({"device": str(dev), "threads": a.threads, "matmul_peak_flop_per_s": peak, "rows": rows}))


if __name__ == "__main__":
    main()
