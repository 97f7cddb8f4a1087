"""Linear-memory benchmarks (run on demand, not in CI).

Prints figures measured side by side in one process, one thread count, runs
interleaved (A, B, A, B, ...) and medians of the per-repeat ratios taken, so
that the load of other jobs on the machine cancels:

  1. the original problem (OP), 4 instances at alpha = 0.5, d = 32, 64, 128:
     mechfact's batched ``train`` against the hand-written baseline a
     researcher would write (plain PyTorch, one instance at a time,
     ``F.cross_entropy`` + Adam, same initial W, same steps): the speed ratio
     (goal: batched >= 2x faster), the achieved FLOP/s over this machine's
     float32 matmul peak (a 1024^3 matmul timed in the same run; goal >= 0.5 at
     d >= 64) and how far the two W are apart;
  2. the decoupled problem (DP) at the same sizes: the step over its bandwidth
     floor (reading the dense competitors twice at the bandwidth of a plain
     pass over a tensor of their size, measured beside it; goal <= 2), DP step
     over OP step (goal <= 2) and a whole 1-step DP run (data, competitors
     generated once, the float64 re-check reusing them) over a 1-step OP run;
  3. a batched sweep of 24 runs vs the same 24 runs one at a time (wall ratio);
  4. peak resident memory of the decoupled problem at p = 20000, d = 128
     (accuracy of Hebb's W over chunk-regenerated candidates, in a subprocess;
     --skip-dp skips it: about 6 minutes).

A step's time is the median interval between consecutive steps, stamped inside
``train`` (setup and the final float64 re-check fall out); the hand-written
loop is stamped the same way. FLOPs counted are the matmuls a step executes: V = E W^T
and S = V U^T forward, dV = dS U and dW = dV^T E backward (E and U are constants):
4 (p^2 d + p d^2) per instance. Denormals are flushed, as the CLI does.

    python benchmarks/memory_bench.py --threads 1 [--device auto] [--reps 5] [--skip-dp]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported: idle OpenMP threads sleep

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from mechfact.device import flush_denormals, resolve_device  # noqa: E402
from mechfact.memory.problems import MemoryProblem, p_for_alpha  # noqa: E402
from mechfact.memory import solvers  # noqa: E402
from mechfact.memory.solvers import MemoryTrainConfig, train  # noqa: E402

GOAL_VS_HAND = 2.0  # batched >= 2x faster than the hand-written per-instance loop
GOAL_PEAK = 0.5  # >= 0.5 of the float32 matmul peak at d >= 64
GOAL_DP_FLOOR = 2.0  # decoupled step <= 2x its bandwidth floor
GOAL_DP_OVER_OP = 2.0  # decoupled step <= 2x the original's


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


def _timed(fn, dev) -> float:
    _sync(dev)
    t = time.perf_counter()
    fn()
    _sync(dev)
    return time.perf_counter() - t


def hand_written(pr: MemoryProblem, steps: int, dev, lr: float = 1.0, stamps: list | None = None) -> torch.Tensor:
    """The baseline: one instance, plain PyTorch, F.cross_entropy + Adam, the initial W mechfact uses."""
    d = pr.d
    E, U = pr.inputs().to(dev), pr.outputs().to(dev)
    g = torch.Generator().manual_seed(pr.seed * 7919 + pr.p * 31 + d)  # mechfact's initialisation (seed 0)
    W = (torch.randn(d, d, generator=g) / math.sqrt(d)).to(dev).requires_grad_()
    opt = torch.optim.Adam([W], lr=lr)
    target = torch.arange(pr.p, device=dev)
    for _ in range(steps):
        if stamps is not None:
            _sync(dev)
            stamps.append(time.perf_counter())
        loss = F.cross_entropy((E @ W.T) @ U.T, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return W.detach().cpu()


class _StepClock:
    """Times mechfact's training steps from the inside: a timestamp as each step's fused pass begins (one per
    step), so a step's time is the interval to the next one; setup and the final float64 re-check fall out."""

    def __init__(self, dev):
        self.dev, self.stamps = dev, []

    def __enter__(self):
        self.orig = solvers._FusedRows.__call__
        clock = self

        def stamped(rows, *args, **kw):
            _sync(clock.dev)
            clock.stamps.append(time.perf_counter())
            return clock.orig(rows, *args, **kw)

        solvers._FusedRows.__call__ = stamped
        return self

    def __exit__(self, *exc):
        solvers._FusedRows.__call__ = self.orig


def _median_interval(stamps: list[float]) -> float:
    return statistics.median(b - a for a, b in zip(stamps, stamps[1:]))


def ours_step(probs: list[MemoryProblem], steps: int, dev) -> tuple[float, list]:
    """Median seconds per step of mechfact's batched training of ``probs`` (and the W it returns)."""
    with _StepClock(dev) as clock:
        out = train(probs, cfg=MemoryTrainConfig(steps=steps, early_stop=False), device=dev)
    return _median_interval(clock.stamps), out.W


