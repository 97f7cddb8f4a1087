"""The tracing claims decided by pre-stated tests: relation-clustered intervals, peak-layer distributions, the
MLP-0 check, the known-fact rule, and the page's configuration held equal to what its ``--run`` makes."""

import json
from pathlib import Path

import numpy as np
import pytest

from mechfact.probes import trace_tests as T

ROOT = Path(__file__).resolve().parents[1]
L = 20


def _fact(curves: dict, rng, width: int, noise=0.01, n_tokens=6) -> dict:
    """A fact's stored trace: subject at tokens 2..3, answer at 5; ``curves`` maps a bucket to its indirect effect
    per traced layer (the corrupted score 0.02 added), other buckets flat at 0."""
    scores = np.full((n_tokens, width), 0.02)
    pos = {"first_subject": 2, "last_subject": 3, "first_after": 4, "last": 5}
    for b, c in curves.items():
        scores[pos[b]] = 0.02 + np.asarray(c) + rng.normal(0, noise, width)
    return {"index": 0, "target": 1, "subject": [2, 3], "answer_pos": 5, "clean": 0.5, "corrupt": 0.02,
            "scores": scores.tolist()}


def _bump(layer, height, width=2.0):
    return height * np.exp(-0.5 * ((np.arange(L) - layer) / width) ** 2)


