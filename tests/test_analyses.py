"""The analysis registry: one declaration gives an analysis its command, its run folder and its entry point."""

import json

import pytest

from mechfact import analyses as A
from mechfact.cli import build_parser, main


@pytest.fixture(scope="module")
def fact_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("reg") / "fact"
    assert main(["facts", "construct", "--subjects", "32", "--relations", "2", "--out", str(out), "--quiet",
                 "--threads", "1", "--device", "cpu"]) == 0
    return out


def _subparser(name):
    parser = build_parser()
    probe = next(a for a in parser._actions if getattr(a, "choices", None) and "probe" in a.choices).choices["probe"]
    return next(a for a in probe._actions if getattr(a, "choices", None) and name in a.choices).choices[name]


def test_every_registered_analysis_has_a_command_with_one_flag_per_option():
    assert {"knockout", "attribute-rate", "extraction", "attribution", "transfer", "selectivity"} <= set(A.ANALYSES)
    for name, an in A.ANALYSES.items():
        flags = {s for act in _subparser(name)._actions for s in act.option_strings}
        assert {o.flag for o in an.options} <= flags, name
        assert {"--model", "--out", "--seed", "--device"} <= flags
        takes = not an.variants or any(v.relations for v in an.variants.values())
        assert ("--relations" in flags) == takes, name  # swap runs on the fact model's own world only
    an = A.ANALYSES["attribution"]
    assert {o.name: o.kind for o in an.options}["n_draws"] == "int"
    assert {o.name: o.kind for o in an.options}["noise_factor"] == "float"
    assert {o.name: o.choices for o in an.options}["corruption"] == ("noise", "replace")
    assert "seed" not in {o.name for o in an.options} and "progress" not in {o.name for o in an.options}
    kinds = {o.name: o.kind for o in A.ANALYSES["trace"].options}
    assert kinds["exclude"] == "ints" and kinds["window"] == "int" and kinds["sever"] == "str"  # () and None


EVERY = ("readout", "superposition", "intervene", "swap", "scores", "lre", "trace", "knockout", "attribute-rate",
         "extraction", "attribution", "transfer", "selectivity")


def test_every_analysis_has_its_probe_command():
    """The 13 analyses each have `mechfact probe NAME` (the five hand-written and lre are run by
    tests/test_probes_cli.py, tests/test_llm_cli.py and tests/test_llm_superposition.py; the registered ones below)."""
    parser = build_parser()
    probe = next(a for a in parser._actions if getattr(a, "choices", None) and "probe" in a.choices).choices["probe"]
    names = next(a for a in probe._actions if getattr(a, "choices", None) and "knockout" in a.choices).choices
    assert set(names) == set(EVERY)


@pytest.mark.parametrize("name", sorted(set(EVERY) - {"readout", "superposition", "intervene", "swap", "scores",
                                                       "lre"}))
def test_every_registered_analysis_runs_from_its_command_on_a_fact_model(name, fact_run, tmp_path, one_thread):
    out = tmp_path / name
    # the default k = 50 is more than the 32 outputs; selectivity scores every fact
    extra = {"attribute-rate": ["--k", "5", "--max-facts", "8"], "selectivity": []}.get(name, ["--max-facts", "8"])
    assert main(["probe", name, "--model", str(fact_run), "--out", str(out), "--quiet", "--device", "cpu",
                 *extra]) == 0
    res = json.loads((out / "result.json").read_text())
    assert res["analysis"] == name and res["summary"]
    assert json.loads((out / "config.json").read_text())["kind"] == f"probe.{name}"


def test_the_command_writes_what_the_api_computes_and_a_finished_folder_is_not_rerun(fact_run, tmp_path,
                                                                                     monkeypatch, one_thread):
    """`mechfact probe knockout` on a fact model: result.json's summary is the direct call's; the config holds
    every option with its default; run again, the finished folder is returned without computing; another option
    on the same folder is refused, naming it."""
    import mechfact
    from mechfact.facts.runio import load_fact_run

    out = tmp_path / "ko"
    argv = ["probe", "knockout", "--model", str(fact_run), "--out", str(out), "--quiet", "--device", "cpu",
            "--max-facts", "20"]
    assert main(argv) == 0
    res = json.loads((out / "result.json").read_text())
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["kind"] == "probe.knockout" and cfg["config"]["max_facts"] == 20
    assert cfg["config"]["targets"] == ["subject", "relation", "last"] and cfg["config"]["window"] is None
    model, world = load_fact_run(fact_run)
    direct = mechfact.attention_knockout(model.eval(), world, max_facts=20, seed=0).summary(0)
    assert res["summary"] == json.loads(json.dumps(direct)) and res["summary"]["n_facts"] == 20
    assert (out / "meta.json").is_file()

    def boom(*a, **k):
        raise AssertionError("a finished run folder ran again")
    monkeypatch.setitem(A.ANALYSES, "knockout", A.Analysis("knockout", boom, "x", A.ANALYSES["knockout"].options,
                                                           True))
    assert main(argv) == 0
    monkeypatch.undo()
    assert main(argv[:-1] + ["21"]) == 2  # another --max-facts on the same folder


