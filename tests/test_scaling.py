"""Every core, a cluster, big models: the Ray executor gives the local executor's result.json byte for byte,
reports a failing job in one line, resumes after its driver is killed; device maps load a model spread over
devices (disk offload included) with the same numbers; flags are checked before anything runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mechfact.cli import main
from mechfact.executor import Job, LocalExecutor, RayExecutor, make_executor

ray = pytest.importorskip("ray")

# small, but more jobs than workers and of unequal cost (largest-first scheduling is exercised)
SWEEP = ["memory", "sweep", "--d", "16", "24", "--points", "4", "--seeds", "2", "--steps", "300", "--quiet"]
CAPACITY = ["memory", "capacity", "--d", "12", "16", "--seeds", "2", "--steps", "300", "--rel-tol", "0.05", "--quiet"]
FACTS_CAPACITY = ["facts", "capacity", "--subjects", "16", "--relations", "2", "--attributes", "4", "--outputs",
                  "attributes", "--grid", "2", "4", "8", "--steps", "150", "--seeds", "2", "--quiet"]
MULTIHOP = ["facts", "multihop", "--subjects", "8", "--relations", "2", "--d", "8", "--mlp-width", "16",
            "--hops", "1", "2", "--steps", "100", "--quiet"]


def _cli(argv: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "TQDM_DISABLE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run([sys.executable, "-m", "mechfact.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _same_results(a: Path, b: Path) -> None:
    assert (a / "result.json").read_bytes() == (b / "result.json").read_bytes()
    assert (a / "config.json").read_bytes() == (b / "config.json").read_bytes()


@pytest.mark.slow  # starts Ray workers: tens of seconds
@pytest.mark.parametrize("argv", [SWEEP, CAPACITY, MULTIHOP, FACTS_CAPACITY],
                         ids=["memory-sweep", "memory-capacity", "facts-multihop", "facts-capacity"])
def test_ray_gives_the_local_result_byte_for_byte(argv, tmp_path):
    """Same config and seed: --executor ray --workers 2 writes the same result.json as the local executor
    (one thread, as each Ray task has), whatever order the jobs finished in (capacity: the memo of every
    bisection step included)."""
    local = _cli([*argv, "--threads", "1", "--out", str(tmp_path / "local")])
    assert local.returncode == 0, local.stderr
    rayed = _cli([*argv, "--executor", "ray", "--workers", "2", "--out", str(tmp_path / "ray")])
    assert rayed.returncode == 0, rayed.stderr
    _same_results(tmp_path / "local", tmp_path / "ray")
    result = json.loads((tmp_path / "ray" / "result.json").read_text())
    assert any(result.get(k) for k in ("points", "capacity", "thresholds")), result
    assert not (tmp_path / "ray" / "evaluations").exists()  # the searches' spill files go once they finish


@pytest.mark.slow  # starts Ray workers: tens of seconds
def test_a_failing_ray_job_is_reported_in_one_line(tmp_path):
    """A job that raises (training diverges) ends the command with exit 2 and one line naming the job."""
    out = tmp_path / "o"
    r = _cli([*MULTIHOP, "--lr", "1e6", "--executor", "ray", "--workers", "2", "--out", str(out)])
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("mechfact:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "job hops=" in lines[0] and "training diverged" in lines[0], lines[0]


@pytest.mark.slow
def test_a_killed_ray_driver_resumes(tmp_path):
    """SIGKILL the driver once the first result is on disk: the rerun skips finished jobs and ends with the
    local executor's result.json."""
    argv = ["memory", "sweep", "--d", "24", "32", "--points", "6", "--seeds", "2", "--steps", "800", "--quiet"]
    out = tmp_path / "ray"
    env = {**os.environ, "TQDM_DISABLE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "mechfact.cli", *argv, "--executor", "ray", "--workers", "2",
                             "--out", str(out)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while not (out / "result.json").exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        killed_mid_run = proc.poll() is None
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    first = json.loads((out / "result.json").read_text())["points"]
    assert first, "nothing was written before the kill"
    r = _cli([*argv, "--executor", "ray", "--workers", "2", "--out", str(out)])
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "meta.json").read_text())
    if killed_mid_run:
        assert meta["n_jobs_run"] < 12, meta  # finished jobs were skipped
    local = _cli([*argv, "--threads", "1", "--out", str(tmp_path / "local")])
    assert local.returncode == 0, local.stderr
    _same_results(tmp_path / "local", out)