def hand_step(probs: list[MemoryProblem], steps: int, dev) -> tuple[float, list]:
    """Seconds per step (all instances) of the hand-written loop, one instance after the other."""
    total, Ws = 0.0, []
    for pr in probs:
        stamps: list[float] = []
        Ws.append(hand_written(pr, steps, dev, stamps=stamps))
        total += _median_interval(stamps)
    return total, Ws


def _goal(ok: bool) -> str:
    return "goal met" if ok else "goal NOT met"


def original_vs_hand(d: int, runs: int, steps: int, reps: int, dev) -> dict:
    p = p_for_alpha(0.5, d)
    probs = [MemoryProblem("original", d, p, s) for s in range(runs)]
    ours_step(probs, 3, dev), hand_step(probs, 3, dev)  # warm-up
    t_ours, t_hand, peaks = [], [], []
    for _ in range(reps):
        peaks.append(matmul_peak(dev))
        t, W_ours = ours_step(probs, steps, dev)
        t_ours.append(t)
        t, W_hand = hand_step(probs, steps, dev)
        t_hand.append(t)
    dW = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(W_ours, W_hand))
    flops = runs * 4 * (p * p * d + p * d * d)
    ratio = statistics.median(h / o for h, o in zip(t_hand, t_ours))
    frac = statistics.median(flops / o / pk for o, pk in zip(t_ours, peaks))
    frac_hand = statistics.median(flops / h / pk for h, pk in zip(t_hand, peaks))
    return {"d": d, "p": p, "runs": runs, "steps": steps, "ms_per_step": 1e3 * statistics.median(t_ours),
            "hand_ms_per_step": 1e3 * statistics.median(t_hand), "hand_over_ours": ratio,
            "fraction_of_peak": frac, "hand_fraction_of_peak": frac_hand,
            "peak_gflops": statistics.median(peaks) / 1e9, "max_rel_W_diff": dW,
            "goal_vs_hand_met": ratio >= GOAL_VS_HAND, "goal_peak_met": frac >= GOAL_PEAK if d >= 64 else None}


def decoupled(d: int, runs: int, steps: int, reps: int, dev) -> dict:
    p = p_for_alpha(0.5, d)
    dps = [MemoryProblem("decoupled", d, p, s) for s in range(runs)]
    ops = [MemoryProblem("original", d, p, s) for s in range(runs)]
    probe = torch.ones(runs, p, p - 1, d, device=dev)  # the competitors' size: a plain pass gives the bandwidth
    one = MemoryTrainConfig(steps=1, early_stop=False)
    t_dp, t_op, t_floor, s_dp, s_op = [], [], [], [], []
    for _ in range(reps):
        t_floor.append(2 * _timed(lambda: probe.sum(), dev))  # two reads: the scores, then the gradient
        t_dp.append(ours_step(dps, steps, dev)[0])
        t_op.append(ours_step(ops, steps, dev)[0])
        s_dp.append(_timed(lambda: train(dps, cfg=one, device=dev), dev))
        s_op.append(_timed(lambda: train(ops, cfg=one, device=dev), dev))
    nbytes = probe.numel() * 4
    over_floor = statistics.median(a / f for a, f in zip(t_dp, t_floor))
    over_op = statistics.median(a / o for a, o in zip(t_dp, t_op))
    return {"d": d, "p": p, "runs": runs, "steps": steps, "competitors_MB": nbytes / 1e6,
            "ms_per_step": 1e3 * statistics.median(t_dp), "floor_ms": 1e3 * statistics.median(t_floor),
            "read_GB_per_s": nbytes / (statistics.median(t_floor) / 2) / 1e9, "over_floor": over_floor,
            "op_ms_per_step": 1e3 * statistics.median(t_op), "dp_over_op": over_op,
            "one_step_run_s": statistics.median(s_dp), "op_one_step_run_s": statistics.median(s_op),
            "one_step_run_dp_over_op": statistics.median(a / o for a, o in zip(s_dp, s_op)),
            "goal_floor_met": over_floor <= GOAL_DP_FLOOR, "goal_dp_over_op_met": over_op <= GOAL_DP_OVER_OP}


def batched_vs_sequential(dev, n=24, d=32, steps=300) -> dict:
    p = p_for_alpha(0.5, d)
    probs = [MemoryProblem("original", d, p, s) for s in range(n)]
    cfg = MemoryTrainConfig(steps=steps, early_stop=False)
    tb = _timed(lambda: train(probs, cfg=cfg, device=dev), dev)
    ts = _timed(lambda: [train([pr], cfg=cfg, device=dev) for pr in probs], dev)
    return {"runs": n, "d": d, "p": p, "steps": steps, "batched_s": tb, "sequential_s": ts, "speedup": ts / tb}


