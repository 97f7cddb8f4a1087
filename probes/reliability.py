"""The reliability table: every fault case of the test suite, run as a real ``mechfact`` process.

    python -m probes.reliability                 # writes docs/reliability.md (about 10 minutes on 2 cores)
    python -m probes.reliability --only runs     # one case module (runs | configs | files)

Each case (``tests/faults_*.py``) is prepared in a scratch folder, run as its own process (``python -m
mechfact.cli``, or a small driver when the case injects a fault inside the process), and judged: the exit status
and the one stderr line, whether a traceback appeared, and whether finished data is intact (the case's check).
Then the faults that need several processes: SIGKILL at random moments of each long command followed by a rerun,
and two runs started at once on one --out.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
MODULES = {"runs": "faults_runs", "configs": "faults_configs", "files": "faults_files"}

DRIVER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import importlib, pytest
from mechfact.cli import main
case = importlib.import_module(sys.argv[2]).CASES[int(sys.argv[3])]
paths = json.loads(sys.argv[4])
mp = pytest.MonkeyPatch()
if case.inject:
    case.inject(mp, paths)
sys.exit(main(case.fill(paths)))
"""


def _hide(text: str, paths: dict) -> str:
    """Paths of this machine back to the case's placeholders, and a run folder's lock holder (process, machine,
    start time) to ``{pid}``, ``{host}``, ``{time}``: the table names no machine."""
    import re

    for key in sorted(paths, key=lambda k: -len(str(paths[k]))):
        text = text.replace(str(paths[key]), "{" + key + "}")
    text = re.sub(r"\(pid \d+ on [^,()]+, since [^)]+\)", "(pid {pid} on {host}, since {time})", text)
    return text.replace(str(ROOT), "<repo>").replace(str(Path.home()), "~")


def run_case(module: str, index: int, case, root: Path, shared: dict) -> dict:
    from faults_common import paths_for

    paths = paths_for(root / f"{module}_{index}", shared)
    env = {**os.environ, "PYTHONPATH": str(TESTS), **{k: v.format(**paths) for k, v in case.env.items()}}
    setup_error = None
    try:
        if case.setup:
            case.setup(paths)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        setup_error = f"setup failed: {exc}"
    cmd = [sys.executable, "-c", DRIVER, str(TESTS), module, str(index), json.dumps(paths)]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=paths["tmp"])
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("mechfact")]
    intact = "yes"
    if case.check:
        try:
            case.check(paths)
        except Exception as exc:  # noqa: BLE001
            intact = f"NO ({type(exc).__name__}: {exc})"
    else:
        intact = "—"
    ok = (p.returncode == case.exit and "Traceback" not in p.stderr and not setup_error and not intact.startswith("NO")
          and (case.exit == 0 or (len(errors) == 1 and (not case.needle or case.needle in errors[0]))))
    return {"group": case.group, "case": case.name, "command": _hide("mechfact " + " ".join(case.fill(paths)), paths),
            "exit": p.returncode, "expected": case.exit, "message": _hide(errors[0] if errors else "", paths),
            "traceback": "Traceback" in p.stderr, "intact": intact, "ok": ok, "setup_error": setup_error,
            "seconds": round(time.time() - t0, 1)}


def scenarios(root: Path, shared: dict) -> list[dict]:
    import faults_runs

    rows = []
    for name, cmd in faults_runs.long_commands(shared).items():
        tmp = root / f"kill_{name.replace(' ', '_')}"
        kills, same = faults_runs.sigkill_scenario(cmd, tmp, seed=name)
        rows.append({"group": "killed (SIGKILL) at random moments, then rerun", "case": f"{name}: {kills} kills",
                     "command": "mechfact " + _hide(" ".join(cmd), shared), "exit": "-9, then 0", "expected": "",
                     "message": "", "traceback": False, "intact": "yes: byte-identical result.json" if same else "NO",
                     "ok": same and kills >= 1})
    for trial in range(5):
        codes, err, consistent = faults_runs.concurrent_scenario(root / f"concurrent_{trial}")
        rows.append({"group": "two runs at once on one --out", "case": f"--method trained and hebb, trial {trial + 1}",
                     "command": "2 x mechfact " + " ".join(faults_runs.SWEEP) + " --method M --out {out}",
                     "exit": " and ".join(map(str, codes)), "expected": "0 and 2",
                     "message": _hide(err, {"out": str(root / f"concurrent_{trial}")}), "traceback": "Traceback" in err,
                     "intact": "yes: one config, its points only" if consistent else "NO",
                     "ok": codes == [0, 2] and consistent and "Traceback" not in err})
    return rows


def markdown(rows: list[dict], wall: float) -> str:
    n_tb = sum(r["traceback"] for r in rows)
    n_bad = sum(str(r["intact"]).startswith("NO") for r in rows)
    n_fail = sum(not r["ok"] for r in rows)
    out = ["# Reliability: what a user (or the system) does to a run", "",
           "Every case below ran as a real `mechfact` process on a scratch folder (`python -m probes.reliability`); "
           "the same cases run in CI in-process (`tests/test_faults_*.py`; the SIGKILL and concurrency scenarios in "
           "the slow tier). Exit 2: bad input or a file that is not what it should be; 1: the system refused "
           "(disk full, permission, memory) — finished work kept, rerun resumes; 130: interrupted. Placeholders: "
           "`{out}` the run folder, `{tmp}` the case's scratch folder, `{model}` a tiny random Llama folder, "
           "`{relations}` a tiny relation file.", "",
           f"**{len(rows)} cases: {n_tb} tracebacks, {n_bad} runs with damaged data, {n_fail} not as expected.** "
           f"(Whole table: {wall / 60:.1f} min.)", ""]
    group = None
    for r in rows:
        if r["group"] != group:
            group = r["group"]
            out += ["", f"## {group}", "", "| case | command | exit | message | data intact |", "|---|---|---|---|---|"]
        flag = "" if r["ok"] else " **(unexpected)**"
        msg = r["message"].replace("|", "\\|")
        cmd = r["command"].replace("|", "\\|")
        out.append(f"| {r['case']}{flag} | `{cmd}` | {r['exit']} | {msg} | {r['intact']} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=tuple(MODULES), nargs="+", default=list(MODULES))
    ap.add_argument("--no-scenarios", action="store_true", help="skip the SIGKILL and concurrency scenarios")
    ap.add_argument("--out", default=str(ROOT / "docs" / "reliability.md"))
    a = ap.parse_args(argv)
    sys.path.insert(0, str(TESTS))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from faults_common import assets

    from mechfact.runs import write_json_atomic

    t0 = time.time()
    rows = []
    with tempfile.TemporaryDirectory(prefix="mechfact_faults_") as tmp:
        root = Path(tmp)
        shared = assets(root / "assets")
        for key in a.only:
            mod = importlib.import_module(MODULES[key])
            for i, case in enumerate(mod.CASES):
                r = run_case(MODULES[key], i, case, root / "cases", shared)
                print(f"{'ok ' if r['ok'] else 'BAD'} {r['exit']:>3} {r['case']}: {r['message'][:100]}", flush=True)
                rows.append(r)
        if not a.no_scenarios:
            for r in scenarios(root / "scenarios", shared):
                print(f"{'ok ' if r['ok'] else 'BAD'} {r['case']}: {r['intact']}", flush=True)
                rows.append(r)
    Path(a.out).write_text(markdown(rows, time.time() - t0))
    write_json_atomic(Path(a.out).with_suffix(".json"), rows)
    print(f"{len(rows)} cases, {sum(not r['ok'] for r in rows)} not as expected; table in {a.out}")


if __name__ == "__main__":
    main()