@pytest.mark.slow  # starts Ray workers: tens of seconds
def test_ray_executor_hands_over_every_finished_job_before_the_error():
    """In-process API: the failing job is named, and every other job's result still reaches on_result."""
    ex = RayExecutor(workers=2, progress=False)
    got = {}
    # lambdas travel by value (a function of this test module could not be imported by the Ray workers)
    jobs = [Job(f"ok{i}", (lambda i=i: i * i), cost=1.0) for i in range(5)] + [Job("bad", lambda: int("x7"), cost=0.5)]
    try:
        with pytest.raises(ValueError, match=r"job bad: ValueError: invalid literal for int\(\) with base 10: 'x7'"):
            ex.map(jobs, lambda job, value: got.__setitem__(job.key, value))
    finally:
        ex.close()
    assert got == {f"ok{i}": i * i for i in range(5)}
    assert ex.workers_used == 2 and LocalExecutor().workers_used == 1  # what a run's meta.json records as workers


@pytest.mark.slow  # starts Ray workers: tens of seconds
def test_local_ray_workers_get_one_thread_and_the_driver_keeps_its_environment(monkeypatch):
    """The thread settings reach the workers through the local runtime's environment, and the driver's own
    environment is as it was before the start."""
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    before = dict(os.environ)
    ex = RayExecutor(workers=1, progress=False)
    got = {}

    def probe():
        import os as _os

        import torch as _torch

        return {k: _os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY",
                                                "TQDM_DISABLE")} | {"torch": _torch.get_num_threads()}
    try:
        ex.map([Job("env", probe)], lambda job, value: got.update(value))
        assert dict(os.environ) == before
    finally:
        ex.close()
    assert got == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "TQDM_DISABLE": "1",
                   "torch": 1}


