"""Run Python source as a user would: a fresh process in an empty working directory, offline, one thread."""

import os
import subprocess
import sys
from pathlib import Path


def run_fresh(source: str, tmp: Path, name: str, timeout: int = 1200) -> str:
    """Runs ``source`` as ``tmp/name.py`` from the empty folder ``tmp/cwd``; asserts exit 0 and that nothing was
    written there; returns stdout."""
    script = tmp / f"{name}.py"
    script.write_text(source)
    cwd = tmp / "cwd"
    cwd.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                         env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert list(cwd.iterdir()) == [], f"{name} wrote files into the working directory"
    return out.stdout
