"""What Ray costs and gains on this machine: its fixed cost per command, the CPU its driver and daemons take
while the workers compute, and a sweep's wall time against the default local run, side by side.

    python benchmarks/ray_bench.py [--workers 2] [--repeats 2] [--json runs/ray_bench.json]

Every figure comes from fresh processes, as a user's commands pay it:

* fixed cost: a process that starts a :class:`~mechfact.executor.RayExecutor`, runs ``--workers`` trivial jobs
  (each worker process starts and imports torch) and shuts Ray down; the first start of this benchmark and the
  later ones are printed apart (a machine's very first Ray start also fills the page cache and can be slower);
* the sweep (``mechfact memory sweep --d 32 48 --alpha-min 0.3 --alpha-max 1.0 --points 6 --seeds 4 --method
  trained --problem original``, 48 jobs) under the default local executor (torch's default threads), the local
  executor on one thread, and ``--executor ray --workers N``, interleaved so machine noise hits all alike; every
  run must write the same result.json (checked);
* CPU shares during the Ray sweep: the process tree is sampled every 0.2 s (psutil, a Ray dependency); CPU
  seconds of the driver (the mechfact process), of Ray's daemons (GCS, raylet, agents, log monitor) and of its
  workers, each over the wall time, in cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SWEEP = ["memory", "sweep", "--d", "32", "48", "--alpha-min", "0.3", "--alpha-max", "1.0", "--points", "6",
         "--seeds", "4", "--method", "trained", "--problem", "original", "--quiet"]

FIXED = """
import sys, time
t0 = time.perf_counter()
from mechfact.executor import Job, RayExecutor
workers = int(sys.argv[1])
ex = RayExecutor(workers=workers, progress=False)
t1 = time.perf_counter()
ex.map([Job(key=str(i), fn=lambda: __import__("torch").ones(1).sum().item()) for i in range(workers)],
       lambda j, v: None)
t2 = time.perf_counter()
ex.close()
t3 = time.perf_counter()
print(t1 - t0, t2 - t1, t3 - t2)
"""


def _env() -> dict:
    return {**os.environ, "TQDM_DISABLE": "1", "RAY_USAGE_STATS_ENABLED": "0"}


def fixed_cost(workers: int) -> dict:
    """Seconds: importing mechfact's executor, Ray's start with the first ``workers`` trivial jobs, shutdown."""
    out = subprocess.run([sys.executable, "-c", FIXED, str(workers)], env=_env(), check=True, capture_output=True,
                         text=True).stdout.split()
    imp, first, stop = (float(x) for x in out[-3:])
    return {"import_s": imp, "start_and_first_jobs_s": first, "shutdown_s": stop, "total_s": imp + first + stop}


def _kind(p) -> str:
    try:
        cmd = " ".join(p.cmdline())
    except Exception:  # noqa: BLE001 - a process that just exited
        return "gone"
    if "default_worker.py" in cmd or p.name().startswith("ray::"):
        return "workers"
    return "daemons"


def sweep(flags: list[str], out: Path, sample: bool = False) -> dict:
    """One sweep as a fresh process; with ``sample``: CPU seconds of the driver, Ray's daemons and workers."""
    import psutil

    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "mechfact.cli", *SWEEP, *flags, "--out", str(out)], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cpu: dict[int, tuple[str, float]] = {}
    driver = [0.0]
    if sample:
        root = psutil.Process(proc.pid)

        def watch():
            while proc.poll() is None:
                try:
                    t = root.cpu_times()
                    driver[0] = t.user + t.system
                    for c in root.children(recursive=True):
                        try:
                            ct = c.cpu_times()
                            cpu[c.pid] = (cpu.get(c.pid, (None, 0))[0] or _kind(c), ct.user + ct.system)
                        except psutil.Error:
                            pass
                except psutil.Error:
                    break
                time.sleep(0.2)

        th = threading.Thread(target=watch, daemon=True)
        th.start()
    rc = proc.wait()
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"mechfact {' '.join(SWEEP + flags)} failed (exit {rc})")
    res = {"wall_s": wall}
    if sample:
        th.join()
        for kind in ("daemons", "workers"):
            res[f"{kind}_cpu_s"] = sum(s for k, s in cpu.values() if k == kind)
        res["driver_cpu_s"] = driver[0]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the figures here")
    a = ap.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the start")
    fixed = [fixed_cost(a.workers) for _ in range(a.repeats + 1)]
    print(f"Ray fixed cost per command ({a.workers} workers): first start in this benchmark "
          f"{fixed[0]['total_s']:.1f} s (start + first jobs {fixed[0]['start_and_first_jobs_s']:.1f} s, shutdown "
          f"{fixed[0]['shutdown_s']:.1f} s); later starts {statistics.median(f['total_s'] for f in fixed[1:]):.1f} s "
          f"(start + first jobs {statistics.median(f['start_and_first_jobs_s'] for f in fixed[1:]):.1f} s, "
          f"shutdown {statistics.median(f['shutdown_s'] for f in fixed[1:]):.1f} s)")
    settings = {"local, default threads": [], "local, --threads 1": ["--threads", "1"],
                f"ray, --workers {a.workers}": ["--executor", "ray", "--workers", str(a.workers)]}
    times: dict[str, list[float]] = {k: [] for k in settings}
    shares = []
    with tempfile.TemporaryDirectory() as tmp:
        results = set()
        for r in range(a.repeats):
            for i, (name, flags) in enumerate(settings.items()):
                out = Path(tmp) / f"{r}_{i}"
                res = sweep(flags, out, sample=name.startswith("ray"))
                times[name].append(res["wall_s"])
                if name.startswith("ray"):
                    shares.append(res)
                results.add((out / "result.json").read_bytes())
    base = statistics.median(times["local, default threads"])
    print(f"\nsweep: mechfact {' '.join(SWEEP)} ({a.repeats} runs each, median)")
    print("| setting | wall time | speed-up over the default local run |\n| --- | --- | --- |")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.1f} s | {base / med:.2f}x |")
    print(f"result.json identical in every run: {len(results) == 1}")
    med = {k: statistics.median(s[k] / s["wall_s"] for s in shares)
           for k in ("driver_cpu_s", "daemons_cpu_s", "workers_cpu_s")}
    print(f"\nduring the Ray sweep, in cores (CPU seconds / wall seconds): driver {med['driver_cpu_s']:.2f}, "
          f"Ray daemons {med['daemons_cpu_s']:.2f}, workers {med['workers_cpu_s']:.2f}")
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"fixed": fixed, "times": times, "ray_cpu": shares,
                                            "identical": len(results) == 1}, indent=2))


if __name__ == "__main__":
    main()