def test_bad_option_values_name_the_flag_and_what_is_allowed(fact_run, tmp_path, capsys):
    assert main(["probe", "knockout", "--model", str(fact_run), "--out", str(tmp_path / "a"), "--window", "two"]) == 2
    assert "--window two: expected an integer" in capsys.readouterr().err
    assert main(["probe", "attribution", "--model", str(fact_run), "--out", str(tmp_path / "b"), "--kind",
                 "heads"]) == 2
    assert "--kind heads: allowed values are state, mlp, attn" in capsys.readouterr().err
    assert main(["probe", "selectivity", "--model", str(fact_run), "--out", str(tmp_path / "c"), "--relations",
                 "1"]) == 2
    assert "a fact model runs on its own world" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown option windows; allowed: window, targets"):
        A.ANALYSES["knockout"].config(windows=3)
    with pytest.raises(ValueError, match="'knockout' is registered already"):
        A.register("knockout", A.ANALYSES["knockout"].fn, help="again")


def test_a_new_analysis_is_one_declaration(fact_run, tmp_path, monkeypatch, one_thread):
    """Registering a function gives it its options, and run() its folder, with nothing else written."""
    import torch

    def top_rate(model, source, *, scale: float = 1.0, seed: int = 0):
        from mechfact.probes.queries import ProbeSet, predictions

        ps = ProbeSet.from_world(source)
        right = (predictions(model, ps) == ps.object_tokens).float().mean().item()

        class R:
            def summary(self, seed):
                return {"accuracy": scale * right}
        return R()

    monkeypatch.setattr(A, "ANALYSES", dict(A.ANALYSES))
    an = A.register("top-rate", top_rate, help="share of facts answered")
    assert [(o.name, o.kind, o.default) for o in an.options] == [("scale", "float", 1.0)]
    from mechfact.facts.runio import load_fact_run

    model, world = load_fact_run(fact_run)
    with torch.no_grad():
        got = A.run("top-rate", model.eval(), world, out=tmp_path / "t", scale=2.0)
    assert got["summary"]["accuracy"] == pytest.approx(2.0) and got["analysis"] == "top-rate"
    assert json.loads((tmp_path / "t" / "config.json").read_text())["config"]["scale"] == 2.0


def test_a_per_relation_analysis_summarises_each_relation_and_pools_their_facts(tmp_path, monkeypatch):
    """Relation by relation: each relation's summary, the pooled one over every fact, and the relations with no
    known fact counted (a ValueError other than "no known facts" is not swallowed)."""
    from dataclasses import dataclass

    from mechfact.llm.relations import Relation

    @dataclass(frozen=True)
    class Res:
        facts: tuple

        def summary(self, seed):
            return {"n": len(self.facts), "mean": sum(self.facts) / len(self.facts)}

    def per_fact(model, source, *, scale: int = 1, seed: int = 0):
        if source.name == "empty":
            raise ValueError("no known facts: the model answers none of the queries correctly")
        if source.name == "broken":
            raise ValueError("something else")
        return Res(tuple(scale * len(s) for s in source.subjects))

    monkeypatch.setattr(A, "ANALYSES", dict(A.ANALYSES))
    A.register("lengths", per_fact, help="subject lengths", per_relation=True)
    rels = [Relation("a", ["{} is"], [("xy", "o"), ("xyzw", "p")]), Relation("b", ["{} is"], [("x", "o")]),
            Relation("empty", ["{} is"], [("q", "o")])]
    got = A.run("lengths", object(), rels, out=tmp_path / "l", scale=2)
    assert got["per_relation"] == {"a": {"n": 2, "mean": 6.0}, "b": {"n": 1, "mean": 2.0}}
    assert got["summary"] == {"n": 3, "mean": pytest.approx(14 / 3)} and got["no_known_facts"] == ["empty"]
    with pytest.raises(ValueError, match="something else"):
        A.run("lengths", object(), rels + [Relation("broken", ["{} is"], [("q", "o")])], out=tmp_path / "m")


