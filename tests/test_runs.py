import json

import pytest

from mechfact.runs import CorruptFile, RunDir, release, write_json_atomic


def test_config_written_with_the_first_file_and_checked_on_resume(tmp_path):
    run = RunDir(tmp_path, {"a": 1, "b": {"c": 2}}, kind="k", seed=0, device="cpu")
    assert not (tmp_path / "config.json").exists()  # nothing written before the run writes something
    run.write_result({"points": []})
    assert json.loads((tmp_path / "config.json").read_text()) == {"kind": "k", "config": {"a": 1, "b": {"c": 2}},
                                                                   "seed": 0}
    release(tmp_path)
    RunDir(tmp_path, {"a": 1, "b": {"c": 2}}, kind="k", seed=0, device="cpu")  # same config: resumes
    RunDir(tmp_path, {"a": 1, "b": {"c": 2, "new_option": 0}}, kind="k", seed=0, device="cpu")  # added option
    with pytest.raises(ValueError, match=r"different config.*differs in: config.a"):
        RunDir(tmp_path, {"a": 2, "b": {"c": 2}}, kind="k", seed=0, device="cpu")
    release(tmp_path)


def test_a_run_directory_has_one_owner(tmp_path):
    """A second process on the same --out is refused naming the holder; the lock dies with its holder (SIGKILL)."""
    import subprocess
    import sys

    code = ("import sys, time; from mechfact.runs import RunDir; RunDir(sys.argv[1], {'a': 1}, kind='k', seed=0, "
            "device='cpu'); print('held', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=rf"in use by another mechfact process \(pid {child.pid} on "):
            RunDir(tmp_path, {"a": 1}, kind="k", seed=0, device="cpu")
    finally:
        child.kill()
        child.wait()
    RunDir(tmp_path, {"a": 1}, kind="k", seed=0, device="cpu").write_result({"x": 1})  # free again
    release(tmp_path)


@pytest.mark.parametrize("content,needle", [
    ("{\"points\": [", "not valid JSON"),
    ("[1, 2]", "the top level is a JSON list, expected an object"),
    ("{\"other\": 1}", "key 'points' is missing"),
    ("{\"points\": {\"d\": 16}}", "points is a JSON object, expected a list"),
    ("{\"points\": [], \"config_sha256\": \"0\"}", "written for another config"),
])
def test_a_bad_result_json_is_refused_naming_the_file(tmp_path, content, needle):
    run = RunDir(tmp_path, {"a": 1}, kind="k", seed=0, device="cpu")
    run.write_result({"points": []})
    assert run.read_result({"points": [1]}) == {"points": [], "config_sha256": run.sha256}
    (tmp_path / "result.json").write_text(content)
    with pytest.raises(CorruptFile, match=needle) as e:
        run.read_result({"points": []})
    assert str(tmp_path / "result.json") in str(e.value)
    release(tmp_path)


def test_atomic_write_leaves_no_partial_file(tmp_path):
    target = tmp_path / "r.json"
    write_json_atomic(target, {"x": 1})
    with pytest.raises(TypeError):
        write_json_atomic(target, {"x": object()})  # not serialisable: fails mid-write
    assert json.loads(target.read_text()) == {"x": 1}  # old content intact
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temp file left


def test_result_items_are_checked_against_their_template(tmp_path):
    run = RunDir(tmp_path, {"a": 1}, kind="k", seed=0, device="cpu")
    run.write_result({"points": [{"d": 8, "p": 3}]})
    shape = {"points": [{"d": 0, "p": 0}]}
    assert run.read_result({"points": []}, shape)["points"] == [{"d": 8, "p": 3}]
    run.write_result({"points": [{"d": 16}]})
    with pytest.raises(CorruptFile, match=r"key 'points\[0\].p' is missing"):
        run.read_result({"points": []}, shape)
    run.write_result({"points": [3]})
    with pytest.raises(CorruptFile, match=r"points\[0\] is a JSON int, expected an object"):
        run.read_result({"points": []}, shape)
    release(tmp_path)


def test_a_result_with_a_config_copy_from_before_an_option_was_added_resumes(tmp_path):
    """Results that carry a copy of their config (llm trace, llm lre) keep it as the run wrote it; a new option
    with its default must not make the partial result unreadable."""
    old = {"model": "m", "config": {"a": 1}, "rows": [1]}
    run = RunDir(tmp_path, {"a": 1}, kind="k", seed=0, device="cpu")
    run.write_result(dict(old))
    release(tmp_path)
    run = RunDir(tmp_path, {"a": 1, "new_option": None}, kind="k", seed=0, device="cpu")
    got = run.read_result({"model": "", "config": {"a": 1, "new_option": None}, "rows": []})
    assert got["rows"] == [1] and got["config"] == {"a": 1}
    (tmp_path / "result.json").write_text(json.dumps({"model": "m", "config": {"a": 1}}))
    with pytest.raises(CorruptFile, match="key 'rows' is missing"):  # the rest of the shape is still checked
        run.read_result({"model": "", "config": {"a": 1}, "rows": []})
    release(tmp_path)


def test_wall_time_adds_up_over_resumes_and_reruns(tmp_path):
    """meta.json's wall_time_s is the run's whole time: an interrupted run's seconds (kept beside result.json) and
    a finished run's own figure carry into the process that resumes or re-runs it; this process's share is
    wall_time_this_process_s."""
    from mechfact.runs import ELAPSED, RunDir, read_json, release, write_json_atomic

    first = RunDir(tmp_path / "r", {"a": 1}, kind="t", seed=0, device="cpu")
    first.write_result({"x": 1})
    assert read_json(tmp_path / "r" / ELAPSED)["wall_time_s"] < 60
    release(tmp_path / "r")  # interrupted: no meta.json
    write_json_atomic(tmp_path / "r" / ELAPSED, {"wall_time_s": 100.0})  # as if it had run 100 s
    resumed = RunDir(tmp_path / "r", {"a": 1}, kind="t", seed=0, device="cpu")
    resumed.finish({"x": 2})
    meta = read_json(tmp_path / "r" / "meta.json")
    assert 100.0 <= meta["wall_time_s"] < 160 and meta["wall_time_this_process_s"] < 60
    write_json_atomic(tmp_path / "r" / ELAPSED, {"wall_time_s": 0.0})  # only meta.json's figure left
    RunDir(tmp_path / "r", {"a": 1}, kind="t", seed=0, device="cpu").finish({"x": 2})  # a finished run re-run
    assert read_json(tmp_path / "r" / "meta.json")["wall_time_s"] >= meta["wall_time_s"]
    fresh = RunDir(tmp_path / "s", {"a": 1}, kind="t", seed=0, device="cpu")
    fresh.finish({"x": 1})
    assert read_json(tmp_path / "s" / "meta.json")["wall_time_s"] < 60