DP_CHILD = """
import resource, time, json, torch
torch.set_num_threads({threads})
from mechfact.memory.problems import MemoryProblem, scores
from mechfact.memory.solvers import hebb
pr = MemoryProblem("decoupled", 128, 20000, 0)
t = time.time()
acc = scores(pr, hebb(pr)).accuracy
print(json.dumps({{"p": 20000, "d": 128, "hebb_accuracy": acc, "seconds": time.time() - t,
                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
                  "dense_tensor_would_be_gb": pr.dense_bytes() / 1e9}}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5, help="interleaved repeats (medians of their ratios)")
    ap.add_argument("--skip-dp", action="store_true", help="skip the p = 20000 decoupled memory figure")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    flush_denormals()
    dev = resolve_device(a.device)
    out = {"device": str(dev), "threads": a.threads, "torch": torch.__version__, "reps": a.reps}
    print(f"device {dev}, {a.threads} thread(s), torch {torch.__version__}, {a.reps} interleaved repeats, "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)

    print("\nOriginal problem, 4 instances at alpha = 0.5: mechfact batched vs a hand-written per-instance loop "
          "(F.cross_entropy + Adam)", flush=True)
    print(f"{'d':>4} {'p':>5} {'ours ms/step':>12} {'hand ms/step':>12} {'hand/ours':>9} {'ours/peak':>9} "
          f"{'hand/peak':>9} {'max|dW|/|W|':>11}  goals (hand/ours >= {GOAL_VS_HAND:g}; /peak >= {GOAL_PEAK:g} at d >= 64)")
    out["original"] = []
    for d, steps in ((32, 60), (64, 30), (128, 6)):
        r = original_vs_hand(d, 4, steps, a.reps, dev)
        out["original"].append(r)
        goals = _goal(r["goal_vs_hand_met"]) + " / " + ("-" if r["goal_peak_met"] is None else _goal(r["goal_peak_met"]))
        print(f"{d:>4} {r['p']:>5} {r['ms_per_step']:>12.2f} {r['hand_ms_per_step']:>12.2f} {r['hand_over_ours']:>9.2f} "
              f"{r['fraction_of_peak']:>9.2f} {r['hand_fraction_of_peak']:>9.2f} {r['max_rel_W_diff']:>11.1e}  {goals}",
              flush=True)
    print(f"(float32 matmul peak {statistics.median(r['peak_gflops'] for r in out['original']):.1f} GFLOP/s)")

    print("\nDecoupled problem at alpha = 0.5: step over its bandwidth floor (two reads of the competitors) and over "
          "the original problem's step", flush=True)
    print(f"{'d':>4} {'p':>5} {'runs':>4} {'comp. MB':>8} {'ms/step':>8} {'floor ms':>8} {'GB/s':>5} {'/floor':>6} "
          f"{'OP ms':>7} {'DP/OP':>6} {'1-step run DP/OP':>16}  goals (/floor <= {GOAL_DP_FLOOR:g}; DP/OP <= {GOAL_DP_OVER_OP:g})")
    out["decoupled"] = []
    for d, runs, steps, reps in ((32, 4, 30, a.reps), (64, 4, 10, a.reps), (128, 2, 5, max(1, min(a.reps, 3)))):
        r = decoupled(d, runs, steps, reps, dev)
        out["decoupled"].append(r)
        print(f"{d:>4} {r['p']:>5} {runs:>4} {r['competitors_MB']:>8.0f} {r['ms_per_step']:>8.2f} {r['floor_ms']:>8.2f} "
              f"{r['read_GB_per_s']:>5.1f} {r['over_floor']:>6.2f} {r['op_ms_per_step']:>7.2f} {r['dp_over_op']:>6.2f} "
              f"{r['one_step_run_dp_over_op']:>16.1f}  {_goal(r['goal_floor_met'])} / {_goal(r['goal_dp_over_op_met'])}",
              flush=True)

    bs = batched_vs_sequential(dev)
    out["batched_vs_sequential"] = bs
    print(f"\n24 runs (d = 32, 300 steps) batched {bs['batched_s']:.2f} s vs one at a time {bs['sequential_s']:.2f} s: "
          f"{bs['speedup']:.2f}x", flush=True)
    if not a.skip_dp:
        res = subprocess.run([sys.executable, "-c", DP_CHILD.format(threads=a.threads)], capture_output=True, text=True)
        dp = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else {"error": res.stderr[-500:]}
        out["decoupled_p20000_d128"] = dp
        print(f"decoupled p=20000 d=128: peak RSS {dp.get('peak_rss_gb', float('nan')):.2f} GB "
              f"(dense candidates would be {dp.get('dense_tensor_would_be_gb', float('nan')):.0f} GB), "
              f"{dp.get('seconds', float('nan')):.0f} s", flush=True)
    out["load_average_1min_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