def test_an_analysis_declared_by_its_config_gets_one_flag_per_field_and_its_run_folder(fact_run, tmp_path,
                                                                                        monkeypatch, capsys):
    """A config dataclass and a run-folder writer per kind of model: the flags are the config's fields (the flag
    spelled as declared, the default the config's own where a flag is not given), the values reach the config
    typed, a flag of a kind the model is not is refused naming it, and the API entry writes the same folder."""
    from dataclasses import dataclass

    from mechfact.config import DictConfig, check_int
    from mechfact.runs import RunDir

    @dataclass
    class CountConfig(DictConfig):
        relations: list[int] | None = None
        repeats: int = 2
        scale: float = 0.5
        tags: list[str] | None = None
        exact: bool = False

        def __post_init__(self):
            check_int("repeats", self.repeats, 1)

    seen = []

    def write(spec, cfg, out, *, device="cpu", seed=0, progress=False):
        seen.append(cfg)
        return RunDir(out, cfg, kind="probe.count", seed=seed, device=str(device)).finish({"repeats": cfg.repeats})

    monkeypatch.setattr(A, "ANALYSES", dict(A.ANALYSES))
    A.register("count", help="counts", fact=A.variant(CountConfig, write, relations="ids",
                                                      flags={"repeats": "times"}, docs={"scale": "a scale"}))
    flags = {s for act in _subparser("count")._actions for s in act.option_strings}
    assert {"--times", "--scale", "--tags", "--exact", "--no-exact", "--relations"} <= flags
    assert main(["probe", "count", "--model", str(fact_run), "--out", str(tmp_path / "c"), "--times", "3",
                 "--tags", "a", "b,c", "--exact", "--relations", "0,1", "--quiet"]) == 0
    assert seen[-1] == CountConfig(relations=[0, 1], repeats=3, scale=0.5, tags=["a", "b", "c"], exact=True)
    cfg = json.loads((tmp_path / "c" / "config.json").read_text())
    assert cfg["kind"] == "probe.count" and cfg["config"]["repeats"] == 3 and cfg["config"]["scale"] == 0.5
    assert main(["probe", "count", "--model", str(fact_run), "--out", str(tmp_path / "d"), "--times", "0"]) == 2
    assert "--repeats 0: must be an integer >= 1" in capsys.readouterr().err
    assert main(["probe", "count", "--model", "default", "--out", str(tmp_path / "e"), "--times", "2"]) == 2
    assert "probe count needs a synthetic fact model" in capsys.readouterr().err
    got = A.run("count", str(fact_run), out=tmp_path / "f", repeats=4)
    assert got["repeats"] == 4 and seen[-1].scale == 0.5
    with pytest.raises(ValueError, match="unknown option times"):
        A.run("count", str(fact_run), out=tmp_path / "g", times=4)
    with pytest.raises(TypeError, match="runs on a model spec"):
        A.run("count", object(), out=tmp_path / "h")


def test_options_of_the_other_kind_of_model_are_refused_by_name(fact_run, tmp_path, capsys):
    """`probe readout --site` (a pretrained model's layer readout) on a fact model, `--sites` (a fact model's
    hook sites) on a pretrained one: each refused before anything runs, naming the flag and what the model takes."""
    assert main(["probe", "readout", "--model", str(fact_run), "--out", str(tmp_path / "a"), "--site",
                 "resid_post", "--k-shot", "2"]) == 2
    err = capsys.readouterr().err
    assert "--site, --k-shot apply to a pretrained --model; a fact model takes --sites, --kind, --heldout" in err
    assert not (tmp_path / "a" / "config.json").exists()
    assert main(["probe", "intervene", "--model", "default", "--out", str(tmp_path / "b"), "--relations",
                 "x.json", "--relation-ids", "0", "--sites", "y"]) == 2  # --sites is not intervene's at all
    assert "unrecognized arguments: --sites y" in capsys.readouterr().err
    assert main(["probe", "readout", "--model", str(fact_run), "--out", str(tmp_path / "c"), "--executor",
                 "ray"]) == 2  # a fact model's readout runs in this process: not silently local
    assert "--executor ray: probe readout on a fact model runs in this process" in capsys.readouterr().err


def test_the_llm_commands_are_the_pretrained_forms_of_the_registered_analyses():
    """`mechfact llm probe|lre|superposition` take exactly the flags of `mechfact probe readout|lre|superposition`
    on a pretrained model: one declaration each."""
    from mechfact.commands.llm import ALIASES

    parser = build_parser()
    llm = next(a for a in parser._actions if getattr(a, "choices", None) and "llm" in a.choices).choices["llm"]
    subs = next(a for a in llm._actions if getattr(a, "choices", None) and "lre" in a.choices).choices
    for alias, name, _ in ALIASES:
        alias_flags = {s for act in subs[alias]._actions for s in act.option_strings}
        own = {o.flag for o in A.ANALYSES[name].variants["pretrained"].options}
        probe_flags = {s for act in _subparser(name)._actions for s in act.option_strings}
        assert own <= alias_flags and alias_flags <= probe_flags, alias
        fact_only = {o.flag for o in A.ANALYSES[name].options} - own
        assert not fact_only & alias_flags, alias
