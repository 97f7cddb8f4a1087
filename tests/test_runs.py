import json

import pytest

from mechfact.runs import RunDir, write_json_atomic


def test_config_written_first_and_checked_on_resume(tmp_path):
    RunDir(tmp_path, {"a": 1, "b": {"c": 2}}, kind="k", seed=0, device="cpu")
    assert json.loads((tmp_path / "config.json").read_text()) == {"kind": "k", "config": {"a": 1, "b": {"c": 2}},
                                                                   "seed": 0}
    RunDir(tmp_path, {"a": 1, "b": {"c": 2}}, kind="k", seed=0, device="cpu")  # same config: resumes
    RunDir(tmp_path, {"a": 1, "b": {"c": 2, "new_option": 0}}, kind="k", seed=0, device="cpu")  # added option
    with pytest.raises(ValueError, match=r"different config.*differs in: config.a"):
        RunDir(tmp_path, {"a": 2, "b": {"c": 2}}, kind="k", seed=0, device="cpu")


def test_atomic_write_leaves_no_partial_file(tmp_path):
    target = tmp_path / "r.json"
    write_json_atomic(target, {"x": 1})
    with pytest.raises(TypeError):
        write_json_atomic(target, {"x": object()})  # not serialisable: fails mid-write
    assert json.loads(target.read_text()) == {"x": 1}  # old content intact
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temp file left