@pytest.mark.parametrize("kwargs,needle", [
    (dict(kind="dask"), "--executor 'dask': allowed values are local, ray"),
    (dict(kind="ray", workers=0), "--workers 0: must be a whole number from 1"),
    (dict(kind="local", workers=2), "--workers 2: the local executor runs one job at a time; add --executor ray"),
    (dict(kind="local", address="auto"), "--ray-address needs --executor ray"),
    (dict(kind="ray", address=" "), "--ray-address '': give 'auto' or HOST:PORT"),
])
def test_executor_flags_are_checked(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        make_executor(**kwargs)


def test_bad_executor_flags_exit_2_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "o"
    assert main([*SWEEP, "--workers", "3", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--workers 3" in err and "--executor ray" in err, err
    assert not (out / "config.json").exists()


def test_local_executor_runs_in_order():
    seen = []
    LocalExecutor(progress=False).map([Job(str(i), lambda i=i: i) for i in range(3)], lambda j, v: seen.append(v))
    assert seen == [0, 1, 2]


def test_training_checkpoints_are_written_only_where_the_jobs_see_this_machines_folders():
    """A job run by this process or by a Ray runtime it starts can write a checkpoint into the run folder; a job
    on a cluster joined with --ray-address may run on a machine without that path, so it gets none."""
    from mechfact.executor import on_this_machine

    assert on_this_machine(None) and on_this_machine(LocalExecutor(progress=False))
    assert on_this_machine(RayExecutor(workers=1, progress=False))  # not started: nothing to close
    assert not on_this_machine(RayExecutor(address="10.0.0.1:6379", progress=False))


# ---- device maps: a model spread over devices (on CPU here: memory and disk) -----------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from llm_tiny import build_model, write_relations

    root = tmp_path_factory.mktemp("devmap")
    return {"model": str(build_model("llama", root / "llama")), "relations": str(write_relations(root / "rels"))}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHFACT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _half_on_disk(model) -> dict:
    """A device map with the embedding and head in memory and the upper half of the layers on disk."""
    from mechfact.llm.models.loading import load_model

    lm = load_model(model)
    names = [n for n, _ in lm.bridge.original_model.named_modules() if n.count(".") == 2 and ".layers." in n]
    m = {n: ("disk" if i >= len(names) // 2 else "cpu") for i, n in enumerate(names)}
    for n, _ in lm.bridge.original_model.model.named_children():
        if n != "layers":
            m[f"model.{n}"] = "cpu"
    m["lm_head"] = "cpu"
    return m


def test_device_map_loads_the_same_model(tiny, tmp_path, one_thread):
    """device_map='auto' and a map with half the layers offloaded to disk give the plain load's logits and
    hidden states exactly; the offloaded layers hold no weights in memory (meta tensors)."""
    import torch

    from mechfact.llm.models.loading import load_model

    plain = load_model(tiny["model"])
    toks = plain.tokenizer(["zorb has the colour", "The capital of Zorbia is"], return_tensors="pt",
                           padding=True).input_ids
    ref_logits, ref_cache = plain.run_with_cache(toks)
    dmap = _half_on_disk(tiny["model"])
    assert "disk" in dmap.values() and "cpu" in dmap.values()
    for kw in (dict(device_map="auto"), dict(device_map=dmap, offload_folder=str(tmp_path / "offload"))):
        lm = load_model(tiny["model"], **kw)
        assert lm.device == torch.device("cpu")
        logits, cache = lm.run_with_cache(toks)
        assert torch.equal(logits, ref_logits)
        last = f"blocks.{lm.n_layers - 1}.hook_resid_post"
        assert torch.equal(cache[last], ref_cache[last])
        if kw["device_map"] != "auto":
            meta = [n for n, p in lm.bridge.original_model.named_parameters() if p.device.type == "meta"]
            assert meta and all(".layers." in n for n in meta), meta[:5]


def test_cli_device_map_gives_the_same_result(tiny, tmp_path, one_thread):
    common = ["llm", "probe", "--model", tiny["model"], "--relations", tiny["relations"], "--layers", "0,2",
              "--k-shot", "2", "--splits", "1", "--quiet", "--no-state-cache"]
    assert main([*common, "--out", str(tmp_path / "plain")]) == 0
    dmap = tmp_path / "map.json"
    dmap.write_text(json.dumps(_half_on_disk(tiny["model"])))
    assert main([*common, "--device-map", str(dmap), "--out", str(tmp_path / "mapped")]) == 0
    a, b = (json.loads((tmp_path / d / "result.json").read_text()) for d in ("plain", "mapped"))
    assert a["per_layer"] == b["per_layer"] and a["relations"] == b["relations"]


@pytest.mark.parametrize("value,needle", [
    ("everywhere", "--device-map 'everywhere': allowed values are auto, balanced, balanced_low_0, sequential"),
    ("{missing}.json", "--device-map {missing}.json: not a readable JSON file"),
    ("{list}.json", "the file must hold one JSON object of module name -> device"),
])
def test_bad_device_map_exits_2(value, needle, tiny, tmp_path, capsys):
    (tmp_path / "list.json").write_text("[1, 2]")
    value = value.replace("{missing}", str(tmp_path / "nope")).replace("{list}", str(tmp_path / "list"))
    needle = needle.replace("{missing}", str(tmp_path / "nope"))
    assert main(["llm", "probe", "--model", tiny["model"], "--relations", tiny["relations"], "--device-map", value,
                 "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


@pytest.mark.slow  # starts Ray workers: tens of seconds
@pytest.mark.parametrize("command", ["lre", "probe"])
def test_llm_relations_on_ray_equal_the_local_run(command, tmp_path):
    """`llm lre|probe --executor ray`: one task per relation, each worker loading the model itself; the driver
    writes the local run's result.json byte for byte (rows in relation order, whichever finished first)."""
    from llm_tiny import build_model, write_relations

    model, rels = build_model("llama", tmp_path / "llama"), write_relations(tmp_path / "rels")
    argv = ["llm", command, "--model", str(model), "--relations", str(rels), "--device", "cpu", "--quiet"]
    argv += (["--layer", "1", "--n-train", "2", "--facts", "all", "--rank", "8", "--trials", "2"] if command == "lre"
             else ["--layers", "all", "--k-shot", "2", "--splits", "1"])
    env = {**os.environ, "TQDM_DISABLE": "1", "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}
    for name, extra in (("local", ["--threads", "1"]), ("ray", ["--executor", "ray", "--workers", "2"])):
        r = subprocess.run([sys.executable, "-m", "mechfact.cli", *argv, *extra, "--out", str(tmp_path / name)],
                           capture_output=True, text=True, timeout=300,
                           env={**env, "MECHFACT_CACHE": str(tmp_path / f"cache_{name}")})  # each computes its states
        assert r.returncode == 0, r.stderr
    _same_results(tmp_path / "local", tmp_path / "ray")
    result = json.loads((tmp_path / "ray" / "result.json").read_text())
    rows = result["per_relation"] if command == "lre" else result["relations"]
    assert [x["relation"] for x in rows] == ["tiny_capital", "tiny_colour"]
    if command == "lre":
        assert all(x["faithfulness"] is not None for x in rows)
    else:
        assert len(result["per_layer"]) == 2 * 3 and result["best_layers"]


@pytest.mark.slow
def test_llm_trace_on_ray_equals_the_local_run(tmp_path):
    """`llm trace --executor ray`: the screening and then the trace, one task per relation (every kind of it), each
    worker loading the model; the driver writes the local run's result.json byte for byte, rows in relation and
    kind order, and the same screen."""
    from llm_tiny import build_model, train_to_know, write_relations

    rels = write_relations(tmp_path / "rels")
    model = train_to_know(build_model("llama", tmp_path / "llama"), rels)
    argv = ["llm", "trace", "--model", str(model), "--relations", str(rels), "--kinds", "state", "severed_mlp",
            "--max-facts", "2", "--draws", "3", "--device", "cpu", "--quiet",
            "--known", "prefix"]  # the tiny model's first tokens are a character or two: prefixes, not spellings
    env = {**os.environ, "TQDM_DISABLE": "1", "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}
    for name, extra in (("local", ["--threads", "1"]), ("ray", ["--executor", "ray", "--workers", "2"])):
        r = subprocess.run([sys.executable, "-m", "mechfact.cli", *argv, *extra, "--out", str(tmp_path / name)],
                           capture_output=True, text=True, timeout=300,
                           env={**env, "MECHFACT_CACHE": str(tmp_path / f"cache_{name}")})
        assert r.returncode == 0, r.stderr
    _same_results(tmp_path / "local", tmp_path / "ray")
    rows = json.loads((tmp_path / "ray" / "result.json").read_text())["per_relation"]
    assert [(x["relation"], x["kind"]) for x in rows] == [(r, k) for r in ("tiny_capital", "tiny_colour")
                                                           for k in ("state", "severed_mlp")]
    assert all(x["n_traced"] == 2 and x["summary"]["n_facts"] == 2 for x in rows)
    screens = [json.loads((tmp_path / name / "screen.json").read_text()) for name in ("local", "ray")]
    assert screens[0] == screens[1] and sorted(screens[1]["top1"]) == ["tiny_capital", "tiny_colour"]


def test_llm_lre_refuses_an_in_memory_model_on_ray(tmp_path):
    from llm_tiny import build_model, write_relations

    from mechfact.llm.lre import LreConfig, run_llm_lre
    from mechfact.llm.models.loading import load_model

    lm = load_model(str(build_model("llama", tmp_path / "llama")))
    cfg = LreConfig(relations=str(write_relations(tmp_path / "rels")), layer=1, n_train=2, facts="all", rank=8)
    with pytest.raises(ValueError, match="workers load the model by name"):  # before anything is written
        run_llm_lre(cfg, tmp_path / "o", lm=lm, executor=RayExecutor(workers=1, progress=False))
    assert not (tmp_path / "o").exists()
