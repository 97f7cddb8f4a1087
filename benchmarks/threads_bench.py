"""Thread defaults, quiet and loaded: one sweep timed under each OpenMP setting, side by side.

    python benchmarks/threads_bench.py [--repeats 3] [--load 0 2]

Each setting runs the same ``mechfact memory sweep`` as a fresh process (OpenMP reads its environment when
torch is imported), interleaved A, B, C, A, B, C, ... so machine noise hits every setting alike; with
``--load N`` N busy processes (plain Python loops, one core each) run beside it, like the other jobs of a
shared node. Printed: the median wall time of each setting and its ratio to one thread, per load.

Settings: torch's default thread count with OpenMP's default (active, spinning) wait policy — the cliff;
the same with ``OMP_WAIT_POLICY=PASSIVE``, which mechfact sets before torch is imported; one thread.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEP = ["memory", "sweep", "--d", "48", "64", "--points", "3", "--seeds", "2", "--steps", "600", "--quiet"]

SETTINGS = {  # name -> (extra environment, extra flags)
    "default threads, active wait": ({"OMP_WAIT_POLICY": "ACTIVE"}, []),
    "default threads, passive wait (mechfact default)": ({}, []),
    "--threads 1": ({}, ["--threads", "1"]),
}


def _busy(stop) -> None:
    x = 0
    while not stop.is_set():
        x += 1


def _run(env: dict, flags: list[str], out: Path) -> float:
    e = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    e.update(env)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mechfact.cli", *SWEEP, *flags, "--out", str(out)], env=e, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--load", type=int, nargs="+", default=[0, 2], help="busy processes beside the sweep")
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args()
    print(f"{os.cpu_count()} cores; sweep: mechfact {' '.join(SWEEP)}")
    rows = []
    for load in a.load:
        stop = mp.Event()
        busy = [mp.Process(target=_busy, args=(stop,), daemon=True) for _ in range(load)]
        for p in busy:
            p.start()
        times: dict[str, list[float]] = {k: [] for k in SETTINGS}
        try:
            with tempfile.TemporaryDirectory() as tmp:
                for r in range(a.repeats):
                    for i, (name, (env, flags)) in enumerate(SETTINGS.items()):
                        times[name].append(_run(env, flags, Path(tmp) / f"{load}_{r}_{i}"))
        finally:
            stop.set()
            for p in busy:
                p.join()
        one = statistics.median(times["--threads 1"])
        print(f"\nload: {load} busy process(es)")
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"  {name:<50} {med:7.1f} s   {med / one:5.2f}x of one thread")
            rows.append({"load": load, "setting": name, "median_s": med, "ratio_to_one_thread": med / one, "runs": ts})
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