def _rows(pattern: dict, n_rel=8, n_facts=6, seed=0) -> list[dict]:
    """Trace rows of every kind in ``pattern`` (kind -> bucket -> curve over layers 0..L-1) over ``n_rel``
    relations; state kinds also trace the embedding (layer -1, no effect there)."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(n_rel):
        for kind, curves in pattern.items():
            emb = kind.startswith(("state", "severed"))
            layers = ([-1] if emb else []) + list(range(L))
            facts = []
            for i in range(n_facts):
                f = _fact({b: np.r_[0.0, c] if emb else c for b, c in curves.items()}, rng, len(layers))
                facts.append({**f, "index": i})
            rows.append({"relation": f"rel{r}", "kind": kind, "layers": layers, "facts": facts})
    return rows


def _decide(rows):
    kinds = {k: T.Traces.from_rows(rows, k, L) for k in dict.fromkeys(r["kind"] for r in rows)}
    return T.decide(kinds, L, n_boot=400)


GPT2_LIKE = {  # MLP at the last subject token at 0.35 of the depth, attention at the last token late; severing
    "state": {"last_subject": _bump(4, 0.4, 4), "last": _bump(17, 0.5)},  # the MLPs removes the early effect
    "mlp": {"last_subject": _bump(7, 0.3), "last": _bump(17, 0.05)},
    "mlp_no0": {"last_subject": _bump(7, 0.3), "last": _bump(17, 0.05)},
    "attn": {"last": _bump(15, 0.3), "last_subject": _bump(7, 0.02)},
    "severed_mlp": {"last_subject": _bump(4, 0.05, 4)},
    "severed_attn": {"last_subject": _bump(4, 0.38, 4)},
}


def _no0_rows(rows, window=3):
    """The mlp_no0 rows hold the layers whose window holds MLP 0 (here 0..1 of a window of 3)."""
    for r in rows:
        if r["kind"] == "mlp_no0":
            r["layers"] = [0, 1]
            for f in r["facts"]:
                f["scores"] = np.array(f["scores"])[:, :2].tolist()
    return rows


def test_the_published_pattern_holds_by_every_rule():
    got = _decide(_no0_rows(_rows(GPT2_LIKE)))
    assert {k: v["verdict"] for k, v in got.items()} == {k: "holds" for k in
                                                         ("mlp_depth", "mlp_depth_no0", "mlp_place", "mlp0",
                                                          "attn_place", "attn_depth", "sever_mlp", "sever_attn")}, got
    x = got["mlp_depth"]
    assert x["value"] == pytest.approx(7 / L) and x["n_relations"] == 8 and x["n_facts"] == 48
    assert got["sever_mlp"]["value"] == pytest.approx(1 - 0.05 / 0.4, abs=0.05)


def test_a_broken_pattern_does_not_hold_and_a_noisy_one_is_undecided():
    broken = dict(GPT2_LIKE, mlp={"last_subject": _bump(15, 0.1), "last": _bump(17, 0.3)},
                  attn={"last": _bump(3, 0.05), "last_subject": _bump(7, 0.3)},
                  severed_mlp={"last_subject": _bump(4, 0.38, 4)}, severed_attn={"last_subject": _bump(4, 0.05, 4)})
    got = _decide(_no0_rows(_rows(broken)))
    for k in ("mlp_depth", "mlp_place", "attn_place", "attn_depth", "sever_mlp", "sever_attn"):
        assert got[k]["verdict"] == "does not", (k, got[k])
    # the severing effect differs by relation: half the relations keep it, half lose it -> the interval straddles
    rows = _no0_rows(_rows(GPT2_LIKE))
    for r in rows:
        if r["kind"] == "severed_mlp" and int(r["relation"][3:]) % 2:
            for f in r["facts"]:
                f["scores"] = np.array(next(x for x in rows if x["kind"] == "state" and x["relation"] == r["relation"])
                                       ["facts"][0]["scores"]).tolist()
    assert _decide(rows)["sever_mlp"]["verdict"] == "undecided"


def test_an_effect_that_sits_only_in_mlp_0_is_flagged_by_the_mlp0_excluded_check(construction, one_thread):
    """The construction stores its facts in ONE layer: its MLP effect is MLP 0's. The MLP-0-excluded trace (real
    runs of the tracer) restores nothing, and the check says the effect rests on MLP 0 alone, though the window
    trace's own peak looks like a strong MLP effect."""
    from mechfact.probes import tracing
    from mechfact.probes.queries import ProbeSet

    model, world = construction
    ps = ProbeSet.from_world(world)
    q = tracing.fact_queries(ps, range(0, 192, 3))
    full = tracing.causal_trace_queries(model, q, kind="mlp", window=1)
    no0 = tracing.causal_trace_queries(model, q, kind="mlp", window=1, exclude=(0,))
    rel = [f"g{int(ps.tokens[i, 0]) % 8}" for i in range(0, 192, 3)]  # clusters: 8 groups of subjects

    def rows(res, kind):
        d = res.to_dict()
        return [{"relation": r, "kind": kind, "layers": d["layers"],
                 "facts": [f for f, rr in zip(d["facts"], rel) if rr == r]} for r in dict.fromkeys(rel)]
    assert len(set(rel)) >= T.MIN_RELATIONS
    data = rows(full, "mlp") + rows(no0, "mlp_no0")
    kinds = {k: T.Traces.from_rows(data, k, 1) for k in ("mlp", "mlp_no0")}
    got = T.decide(kinds, 1, n_boot=400)
    assert T.peak_values(kinds["mlp"], "last", T.draws(kinds["mlp"].relations, 50))[0] > 0.5  # a strong MLP effect
    assert got["mlp0"]["verdict"] == "does not" and got["mlp0"]["ci"][1] < 0.05, got["mlp0"]


def test_too_few_relations_give_no_interval_and_no_verdict():
    got = _decide(_no0_rows(_rows(GPT2_LIKE, n_rel=3)))
    assert all(v["ci"] == [None, None] and v["verdict"] == "undecided" for v in got.values()), got


def test_the_peak_layer_is_a_distribution_over_relation_resamples():
    rows = _rows({"mlp": {"last_subject": _bump(7, 0.3)}}, n_rel=6)
    for r in rows[:3]:  # three relations peak at layer 7, three at layer 12
        for f in r["facts"]:
            s = np.array(f["scores"])
            s[3] = 0.02 + _bump(12, 0.3)
            f["scores"] = s.tolist()
    t = T.Traces.from_rows(rows, "mlp", L)
    p = T.peak(t, "last_subject", T.draws(t.relations, 400))
    assert set(p["share"]) <= set(range(6, 14)) and p["share"].get(7, 0) > 0.2 and p["share"].get(12, 0) > 0.2
    assert p["layer_ci"][0] <= 7 and p["layer_ci"][1] >= 12 and sum(p["share"].values()) == pytest.approx(1)


