import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_linear_memory_example_runs_and_reports_numbers():
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "linear_memory.py")], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    acc = dict(re.findall(r"^(Hebb|trained) accuracy\s+([\d.]+)", out.stdout, re.M))
    assert float(acc["trained"]) == 1.0 and float(acc["Hebb"]) < 1.0
    assert "perfect recall achievable = True" in out.stdout
