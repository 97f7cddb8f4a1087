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
        assert {"--model", "--relations", "--out", "--seed", "--device"} <= flags
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
