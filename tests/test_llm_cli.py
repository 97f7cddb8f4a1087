"""``mechfact llm probe|lre``: end to end on a tiny model, and bad input => exit 2 with one line."""

import json

import pytest

from llm_tiny import build_model, write_relations
from mechfact.cli import main


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("llm_cli")
    return {"model": str(build_model("llama", root / "llama")), "relations": str(write_relations(root / "rels")),
            "root": root}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHFACT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _bad_relation(tmp_path, name, data):
    path = tmp_path / f"{name}.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


GOOD = {"name": "r", "prompt_templates": ["{} is in"], "samples": [{"subject": "a", "object": "b"}]}
BAD_RELATIONS = [
    ("not_format", {"relation": "r", "facts": []}, "not in the relation format"),
    ("not_json", "{name: r", "not valid JSON"),
    ("no_brace", {**GOOD, "prompt_templates": ["the capital is"]}, "must contain exactly one '{}'"),
    ("no_samples", {**GOOD, "samples": []}, "relation has no samples"),
]


@pytest.mark.parametrize("cmd", ["probe", "lre"])
@pytest.mark.parametrize("name,data,needle", BAD_RELATIONS)
def test_bad_relation_file_exits_2(cmd, name, data, needle, env, tmp_path, capsys):
    path = _bad_relation(tmp_path, name, data)
    assert main(["llm", cmd, "--model", env["model"], "--relations", path, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and path in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv,needle", [
    (["llm", "probe", "--model", "no-such-org/no-such-model"], "not in the local Hugging Face cache"),
    (["llm", "lre", "--model", "no-such-org/no-such-model"], "not in the local Hugging Face cache"),
    (["llm", "probe", "--model", "/no/such/folder"], "--model /no/such/folder: no such run directory or model file"),
    (["llm", "probe", "--model", "{model}", "--layers", "0,3"], "--layers 3: out of range"),
    (["llm", "probe", "--model", "{model}", "--layers", "x"], "--layers x"),
    (["llm", "lre", "--model", "{model}", "--layer", "7"], "--layer 7: out of range"),
    (["llm", "lre", "--model", "{model}", "--layer", "2"], "below the last layer"),
    (["llm", "lre", "--model", "{model}", "--layers", "0,2"], "--layers 2: must be below the last layer"),
    (["llm", "lre", "--model", "{model}", "--layers", "all"], "--layers all: the LRE sweeps listed layers"),
    (["llm", "lre", "--model", "{model}", "--layers", "0,1", "--layer", "1"], "give one of them"),
    (["llm", "probe", "--model", "{model}", "--relations", "/no/such/rels"], "no such file or folder"),
    (["llm", "probe", "--model", "{model}", "--relation-names", "nope"], "--relation-names nope"),
    (["llm", "probe", "--model", "{model}", "--template", "5"], "--template 5"),
    (["llm", "probe", "--dtype", "int8"], "--dtype"),
])
def test_bad_input_exits_2_with_one_line(argv, needle, env, tmp_path, capsys):
    argv = [a.replace("{model}", env["model"]) for a in argv]
    if "--relations" not in argv:
        argv += ["--relations", env["relations"]]
    assert main(argv + ["--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err, err


def test_cli_probe_and_lre_end_to_end(env, tmp_path, one_thread):
    out = tmp_path / "probe"
    assert main(["llm", "probe", "--model", env["model"], "--relations", env["relations"], "--layers", "all",
                 "--k-shot", "2", "--splits", "1", "--out", str(out), "--quiet"]) == 0
    res = json.loads((out / "result.json").read_text())
    assert {tuple(sorted(r)) for r in res["relations"]} >= set()
    assert all({"relation", "n_samples", "n_known"} <= set(r) for r in res["relations"])
    assert all({"layer", "relation", "readout_accuracy", "chance"} <= set(r) for r in res["per_layer"])
    assert len(res["per_layer"]) == 2 * 3
    out = tmp_path / "lre"
    assert main(["llm", "lre", "--model", env["model"], "--relations", env["relations"], "--layer", "1",
                 "--n-train", "2", "--facts", "all", "--rank", "8", "--out", str(out), "--quiet"]) == 0
    res = json.loads((out / "result.json").read_text())
    assert all({"relation", "n_known", "n_test", "faithfulness", "causality"} <= set(r) for r in res["per_relation"])


def test_probe_lre_is_llm_lre(env, tmp_path, one_thread):
    """`mechfact probe lre` runs `mechfact llm lre`: the same options give the same run folder's numbers."""
    common = ["--model", env["model"], "--relations", env["relations"], "--relation-names", "tiny_colour", "--layer",
              "1", "--trials", "2", "--ranks", "4,8", "--quiet"]
    assert main(["llm", "lre", *common, "--out", str(tmp_path / "llm")]) == 0
    assert main(["probe", "lre", *common, "--out", str(tmp_path / "probe")]) == 0
    a, b = (json.loads((tmp_path / d / "result.json").read_text()) for d in ("llm", "probe"))
    assert a["per_relation"] and a["per_relation"] == b["per_relation"]


def test_help(capsys):
    for argv in (["llm", "--help"], ["llm", "probe", "--help"], ["llm", "lre", "--help"]):
        assert main(argv) == 0
        assert "usage:" in capsys.readouterr().out


def test_bfloat16_probe_and_lre_run(env, tmp_path, one_thread):
    out = tmp_path / "bf16"
    assert main(["llm", "probe", "--model", env["model"], "--relations", env["relations"], "--relation-names",
                 "tiny_colour", "--layers", "1", "--dtype", "bfloat16", "--splits", "1", "--out", str(out),
                 "--quiet"]) == 0
    assert json.loads((out / "config.json").read_text())["config"]["dtype"] == "bfloat16"
    assert main(["llm", "lre", "--model", env["model"], "--relations", env["relations"], "--relation-names",
                 "tiny_colour", "--layer", "1", "--dtype", "bfloat16", "--n-train", "2", "--facts", "all",
                 "--rank", "4", "--out", str(tmp_path / "bf16_lre"), "--quiet"]) == 0


def test_probe_readout_on_a_pretrained_folder_matches_llm_probe(env, tmp_path, one_thread):
    """`mechfact probe readout --model <HF folder> --relations <file>` runs the same readout as `mechfact llm probe`."""
    common = ["--model", env["model"], "--relations", env["relations"], "--k-shot", "2", "--layers", "0,2",
              "--splits", "2", "--quiet"]
    assert main(["llm", "probe", *common, "--out", str(tmp_path / "llm")]) == 0
    assert main(["probe", "readout", *common, "--out", str(tmp_path / "probe")]) == 0
    a, b = (json.loads((tmp_path / d / "result.json").read_text()) for d in ("llm", "probe"))
    assert a["per_layer"] and a["per_layer"] == b["per_layer"]
    assert a["relations"] == b["relations"]
    assert json.loads((tmp_path / "probe" / "config.json").read_text())["kind"] == "probe.readout"


@pytest.mark.parametrize("probe,keys", [("intervene", ["per_relation", "relation_swaps", "site"]),
                                        ("scores", ["z_target_mean", "spectra", "gate_fraction"])])
def test_probe_intervene_and_scores_take_a_pretrained_folder(env, tmp_path, probe, keys, one_thread):
    out = tmp_path / probe
    assert main(["probe", probe, "--model", env["model"], "--relations", env["relations"], "--k-shot", "2",
                 "--layer", "1", "--out", str(out), "--quiet"]) == 0
    res = json.loads((out / "result.json").read_text())
    assert all(k in res for k in keys)
    if probe == "intervene":
        assert res["site"] == "blocks.1.mlp.hook_post" and res["relation_swaps"] == []  # prompts have no relation token
        assert {r["relation"] for r in res["per_relation"]} == {0, 1}
    else:
        assert len(res["gate_fraction"]) == 2  # one row per relation
    assert list(out.glob("fig_*.png"))


@pytest.mark.parametrize("argv,needle", [
    (["probe", "swap", "--model", "{model}"], "needs a synthetic fact model"),
    (["probe", "readout", "--model", "/no/such/run"], "no such run directory"),
    (["probe", "readout", "--model", "{root}"], "neither a fact-model run directory"),
])
def test_probe_commands_name_what_a_model_path_is(argv, needle, env, tmp_path, capsys):
    argv = [a.replace("{model}", env["model"]).replace("{root}", str(env["root"])) for a in argv]
    assert main(argv + ["--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err, err
