"""`mechfact probe ...` on a fact run directory; bad input exits 2 with one line."""

import json

import pytest

from mechfact.cli import main
from mechfact.facts import FactWorld, build_single_hop
from mechfact.facts.runio import save_fact_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    world = FactWorld(64, 2, seed=0)
    return str(save_fact_run(tmp_path_factory.mktemp("cons"), build_single_hop(world, 20), world))


@pytest.mark.parametrize("probe,extra,keys", [
    ("superposition", [], ["r2_train", "r2_heldout", "control_r2_heldout"]),
    ("readout", ["--sites", "hook_embed@subject"], ["per_relation"]),
    ("intervene", ["--relations", "1"], ["per_relation"]),
    ("swap", ["--steps", "4"], ["zero_shot_accuracy", "retrained_accuracy", "control_relearn_accuracy"]),
    ("scores", [], ["z_target_mean", "evt_sqrt_2lnn", "spectra"]),
])
def test_probe_commands_write_runs(run_dir, tmp_path, probe, extra, keys, one_thread):
    out = tmp_path / probe
    assert main(["probe", probe, "--model", run_dir, "--out", str(out), "--quiet", *extra]) == 0
    res = json.loads((out / "result.json").read_text())
    assert all(k in res for k in keys)
    assert (out / "config.json").is_file() and (out / "meta.json").is_file()
    assert list(out.glob("fig_*.png"))
    if probe == "readout":
        assert set(res["per_relation"][0]) >= {"relation", "site", "accuracy", "control_accuracy", "chance"}
        assert min(r["accuracy"] for r in res["per_relation"]) >= 0.95
    if probe == "intervene":
        row = res["per_relation"][0]
        assert set(row) >= {"relation", "ablated_units", "accuracy_on_relation", "accuracy_on_others",
                            "random_units_accuracy_on_relation"}
        assert row["accuracy_on_relation"] <= 0.1 and row["accuracy_on_others"] >= 0.9
        assert row["intervention"]["kind"] == "zero"
    if probe == "swap":
        assert res["zero_shot_accuracy"] >= 0.95


@pytest.mark.parametrize("argv,msg", [
    (["superposition", "--model", "/nonexistent/run"], "no such run directory"),
    (["readout", "--sites", "blocks.0.hook_bogus@last"], "unknown hook site"),
    (["intervene", "--relations", "9"], "relation 9 is not in the queries"),
    (["readout", "--heldout", "1.5"], "--heldout"),
    (["readout", "--relations", "a,b"], "comma-separated integers"),
    (["superposition", "--layers", "0,2"], "--layers apply to a pretrained --model"),
    (["superposition", "--prompt", "words", "--relations", "r.json"], "--prompt, --relations apply to a pretrained"),
])
def test_bad_input_exits_2(run_dir, tmp_path, capsys, argv, msg):
    if "--model" not in argv:
        argv = [argv[0], "--model", run_dir, *argv[1:]]
    assert main(["probe", *argv, "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1
