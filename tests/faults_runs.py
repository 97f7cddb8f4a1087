"""Fault cases of run directories and of the system: where --out points, who holds it, what is in it, and
what the system does to a run (disk full, permission, memory, interrupts). See ``faults_common.py``."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

from faults_common import Case, read, write

SWEEP = ["memory", "sweep", "--d", "8", "--points", "3", "--seeds", "2", "--steps", "200", "--threads", "1",
         "--quiet"]
FACTS = ["facts", "train", "--subjects", "16", "--relations", "2", "--d", "16", "--mlp-width", "16", "--steps", "200",
         "--eval-every", "50", "--threads", "1", "--quiet"]


def _main(argv: list[str]) -> int:
    from mechfact.cli import main

    return main(argv)


def _finished(cmd: list[str]):
    """setup: a finished run of ``cmd`` in {out}; its files are kept in {tmp}/before for the check."""
    def setup(p: dict) -> None:
        assert _main(cmd + ["--out", p["out"]]) == 0
        for f in ("config.json", "result.json"):
            write(Path(p["tmp"]) / "before" / f, (Path(p["out"]) / f).read_text())
    return setup


def _unchanged(p: dict) -> None:
    for f in ("config.json", "result.json"):
        assert (Path(p["out"]) / f).read_text() == (Path(p["tmp"]) / "before" / f).read_text(), f


def _nothing_written(p: dict) -> None:
    out = Path(p["out"])
    assert not (out / "config.json").exists() and not (out / "result.json").exists()


def _then(*steps):
    def run(p: dict) -> None:
        for s in steps:
            s(p)
    return run


def _edit(name: str, fn):
    """setup step: rewrite {out}/name with fn(text) -> text."""
    def step(p: dict) -> None:
        f = Path(p["out"]) / name
        f.write_text(fn(f.read_text()))
    return step


def _holder(p: dict) -> None:
    """setup: another process takes --out and keeps it (its pid in {tmp}/holder.pid; killed by the check)."""
    code = ("import sys, time; from mechfact.runs import RunDir; RunDir(sys.argv[1], {'x': 1}, kind='holder', "
            "seed=0, device='cpu'); print('held', flush=True); time.sleep(120)")
    child = subprocess.Popen([sys.executable, "-c", code, p["out"]], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    write(Path(p["tmp"]) / "holder.pid", str(child.pid))


def _kill_holder(p: dict) -> None:
    import signal

    os.kill(int((Path(p["tmp"]) / "holder.pid").read_text()), signal.SIGKILL)


def _fail_on_write(n: int, err: int):
    """inject: the n-th atomic file replacement of the process fails with OSError(err)."""
    def inject(mp, p: dict) -> None:
        real = os.replace
        count = {"n": 0}

        def replace(src, dst, *a, **k):
            count["n"] += 1
            if count["n"] == n:
                raise OSError(err, os.strerror(err), str(dst))
            return real(src, dst, *a, **k)
        mp.setattr(os, "replace", replace)
    return inject


def _raise_in_training(exc: BaseException):
    """inject: the first memory-training step raises ``exc``."""
    def inject(mp, p: dict) -> None:
        from mechfact.memory import experiments

        def boom(*a, **k):
            raise exc
        mp.setattr(experiments, "solve", boom)
    return inject


def _resumes_to_clean(cmd: list[str]):
    """check: files on disk are valid; rerunning (no fault) finishes with the result of an uninterrupted run."""
    def check(p: dict) -> None:
        out = Path(p["out"])
        for f in out.glob("*.json"):
            json.loads(f.read_text())  # nothing half-written
        assert _main(cmd + ["--out", p["out"]]) == 0
        clean = Path(p["tmp"]) / "clean"
        assert _main(cmd + ["--out", str(clean)]) == 0
        assert read(out / "result.json") == read(clean / "result.json")
    return check


G_DIR, G_CONTENT, G_SYS = "where --out points", "what --out holds", "what the system does"
CASES = [
    Case("--out is an existing file", SWEEP + ["--out", "{tmp}/f"], 2, "not a writable directory",
         setup=lambda p: write(Path(p["tmp"]) / "f", "x"), group=G_DIR),
    Case("--out below a file", SWEEP + ["--out", "{tmp}/f/sub"], 2, "not a writable directory",
         setup=lambda p: write(Path(p["tmp"]) / "f", "x"), group=G_DIR),
    Case("--out where nothing can be created (/proc)", SWEEP + ["--out", "/proc/mechfact_run"], 2,
         "not a writable directory", group=G_DIR),
    Case("--out is an empty string", SWEEP + ["--out", ""], 2, "--out", group=G_DIR),
    Case("rerun of a finished run, same arguments", SWEEP + ["--out", "{out}"], 0, setup=_finished(SWEEP),
         check=_unchanged, group=G_CONTENT),
    Case("rerun into a finished run with another --method", SWEEP + ["--method", "hebb", "--out", "{out}"], 2,
         "differs in: config.solver", setup=_finished(SWEEP), check=_unchanged, group=G_CONTENT),
    Case("rerun into a finished run with another --seed", SWEEP + ["--seed", "1", "--out", "{out}"], 2,
         "differs in: seed", setup=_finished(SWEEP), check=_unchanged, group=G_CONTENT),
    Case("another command into a finished run's --out", FACTS + ["--out", "{out}"], 2, "differs in:",
         setup=_finished(SWEEP), check=_unchanged, group=G_CONTENT),
    Case("--out held by another running mechfact", SWEEP + ["--out", "{out}"], 2,
         "in use by another mechfact process (pid", setup=_holder,
         check=_then(_kill_holder, _nothing_written), group=G_CONTENT),
    Case("a stale .lock left by a killed run", SWEEP + ["--out", "{out}"], 0,
         setup=lambda p: write(Path(p["out"]) / ".lock", "pid 999999 on elsewhere"), group=G_CONTENT),
    Case("result.json of another config", SWEEP + ["--out", "{out}"], 2, "written for another config",
         setup=_then(_finished(SWEEP), _edit("result.json", lambda t: t.replace('"config_sha256": "',
                                                                                 '"config_sha256": "0'))),
         group=G_CONTENT),
    Case("config.json is not JSON", SWEEP + ["--out", "{out}"], 2, "not valid JSON",
         setup=_then(_finished(SWEEP), _edit("config.json", lambda t: t[: len(t) // 2])), group=G_CONTENT),
    Case("config.json is a JSON list", SWEEP + ["--out", "{out}"], 2, "not a mechfact run config",
         setup=_then(_finished(SWEEP), _edit("config.json", lambda t: "[1, 2]")), group=G_CONTENT),
    Case("config.json is an empty object", SWEEP + ["--out", "{out}"], 2, "not a mechfact run config",
         setup=_then(_finished(SWEEP), _edit("config.json", lambda t: "{}")), group=G_CONTENT),
    Case("result.json empty", SWEEP + ["--out", "{out}"], 2, "not valid JSON",
         setup=_then(_finished(SWEEP), _edit("result.json", lambda t: "")), group=G_CONTENT),
    Case("result.json truncated", SWEEP + ["--out", "{out}"], 2, "not valid JSON",
         setup=_then(_finished(SWEEP), _edit("result.json", lambda t: t[:100])), group=G_CONTENT),
    Case("result.json is a JSON list", SWEEP + ["--out", "{out}"], 2, "expected an object",
         setup=_then(_finished(SWEEP), _edit("result.json", lambda t: "[1, 2]")), group=G_CONTENT),
    Case("result.json without its points", SWEEP + ["--out", "{out}"], 2, "key 'points' is missing",
         setup=_then(_finished(SWEEP), _edit("result.json", lambda t: "{}")), group=G_CONTENT),
    Case("result.json points without their keys", SWEEP + ["--out", "{out}"], 2, "key 'points[0].p' is missing",
         setup=_then(_finished(SWEEP), _edit("result.json", lambda t: json.dumps(
             {**json.loads(t), "points": [{"d": 16}]}))), group=G_CONTENT),
    Case("result.json deleted from a finished run", SWEEP + ["--out", "{out}"], 0,
         setup=_then(_finished(SWEEP), lambda p: (Path(p["out"]) / "result.json").unlink()),
         check=_unchanged, group=G_CONTENT),
    Case("binary garbage in result.json", SWEEP + ["--out", "{out}"], 2, "not valid JSON",
         setup=_then(_finished(SWEEP), lambda p: (Path(p["out"]) / "result.json").write_bytes(os.urandom(64))),
         group=G_CONTENT),
    Case("disk full at the first result", SWEEP + ["--out", "{out}"], 1, "no space left on the device",
         inject=_fail_on_write(2, errno.ENOSPC), check=_resumes_to_clean(SWEEP), group=G_SYS),
    Case("disk full half-way through a sweep", SWEEP + ["--out", "{out}"], 1, "no space left on the device",
         inject=_fail_on_write(4, errno.ENOSPC), check=_resumes_to_clean(SWEEP), group=G_SYS),
    Case("disk full while training a fact model", FACTS + ["--out", "{out}"], 1, "no space left on the device",
         inject=_fail_on_write(3, errno.ENOSPC), check=_resumes_to_clean(FACTS), group=G_SYS),
    Case("permission denied while writing", SWEEP + ["--out", "{out}"], 1, "permission denied",
         inject=_fail_on_write(2, errno.EACCES), check=_resumes_to_clean(SWEEP), group=G_SYS),
    Case("input/output error while writing", SWEEP + ["--out", "{out}"], 1, "rerun the same command to resume",
         inject=_fail_on_write(2, errno.EIO), check=_resumes_to_clean(SWEEP), group=G_SYS),
    Case("out of memory (MemoryError) in training", SWEEP + ["--out", "{out}"], 1, "out of memory",
         inject=_raise_in_training(MemoryError()), check=_nothing_written, group=G_SYS),
    Case("out of memory (allocator RuntimeError) in training", SWEEP + ["--out", "{out}"], 1, "out of memory",
         inject=_raise_in_training(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't "
                                                "allocate memory: you tried to allocate 80000000000 bytes.")),
         check=_nothing_written, group=G_SYS),
    Case("interrupted (Ctrl-C) in training", SWEEP + ["--out", "{out}"], 130, "interrupted",
         inject=_raise_in_training(KeyboardInterrupt()), check=_nothing_written, group=G_SYS),
    Case("--device cuda on a machine without CUDA", SWEEP + ["--device", "cuda", "--out", "{out}"], 2, "cuda",
         check=_nothing_written, group=G_SYS),
    Case("--max-memory below what the run needs", ["memory", "sweep", "--d", "512", "--max-memory", "0.01",
                                                   "--quiet", "--out", "{out}"], 2, "over the limit",
         check=_nothing_written, group=G_SYS),
    Case("--max-memory below what loading the model needs", ["llm", "probe", "--model", "{model}", "--relations",
                                                              "{relations}", "--max-memory", "0.000001", "--quiet",
                                                              "--out", "{out}"], 2,
         "(its weights in float32): needs about", check=_nothing_written, group=G_SYS),
    Case("--threads 0", SWEEP + ["--threads", "0", "--out", "{out}"], 2, "--threads 0", check=_nothing_written,
         group=G_SYS),
    Case("cache folder ($MECHFACT_CACHE) is a file", ["llm", "probe", "--model", "{model}", "--relations",
                                                       "{relations}", "--layers", "0", "--quiet", "--out", "{out}"],
         2, "MECHFACT_CACHE", env={"MECHFACT_CACHE": "{tmp}/cachefile"},
         setup=lambda p: write(Path(p["tmp"]) / "cachefile", "x"), group=G_SYS),
]


# ---- scenarios with real processes (tests/test_faults_runs.py, probes/reliability.py) ----------------------

def cli(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "mechfact.cli", *argv]


def long_commands(shared: dict) -> dict[str, list[str]]:
    """The long commands killed at random points (tiny sizes, a few seconds each)."""
    llm = ["--model", shared["model"], "--relations", shared["relations_dir"], "--k-shot", "2", "--threads", "1",
           "--quiet"]
    return {
        "memory sweep": SWEEP,
        "memory capacity": ["memory", "capacity", "--d", "8", "12", "--seeds", "2", "--steps", "200", "--threads", "1",
                            "--quiet"],
        "facts train": FACTS,
        "llm probe": ["llm", "probe", *llm, "--layers", "all", "--splits", "2", "--no-state-cache"],
        "llm lre": ["llm", "lre", *llm, "--layer", "0", "--facts", "all", "--n-train", "2", "--trials", "2",
                    "--ranks", "4,8", "--no-state-cache"],
    }


def sigkill_scenario(cmd: list[str], tmp: Path, seed: str, n_kills: int = 2) -> tuple[int, bool]:
    """Run ``cmd`` cleanly, then again killed with SIGKILL at ``n_kills`` random moments (seeded) and rerun to the
    end: (kills that hit a running process, result.json byte-identical to the clean run's)."""
    import random
    import signal
    import time

    t0 = time.time()
    subprocess.run(cli(cmd + ["--out", str(tmp / "clean")]), check=True, capture_output=True)
    wall = time.time() - t0
    rng = random.Random(seed)
    kills = 0
    for attempt in range(4):  # a loaded machine can finish before the moment drawn: draw earlier ones then
        out = tmp / f"killed{attempt}"
        for frac in sorted(rng.uniform(0.4, 0.95) / 2 ** attempt for _ in range(n_kills)):
            p = subprocess.Popen(cli(cmd + ["--out", str(out)]), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            try:
                p.wait(timeout=frac * wall)
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGKILL)
                p.wait()
                kills += 1
            for f in out.glob("*.json"):  # whatever is on disk is whole
                json.loads(f.read_text())
        if kills:
            break
    subprocess.run(cli(cmd + ["--out", str(out)]), check=True, capture_output=True)
    return kills, (out / "result.json").read_bytes() == (tmp / "clean" / "result.json").read_bytes()


def concurrent_scenario(out: Path) -> tuple[list[int], str, bool]:
    """Two sweeps with different --method started at once on one fresh --out: (sorted exit codes, the refused
    one's stderr, whether config.json, result.json and every point agree on one config)."""
    from mechfact.runs import config_sha256

    procs = [subprocess.Popen(cli(SWEEP + ["--method", m, "--out", str(out)]), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for m in ("trained", "hebb")]
    results = [(p.wait(), p.stderr.read()) for p in procs]
    err = next((e for rc, e in results if rc != 0), "").strip()
    cfg = json.loads((out / "config.json").read_text())
    res = json.loads((out / "result.json").read_text())
    consistent = (res["config_sha256"] == config_sha256(cfg)
                  and {p["method"] for p in res["points"]} == {cfg["config"]["solver"]["method"]})
    return sorted(rc for rc, _ in results), err, consistent
