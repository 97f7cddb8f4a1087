"""Linear-memory benchmarks (run on demand, not in CI).

Prints figures measured side by side in one run:
  1. training throughput at d = 64 and 128 as achieved FLOP/s / this machine's
     float32 matmul peak (measured in the same run, same thread count);
  2. a batched sweep of 24 runs vs the same 24 runs one at a time (wall ratio);
  3. peak resident memory of the decoupled problem at p = 20000, d = 128
     (accuracy of Hebb's W over chunk-regenerated candidates, in a subprocess).

    python benchmarks/memory_bench.py --threads 2 [--device auto] [--skip-dp]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from mechfact.device import resolve_device
from mechfact.memory.problems import MemoryProblem, p_for_alpha
from mechfact.memory.solvers import MemoryTrainConfig, train


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(dev, n=1024, reps=20) -> float:
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    for _ in range(3):
        a @ b
    _sync(dev)
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(dev)
    return 2 * n**3 * reps / (time.perf_counter() - t)


def train_throughput(d: int, runs: int, steps: int, dev) -> dict:
    p = p_for_alpha(0.5, d)
    probs = [MemoryProblem("original", d, p, s) for s in range(runs)]
    cfg = MemoryTrainConfig(steps=steps, early_stop=False)
    train(probs, cfg=MemoryTrainConfig(steps=2, early_stop=False), device=dev)  # warm-up
    _sync(dev)
    t = time.perf_counter()
    train(probs, cfg=cfg, device=dev)
    _sync(dev)
    dt = time.perf_counter() - t
    fwd = runs * (2 * p * d * d + 2 * p * p * d)  # V = E W^T, S = V U^T
    flops = 3 * fwd * steps  # backward ~ 2x forward
    return {"d": d, "p": p, "runs": runs, "steps": steps, "s_per_step": dt / steps, "flop_per_s": flops / dt}


def batched_vs_sequential(dev, n=24, d=32, steps=300) -> dict:
    p = p_for_alpha(0.5, d)
    probs = [MemoryProblem("original", d, p, s) for s in range(n)]
    cfg = MemoryTrainConfig(steps=steps, early_stop=False)
    t = time.perf_counter()
    train(probs, cfg=cfg, device=dev)
    _sync(dev)
    tb = time.perf_counter() - t
    t = time.perf_counter()
    for pr in probs:
        train([pr], cfg=cfg, device=dev)
    _sync(dev)
    ts = time.perf_counter() - t
    return {"runs": n, "d": d, "p": p, "steps": steps, "batched_s": tb, "sequential_s": ts, "speedup": ts / tb}


DP_CHILD = """
import resource, time, json, torch
from mechfact.memory.problems import MemoryProblem, scores
from mechfact.memory.solvers import hebb
pr = MemoryProblem("decoupled", 128, 20000, 0)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.time()
acc = scores(pr, hebb(pr)).accuracy
print(json.dumps({"p": 20000, "d": 128, "hebb_accuracy": acc, "seconds": time.time() - t,
                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
                  "dense_tensor_would_be_gb": pr.dense_bytes() / 1e9}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-dp", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dev = resolve_device(a.device)
    out = {"device": str(dev), "threads": a.threads, "torch": torch.__version__}
    peak = matmul_peak(dev)
    out["matmul_peak_gflops"] = peak / 1e9
    out["training"] = []
    for d, runs, steps in ((64, 4, 100), (128, 2, 20)):
        r = train_throughput(d, runs, steps, dev)
        r["fraction_of_matmul_peak"] = r["flop_per_s"] / peak
        out["training"].append(r)
        print(f"train d={d} p={r['p']} x{runs}: {r['s_per_step']*1e3:.1f} ms/step, "
              f"{r['flop_per_s']/1e9:.1f} GFLOP/s = {r['fraction_of_matmul_peak']:.2f} x matmul peak ({peak/1e9:.1f} GFLOP/s)", flush=True)
    bs = batched_vs_sequential(dev)
    out["batched_vs_sequential"] = bs
    print(f"24 runs batched {bs['batched_s']:.2f}s vs one at a time {bs['sequential_s']:.2f}s: {bs['speedup']:.2f}x", flush=True)
    if not a.skip_dp:
        res = subprocess.run([sys.executable, "-c", DP_CHILD], capture_output=True, text=True)
        dp = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else {"error": res.stderr[-500:]}
        out["decoupled_p20000_d128"] = dp
        print(f"decoupled p=20000 d=128: peak RSS {dp.get('peak_rss_gb', float('nan')):.2f} GB "
              f"(dense candidates would be {dp.get('dense_tensor_would_be_gb', float('nan')):.0f} GB), "
              f"{dp.get('seconds', float('nan')):.0f} s", flush=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