def _state(peaks: list[int], n_facts=6, seed=0, name="rel") -> T.Traces:
    """State traces whose relation ``r`` peaks at the last subject token at layer ``peaks[r]``."""
    rows = []
    for r, layer in enumerate(peaks):
        rows += [{**x, "relation": f"{name}{r}"} for x in _rows({"state": {"last_subject": _bump(layer, 0.3)}},
                                                                 n_rel=1, n_facts=n_facts, seed=seed + r)]
    return T.Traces.from_rows(rows, "state", L)


def test_the_two_corruptions_are_compared_on_relations_drawn_together():
    """The noise / replace test: the same peak -> holds; peaks far apart -> does not; relations that disagree among
    themselves but alike under both corruptions -> holds, because each draw takes the same relations for both runs
    (independent draws of the two runs would mix different relations and leave the test undecided); a relation
    only one run traced is left out; fewer than the minimum of shared relations give no interval."""
    same = T.compare_corruptions(_state([8] * 8), _state([8] * 8 + [2], n_facts=4, seed=9), n_boot=400)
    assert same["value"] == 0 and same["ci"] == [0, 0] and same["verdict"] == "holds"
    assert same["n_relations"] == 8 and same["n_facts"] == {"noise": 48, "replace": 32}
    far = T.compare_corruptions(_state([4] * 8), _state([15] * 8, seed=5), n_boot=400)
    assert far["layers"] == {"noise": 4, "replace": 15} and far["value"] == pytest.approx(11 / L)
    assert far["ci"][0] > 0.1 and far["verdict"] == "does not"
    mixed = [5, 5, 5, 5, 13, 13, 13]  # relation-dependent peaks, alike under both corruptions (odd: no ties)
    paired = T.compare_corruptions(_state(mixed), _state(mixed, seed=3), n_boot=400)
    assert paired["ci"] == [0, 0] and paired["verdict"] == "holds"
    a, b = _state(mixed), _state(mixed, seed=3)
    ia, ib = T.draws(a.relations, 400, seed=0), T.draws(b.relations, 400, seed=1)  # unpaired: undecided
    diff = T.peak_layers(b, "last_subject", ib)[1] - T.peak_layers(a, "last_subject", ia)[1]
    assert T.verdict(T._interval(diff / L), "inside", T.CORRUPTION_RULE[4]) == "undecided"
    few = T.compare_corruptions(_state([8] * 3), _state([8] * 3), n_boot=50)
    assert few["ci"] == [None, None] and few["verdict"] == "undecided"
    with pytest.raises(ValueError, match="share no relation"):
        T.compare_corruptions(_state([8] * 6), _state([8] * 6, name="other"), n_boot=50)


def test_verdict_rules():
    assert T.verdict([0.2, 0.5], "inside", (0.15, 0.55)) == "holds"
    assert T.verdict([0.0, 0.1], "inside", (0.15, 0.55)) == "does not"
    assert T.verdict([0.1, 0.3], "inside", (0.15, 0.55)) == "undecided"
    assert T.verdict([0.6, 0.9], ">", 0.5) == "holds" and T.verdict([0.1, 0.4], ">", 0.5) == "does not"
    assert T.verdict([None, None], ">", 0.5) == "undecided"
    with pytest.raises(ValueError, match="side"):
        T.verdict([0, 1], "<", 0)


class _Tok:
    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, ids):
        return self.pieces[ids[0]]


@pytest.mark.parametrize("piece,obj,ok", [(" Paris", "Paris", True), (" the", "the United States", False),
                                          (" The", "The Hague", False), (" C", "Canberra", False), (" H", "H", True),
                                          (" ", "Rome", False), (",", ",", False), (" Ca", "Canberra", True),
                                          (" par", "Paris", True), (" Lon", "Paris", False)])
