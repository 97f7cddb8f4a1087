"""Speed-up of a sweep on several cores: the local executor against Ray with 1 and N workers, side by side.

    python benchmarks/scaling_bench.py [--workers 2] [--repeats 1]

Each setting runs the same ``mechfact memory sweep`` as a fresh process (Ray's start-up included, as a user
pays it), interleaved local, ray x1, ray xN, local, ... so machine noise hits all alike; every run must write
the same result.json (checked). Printed: median wall times and the speed-up of ray xN over the local
executor on one thread, beside the goal (>= 1.7x for 2 workers on 2 idle cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# about 2 minutes on one thread: Ray's fixed cost (runtime start, workers importing torch, shutdown: 5-7 s
# measured here) is paid once per command, so a sweep of a few seconds measures that cost, not the speed-up
SWEEP = ["memory", "sweep", "--d", "48", "64", "--points", "16", "--seeds", "4", "--steps", "2000", "--quiet"]
GOAL = 1.7


def _run(flags: list[str], out: Path) -> float:
    env = {**os.environ, "TQDM_DISABLE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mechfact.cli", *SWEEP, *flags, "--out", str(out)], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args()
    settings = {"local, 1 thread": ["--threads", "1"],
                "ray, 1 worker": ["--executor", "ray", "--workers", "1"],
                f"ray, {a.workers} workers": ["--executor", "ray", "--workers", str(a.workers)]}
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load average {load:.2f} at the start; sweep: mechfact {' '.join(SWEEP)}")
    times: dict[str, list[float]] = {k: [] for k in settings}
    with tempfile.TemporaryDirectory() as tmp:
        results = set()
        for r in range(a.repeats):
            for i, (name, flags) in enumerate(settings.items()):
                out = Path(tmp) / f"{r}_{i}"
                times[name].append(_run(flags, out))
                results.add((out / "result.json").read_bytes())
        identical = len(results) == 1
    base = statistics.median(times["local, 1 thread"])
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        rows.append({"setting": name, "median_s": med, "speedup_vs_local": base / med, "runs": ts})
        print(f"  {name:<20} {med:7.1f} s   speed-up {base / med:4.2f}x")
    best = rows[-1]["speedup_vs_local"]
    print(f"ray x{a.workers} over local: {best:.2f}x (goal >= {GOAL}x on {a.workers} idle cores: "
          f"{'met' if best >= GOAL else 'not met'}); result.json identical in every run: {identical}")
    if a.json:
        Path(a.json).write_text(json.dumps({"load_at_start": load, "rows": rows, "identical": identical}, indent=2))


if __name__ == "__main__":
    main()
