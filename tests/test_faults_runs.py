"""The run-directory and system fault cases (``faults_runs.CASES``) in-process, plus the faults that need real
processes: SIGKILL at random points of long commands, and concurrent starts on one --out."""

from __future__ import annotations

import pytest

import faults_runs
from faults_common import assert_clean_exit, assets, paths_for, run_in_process


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return assets(tmp_path_factory.mktemp("assets"))


@pytest.mark.parametrize("case", faults_runs.CASES, ids=[c.name for c in faults_runs.CASES])
def test_case(case, shared, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    paths = paths_for(tmp_path / "case", shared)
    rc, err = run_in_process(case, paths, monkeypatch, capsys)
    assert_clean_exit(case, rc, err)
    if case.check:
        case.check(paths)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["memory sweep", "memory capacity", "facts train", "llm probe", "llm lre"])
def test_sigkill_at_random_points_then_rerun_gives_the_uninterrupted_result(name, shared, tmp_path):
    """Kill -9 at two random moments of the run (seeded), rerun with the same --out: result.json is byte-identical
    to an uninterrupted run's."""
    kills, identical = faults_runs.sigkill_scenario(faults_runs.long_commands(shared)[name], tmp_path, seed=name)
    assert kills >= 1, "the run finished before any kill: nothing was tested"
    assert identical


@pytest.mark.slow
def test_concurrent_starts_on_one_out_never_corrupt_it(tmp_path):
    """Two sweeps with different --method started at once on a fresh --out (5 trials): one is refused in one
    line, and config.json, result.json and every point agree on one method."""
    for trial in range(5):
        codes, err, consistent = faults_runs.concurrent_scenario(tmp_path / f"t{trial}")
        assert codes == [0, 2], (codes, err)
        assert len(err.splitlines()) == 1 and "Traceback" not in err
        assert "in use by another mechfact process" in err or "different config" in err, err
        assert consistent