def test_a_fact_is_known_when_the_prediction_spells_the_object(piece, obj, ok):
    from mechfact.llm.prompts import prefix_match, spells_object

    tok = _Tok([piece])
    assert spells_object(tok, 0, obj) is ok
    if piece.strip() and piece.strip().lower() in ("the", "c"):
        assert prefix_match(tok, 0, [obj])  # the LRE authors' rule counts it: the rules differ exactly there


def test_old_model_short_names_warn_and_every_name_says_what_the_model_is():
    from mechfact.llm.models import registry

    with pytest.warns(FutureWarning, match="qwen2.5-coder-0.5b-instruct"):
        assert registry.resolve("qwen2.5-0.5b").name == "qwen2.5-coder-0.5b-instruct"
    with pytest.warns(FutureWarning, match="smollm2-135m-instruct"):
        assert registry.resolve("smollm2-135m").name == "smollm2-135m-instruct"
    for m in registry.MODELS.values():
        assert m.tuning in ("base", "instruct") and m.quant, m
        assert m.name.endswith("-instruct") == (m.tuning == "instruct"), m.name  # the short name says it
        assert m.tuning in m.label and m.quant in m.label and m.display in m.label
    assert "Coder" in registry.label("qwen2.5-coder-0.5b-instruct") and "Q5_0" in registry.label("qwen2.5-0.5b")
    assert registry.resolve("default").name == "smollm2-135m-instruct"


@pytest.mark.parametrize("corruption", ["noise", "replace"])
def test_the_shipped_trace_runs_are_what_the_page_commands_make_with_their_defaults(corruption):
    """The page's configuration IS ``--run``'s defaults: each shipped run's config equals the one the CLI builds
    from :func:`probes.results_trace.trace_argv` (the data folder written as exported)."""
    from mechfact.cli import build_parser
    from mechfact.llm.trace import TraceConfig
    from probes import families
    from probes import results_trace as S

    shipped = [p for p in sorted((ROOT / "docs" / "runs" / "trace").glob(f"*/{corruption}/config.json"))]
    if not shipped:
        pytest.skip(f"no shipped {corruption} trace runs in this checkout")
    data = ROOT / "tests" / "_no_such" / "data"
    for path in shipped:
        model = path.parent.parent.name
        cfg = json.loads(path.read_text())["config"]
        names = cfg["relation_names"]
        # the LRE file names come from the data folder itself (absent here): the shipped run's names stand in
        a = build_parser().parse_args(["llm", "trace"] + S.trace_argv(model, corruption, data, names=names)
                                      + ["--out", "x"])
        want = TraceConfig(model=a.model, relations=a.relations, relation_names=a.relation_names, kinds=a.kinds,
                           corruption=a.corruption, metric=a.metric, window=a.window, n_draws=a.draws,
                           noise_factor=a.noise_factor, n_replace=a.replacements, max_facts=a.max_facts,
                           k_shot=a.k_shot, template=a.template, dtype=a.dtype, batch_rows=a.batch_rows,
                           layers=a.layers, known=a.known).to_dict()
        want["relations"] = [r if r == "shipped" else f"{families.DATA_NAME}/{Path(r).name}"
                             for r in want["relations"]]
        assert cfg == want, (model, corruption)
        assert set(S.SHIPPED_FACTUAL) <= set(names) and cfg["max_facts"] == S.MAX_FACTS


def test_an_exported_trace_run_resumes_under_another_data_folder(tmp_path):
    """A trace run names two relation sources (the shipped set and the LRE data folder): the export writes the data
    folder portably, and --resume-from puts the local one back, so the run continues instead of being refused."""
    from mechfact.runs import RunDir
    from probes import families

    def rundir(out, data):
        cfg = {"relations": ["shipped", str(data / "factual")], "max_facts": 14}
        return RunDir(out / "gemma3-270m" / "noise", cfg, kind="llm.trace", seed=0, device="cpu",
                      model_id="gemma3-270m:abc")

    run = rundir(tmp_path / "runs", tmp_path / "first" / "data")
    run.write_result({"per_relation": [{"relation": "animal_class", "kind": "state"}]})
    assert families.export(tmp_path / "runs", tmp_path / "shipped") >= 2
    cfg = json.loads((tmp_path / "shipped" / "gemma3-270m" / "noise" / "config.json").read_text())
    assert cfg["config"]["relations"] == ["shipped", f"{families.DATA_NAME}/factual"]  # no machine path shipped
    with pytest.raises(ValueError, match="different config"):
        rundir(tmp_path / "shipped", tmp_path / "second" / "data").read_result({"per_relation": []})
    got = families.resume_shipped(tmp_path / "shipped", tmp_path / "again", tmp_path / "second" / "data")
    assert got == ["gemma3-270m/noise"]
    again = rundir(tmp_path / "again", tmp_path / "second" / "data").read_result({"per_relation": []})
    assert again["per_relation"][0]["relation"] == "animal_class"


