"""Fact-model training in an attribute-pool world, scoring all N entities vs only the A attributes (run on demand,
not in CI). Side by side in one process, one thread count, the same world, init and steps:

  (a) ``entities``: the output vocabulary is all N entities (every answer is one of the first A anyway);
  (b) ``attributes``: ``build_fact_model(..., outputs="attributes")``, the unembedding, the loss and the
      evaluation over the A attributes only.

Prints CPU and wall seconds per training step (full batch, the paper's shapes by default: N = 4096, R = 16,
A = 64, d = 64, m = 256) and per evaluation of every fact, the ratios, and each run's accuracy and loss after the
steps (the two runs do not follow the same trajectory: the softmax is over other sets).

    python benchmarks/outputs_bench.py [--threads 1] [--n 4096] [--r 16] [--a 64] [--steps 20]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported: idle OpenMP threads sleep

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from mechfact.facts.evaluate import evaluate  # noqa: E402
from mechfact.facts.model import build_fact_model  # noqa: E402
from mechfact.facts.train import TrainConfig, train  # noqa: E402
from mechfact.facts.world import FactWorld  # noqa: E402


def _timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--a", type=int, default=64)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--m", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    world = FactWorld(a.n, a.r, seed=0, attributes=a.a)
    rows = []
    for outputs in ("entities", "attributes"):
        model = build_fact_model(world, d=a.d, mlp_width=a.m, seed=0, outputs=outputs)
        cfg = TrainConfig(lr=1e-2, steps=a.steps, eval_every=a.steps, target_accuracy=None)
        hist, wall, cpu = _timed(lambda: train(model, world, cfg))
        ev, ewall, ecpu = _timed(lambda: evaluate(model, world))
        rows.append({"outputs": outputs, "n_outputs": model.cfg.outputs, "step_wall_s": wall / a.steps,
                     "step_cpu_s": cpu / a.steps, "eval_wall_s": ewall, "eval_cpu_s": ecpu,
                     "accuracy": ev["accuracy"], "final_loss": (hist.get("history") or [{}])[-1].get("loss")})
        print(f"{outputs:>10} ({model.cfg.outputs} outputs): {1e3 * cpu / a.steps:.0f} ms CPU per step "
              f"({1e3 * wall / a.steps:.0f} wall), evaluation {ecpu:.2f} s CPU; accuracy {ev['accuracy']:.3f} "
              f"after {a.steps} steps", flush=True)
    e, p = rows
    print(f"N = {a.n}, R = {a.r} ({a.n * a.r} facts), A = {a.a}, d = {a.d}, m = {a.m}, threads {a.threads}: "
          f"attributes are {e['step_cpu_s'] / p['step_cpu_s']:.1f}x faster per step (CPU), "
          f"{e['eval_cpu_s'] / p['eval_cpu_s']:.1f}x per evaluation")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