def test_the_replace_run_starts_from_the_noise_runs_screen(tmp_path):
    """The page's two runs of a model screen the same prompts: the replace folder gets the noise folder's screen
    when it has none, and one it already has is left as it is."""
    from mechfact.llm.trace import SCREEN
    from probes.results_trace import _share_screen

    noise, replace = tmp_path / "m" / "noise", tmp_path / "m" / "replace"
    noise.mkdir(parents=True)
    (noise / SCREEN).write_text('{"identity": {}, "top1": {"r": [1, 2]}}')
    _share_screen(noise, replace)
    assert (replace / SCREEN).read_text() == (noise / SCREEN).read_text()
    (replace / SCREEN).write_text('{"identity": {}, "top1": {}}')
    _share_screen(noise, replace)
    assert json.loads((replace / SCREEN).read_text())["top1"] == {}


def test_a_peak_from_fewer_relations_than_the_minimum_gets_no_spread_over_draws(tmp_path):
    """A partial run (one relation of the shipped SmolLM2 run): the corruption section names the peak layer and
    says there is no interval, instead of a collapsed '95% of draws' from one resampled unit; with every relation
    the spread is printed."""
    from probes.results_trace import corruptions

    shipped = ROOT / "docs" / "runs" / "trace" / "smollm2-135m-instruct" / "noise" / "result.json"
    if not shipped.is_file():
        pytest.skip("no shipped SmolLM2 trace run in this checkout")
    full = json.loads(shipped.read_text())
    one = full["per_relation"][0]["relation"]
    folder = tmp_path / "smollm2-135m-instruct" / "noise"
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({**full, "per_relation": [
        r for r in full["per_relation"] if r["relation"] == one]}))
    text = corruptions(tmp_path)
    assert f"no interval: fewer than {T.MIN_RELATIONS} relations" in text and "1 relation)" in text
    assert "95% of draws" not in text
    assert "95% of draws" in corruptions(shipped.parents[2])


def test_the_page_figure_draws_the_facts_the_tables_pool_with_relation_clustered_bands():
    """A partial run: one relation has finished only its state trace. The figure pools each kind over the
    relations every kind has (as the tables and tests do), not each kind over its own facts; its bands are the
    relation-clustered intervals of the tests; with fewer relations than the minimum it draws no band."""
    from probes.results_trace import figure_input

    rows = _rows({"state": GPT2_LIKE["state"], "mlp": GPT2_LIKE["mlp"]}, n_rel=6)
    rows = [r for r in rows if not (r["relation"] == "rel5" and r["kind"] == "mlp")]
    pooled = figure_input({"model": "m", "n_layers": L, "per_relation": rows})["pooled"]
    assert {k: (v["n_facts"], v["n_relations"]) for k, v in pooled.items()} == {"state": (30, 5), "mlp": (30, 5)}
    t = T.Traces.from_rows([r for r in rows if r["relation"] != "rel5"], "state", L)
    want = T.curve(t, "last_subject", T.draws(t.relations, seed=0))
    assert pooled["state"]["aie"]["last_subject"] == want
    few = figure_input({"model": "m", "n_layers": L, "per_relation": [r for r in rows if r["relation"] < "rel4"]})
    assert all(c["aie_ci"] is None for c in few["pooled"]["mlp"]["aie"]["last"])
    assert few["pooled"]["mlp"]["total_effect"] == pytest.approx(0.48)
