"""The LLM pipeline on tiny random Llama / Qwen2 / Qwen3 / Phi-3 models (no downloads)."""

import json

import numpy as np
import pytest
import torch

from llm_tiny import FAMILIES, build_model, write_relations


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """{family: LanguageModel} plus the relation folder; built once per session."""
    from mechfact.llm.loading import load_model

    root = tmp_path_factory.mktemp("tiny_llms")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    models = {f: load_model(str(build_model(f, root / f))) for f in FAMILIES}
    torch.set_num_threads(n)
    return {"models": models, "relations": write_relations(root / "relations"), "root": root}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MECHFACT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _prompts(lm, relations, k=2):
    from mechfact.llm.prompts import build_prompts
    from mechfact.llm.relations import load_relations

    rel = load_relations(relations, ["tiny_colour"])[0]
    return build_prompts(rel, lm.tokenizer, lm.bos_id, k=k, seed=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_subject_positions_point_at_the_subject(tiny, family):
    lm = tiny["models"][family]
    for p in _prompts(lm, tiny["relations"])[:4]:
        text = lm.tokenizer.decode(p.tokens[p.subject_first:p.subject_last + 1])
        assert text.strip() == p.subject, (text, p.subject)
        assert p.text.endswith("is") and (p.tokens[0] == lm.bos_id) == lm.prepend_bos


def _states(lm, prompts, layers=None, site="resid_post", **kw):
    """(layers, n, d) states at the subject's last token through the one collector, plus the next tokens."""
    from mechfact import hooks
    from mechfact.probes.queries import ProbeSet, Site, collect

    ps = ProbeSet.from_prompts(prompts, pad_id=lm.pad_id)
    sites = [Site(hooks.layer_site(site, l), "subject") for l in (range(lm.n_layers) if layers is None else layers)]
    acts = collect(lm, ps, sites, **kw)
    return torch.stack([acts[s] for s in sites]), acts.next_token


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("padding", ["right", "left"])
def test_batched_states_match_unbatched(tiny, family, padding, one_thread):
    lm = tiny["models"][family]
    ps = _prompts(lm, tiny["relations"], k=3)
    assert len({len(p.tokens) for p in ps}) > 1  # padding really happens
    one, nxt1 = _states(lm, ps, batch_size=1)
    many, nxt = _states(lm, ps, batch_size=5, padding=padding)
    assert one.shape == (lm.n_layers, len(ps), lm.d_model)
    assert torch.allclose(one, many, atol=1e-4, rtol=0)
    assert torch.equal(nxt1, nxt)


def test_state_cache_hit_returns_same_tensors_without_running(tiny, cache, monkeypatch, one_thread):
    lm = tiny["models"]["llama"]
    ps = _prompts(lm, tiny["relations"])
    a, na = _states(lm, ps, layers=[0, 2], cache=True)
    assert len(list((cache / "states").glob("*.pt"))) == 1

    def boom(*a, **k):
        raise AssertionError("cache miss: the model ran")

    monkeypatch.setattr(lm.bridge, "run_with_cache", boom)
    b, nb = _states(lm, ps, layers=[0, 2], cache=True)
    assert torch.equal(a, b) and torch.equal(na, nb)
    with pytest.raises(AssertionError, match="cache miss"):  # another site is another key
        _states(lm, ps, layers=[0, 2], site="resid_mid", cache=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_whole_pipeline_probe_and_lre(tiny, family, cache, tmp_path, one_thread):
    from mechfact.llm.lre import LreConfig, run_llm_lre
    from mechfact.llm.probe import ProbeConfig, run_llm_probe

    lm = tiny["models"][family]
    res = run_llm_probe(ProbeConfig(relations=str(tiny["relations"]), k_shot=2, n_splits=1), tmp_path / "probe",
                        lm=lm, progress=False)
    assert [r["relation"] for r in res["relations"]] == ["tiny_capital", "tiny_colour"]
    assert all(r["n_known"] <= r["n_samples"] for r in res["relations"])
    assert {(r["relation"], r["layer"]) for r in res["per_layer"]} == {
        (n, l) for n in ("tiny_capital", "tiny_colour") for l in range(lm.n_layers)}
    for r in res["per_layer"]:
        assert {"layer", "relation", "readout_accuracy", "chance", "control_accuracy"} <= set(r)
    for f in ("config.json", "result.json", "meta.json", "fig_readout.png", "fig_readout_mean.png", "fig_known.png"):
        assert (tmp_path / "probe" / f).exists(), f
    # random models know nothing: the LRE runs on every fact against the model's own predictions
    lres = run_llm_lre(LreConfig(relations=str(tiny["relations"]), layer=1, n_train=2, rank=8, facts="all",
                                 k_shot=2, chunk=16), tmp_path / "lre", lm=lm, progress=False)
    rows = {r["relation"]: r for r in lres["per_relation"]}
    assert set(rows) == {"tiny_capital", "tiny_colour"}
    for r in rows.values():
        assert r["n_test"] > 0 and 0 <= r["faithfulness"] <= 1
        # causality needs two facts with different predictions; a random model may predict one token for all
        assert r["causality"] is None or 0 <= r["causality"] <= 1
    assert (tmp_path / "lre" / "fig_lre.png").exists()


@pytest.mark.parametrize("family", ["llama", "phi3"])
def test_jacobian_matches_finite_differences(tiny, family, one_thread):
    from mechfact import hooks
    from mechfact.llm.lre import jacobian

    lm = tiny["models"][family]
    p = _prompts(lm, tiny["relations"], k=2)[0]
    layer = 1
    J, s, o = jacobian(lm, p.tokens, p.subject_last, layer, chunk=20)
    toks = torch.tensor([p.tokens])

    def f(sv):
        got = {}

        def put(act, hook):
            act = act.clone()
            act[0, p.subject_last] = sv
            return act

        def take(act, hook):
            got["o"] = act[0, -1]
            return act

        with torch.no_grad():
            lm.bridge.run_with_hooks(toks, fwd_hooks=[(hooks.resid(layer, "post"), put),
                                                      (hooks.resid(lm.n_layers - 1, "post"), take)])
        return got["o"]

    assert torch.allclose(f(s), o, atol=1e-4)
    v = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(0))
    v *= 1e-2 * s.norm() / v.norm()  # small against the state itself: the map is nonlinear
    fd = (f(s + v) - f(s - v)) / 2
    assert (fd - J @ v).norm() / fd.norm() < 1e-2


def test_readout_finds_a_real_signal_and_not_a_shuffled_one():
    """Synthetic subject states whose class mean carries the object: far above chance and control."""
    from mechfact.llm.probe import ProbeConfig, RelationStates, layer_readouts
    from mechfact.llm.relations import Relation

    rng = np.random.default_rng(0)
    n, d, k = 60, 32, 4
    objs = [f"o{i % k}" for i in range(n)]
    means = rng.normal(size=(k, d)) * 2.0
    X = means[[i % k for i in range(n)]] + rng.normal(size=(n, d))
    rel = Relation("syn", ["{} is"], [(f"s{i}", o) for i, o in enumerate(objs)])
    assert rel.kind == "many_to_one"
    rs = RelationStates(relation=rel, prompts=[None] * n, states=torch.tensor(X, dtype=torch.float32)[None],
                        layers=[0], next_token=torch.zeros(n, dtype=torch.long), object_first=[0] * n,
                        known=np.ones(n, bool))
    cfg = ProbeConfig(n_splits=3)
    real = layer_readouts(rs, None, cfg, seed=0)[0]
    assert real["readout_accuracy"] >= 0.9, real
    assert real["control_accuracy"] <= 0.5 and real["chance"] <= 0.5, real
    perm = rng.permutation(n)
    shuffled = RelationStates(**{**rs.__dict__, "states": rs.states[:, perm]})
    sh = layer_readouts(shuffled, None, cfg, seed=0)[0]
    assert sh["readout_accuracy"] <= 0.5, sh


def test_probe_resumes_and_rejects_other_config(tiny, cache, tmp_path, one_thread):
    from mechfact.llm.probe import ProbeConfig, run_llm_probe

    lm = tiny["models"]["qwen2"]
    cfg = ProbeConfig(relations=str(tiny["relations"]), relation_names=["tiny_colour"], layers=[0, 2], n_splits=1)
    a = run_llm_probe(cfg, tmp_path / "p", lm=lm, progress=False)
    b = run_llm_probe(cfg, tmp_path / "p", lm=lm, progress=False)
    assert a["per_layer"] == b["per_layer"]
    assert json.loads((tmp_path / "p" / "config.json").read_text())["kind"] == "llm.probe"
    with pytest.raises(ValueError, match="different config"):
        run_llm_probe(ProbeConfig(relations=str(tiny["relations"]), layers=[1], n_splits=1), tmp_path / "p", lm=lm,
                      progress=False)


def test_causal_edit_through_the_shared_patching_engine(tiny, one_thread):
    """Setting the subject state to its own value (through run_with_interventions) reproduces the clean answers."""
    from mechfact.llm.lre import patched_predictions

    lm = tiny["models"]["phi3"]
    ps = _prompts(lm, tiny["relations"], k=2)
    idx = list(range(6))
    layer = lm.n_layers - 1
    states, nxt = _states(lm, ps, layers=[layer])
    same = patched_predictions(lm, ps, idx, layer, states[0, idx])
    assert torch.equal(same, nxt[idx])


def test_probe_set_gives_the_shared_probes_the_prompts(tiny, one_thread):
    from mechfact.llm.prompts import probe_set
    from mechfact.probes.patching import run_with_interventions

    lm = tiny["models"]["llama"]
    ps = probe_set(lm, tiny["relations"], k_shot=2)
    assert len(ps) == 22 and ps.relation_ids == [0, 1] and ps.relation_names == ("tiny_capital", "tiny_colour")
    colour = _prompts(lm, tiny["relations"], k=2)  # tiny_colour is relation 1 (sorted by name)
    _, nxt = _states(lm, colour, layers=[0])
    logits = run_with_interventions(lm, ps.for_relation(1), [])
    assert torch.equal(logits.argmax(-1), nxt)


def test_relation_in_memory_and_its_errors():
    from mechfact.llm.relations import Relation

    a = Relation("cap", "The capital of {} is", [("France", "Paris"), {"subject": "Japan", "object": "Tokyo"}])
    assert a.kind == "one_to_one" and a.subjects == ("France", "Japan") and len(a) == 2
    assert Relation(**{k: v for k, v in a.to_dict().items()}) == a
    for bad, needle in ((dict(prompt_templates=["no slot"]), "exactly one '{}'"), (dict(samples=[]), "no samples"),
                        (dict(samples=[("a", "b"), ("a", "c")], kind="one_to_one"), "the samples are one_to_many"),
                        (dict(samples=[("a", 3)]), "sample 0 must be"), (dict(kind="one_to_one",
                         samples=[("a", "x"), ("b", "x")]), "the samples are many_to_one")):
        kw = {"name": "r", "prompt_templates": ["{} is"], "samples": [("a", "b")], **bad}
        with pytest.raises(ValueError, match=needle) as e:
            Relation(**kw)
        assert "relation 'r'" in str(e.value)
    anto = Relation("anto", ["The opposite of {} is"], [("big", "small"), ("big", "little"), ("big", "small")])
    assert anto.kind == "one_to_many" and len(anto) == 2 and anto.objects_of("big") == ["small", "little"]
    # a declared kind may be more general than its samples (a sample of a many-to-many relation), not narrower
    hq = Relation("hq", ["{} is based in"], [("a", "x"), ("b", "x")], kind="many_to_many")
    assert hq.kind == "many_to_many"
    with pytest.raises(ValueError, match="kind many_to_one but the samples are one_to_many"):
        Relation("r", ["{} is"], [("a", "x"), ("a", "y")], kind="many_to_one")


def test_every_relation_file_of_the_lre_authors_loads():
    """The 26 factual and 6 linguistic files of ../shared/data/lre load, every kind as declared (external data:
    skipped without it)."""
    from pathlib import Path

    from mechfact.llm.relations import load_relations

    root = Path(__file__).resolve().parents[2] / "shared" / "data" / "lre"
    if not root.is_dir():
        pytest.skip(f"{root} is absent (the LRE authors' data lives in the shared folder)")
    for part in ("factual", "linguistic"):
        files = sorted((root / part).glob("*.json"))
        assert files, part
        rels = load_relations(root / part)
        assert len(rels) == len(files), (part, len(rels), len(files))


def test_stratified_splits_balance_objects_and_report_both_baselines():
    from mechfact.probes.readout import linear_readout, stratified_split_indices

    y = np.repeat(np.arange(5), [20, 8, 4, 2, 1])  # 35 items, unbalanced, one singleton
    for s in range(5):
        tr, te = stratified_split_indices(y, 0.25, seed=s)
        assert len(np.intersect1d(tr, te)) == 0 and len(tr) + len(te) == len(y)
        counts = {c: int((y[te] == c).sum()) for c in range(4)}
        assert counts == {0: 5, 1: 2, 2: 1, 3: 1}  # round(0.25 n), at least 1, never all of a class
    X = np.random.default_rng(0).normal(size=(len(y), 4))
    sc = linear_readout(X, y, tr, te, kind="classifier")
    p = np.bincount(y[tr], minlength=5) / len(tr)
    assert sc.prior_baseline == pytest.approx(float(np.mean(p[y[te]])))
    assert sc.chance == pytest.approx(float(np.mean(y[te] == 0)))  # the majority-class rate


def test_prefix_match_is_the_authors_rule():
    from mechfact.llm.prompts import prefix_match

    class Tok:
        def decode(self, ids):
            return {1: " Par", 2: " par", 3: " ", 4: " Lon"}[ids[0]]

    assert prefix_match(Tok(), 1, ["Paris"]) and prefix_match(Tok(), 2, ["Paris"])
    assert not prefix_match(Tok(), 3, ["Paris"]) and not prefix_match(Tok(), 4, ["Paris"])
    assert prefix_match(Tok(), 4, ["Paris", "London"])  # one-to-many: any object counts


def test_authors_prompts_show_the_training_facts_and_never_the_query(tiny):
    from mechfact.llm.prompts import build_prompts
    from mechfact.llm.relations import load_relations

    lm = tiny["models"]["llama"]
    rel = load_relations(tiny["relations"], ["tiny_colour"])[0]
    train = [0, 3, 5]
    for p, i in zip(build_prompts(rel, lm.tokenizer, lm.bos_id, examples=train), range(len(rel))):
        lines = p.text.splitlines()
        shown = [j for j in train if j != i]
        assert lines[:-1] == [f"The colour of {rel.subjects[j]} is {rel.objects[j]}" for j in shown]
        assert lines[-1] == f"The colour of {rel.subjects[i]} is"


def test_authors_protocol_sweeps_beta_and_rank_and_keeps_the_projection_baseline(tiny, one_thread):
    import mechfact
    from mechfact.llm.lre import AUTHORS_BETAS
    from mechfact.llm.relations import load_relations

    lm = tiny["models"]["qwen2"]
    rel = load_relations(tiny["relations"], ["tiny_colour"])[0]
    res = mechfact.lre(lm, rel, layer=1, n_train=3, facts="all", n_trials=2, chunk=16)
    assert res.n_trials == 2 and res.n_test > 0 and len(res.faithfulness_by_beta) == len(AUTHORS_BETAS) == 21
    assert res.best_beta in AUTHORS_BETAS and res.faithfulness_best_beta >= res.faithfulness
    assert set(res.causality_by_rank) == set(res.causality_projection_baseline_by_rank) == {"16", "32", "48"}
    assert res.causality == res.causality_by_rank["48"]  # --rank 64 capped at d_model
    known = mechfact.lre(lm, rel, layer=1, n_train=3, n_trials=2, chunk=16)  # a random model knows nothing
    assert known.n_known <= 2 and known.faithfulness is None


def test_filter_trials_keeps_the_known_facts_and_first_trial_of_the_full_run(tiny, monkeypatch, one_thread):
    """--trials 1 --filter-trials 3 = the 3-trial run's known facts and its first trial; a 1-set filter keeps at
    least as many facts (its one example set is the first of the three). A random model knows nothing, so "right"
    is every call but each 7th, counted from the start of each run (the runs judge in the same order)."""
    import itertools

    import mechfact
    from mechfact.llm import lre as L
    from mechfact.llm import prompts
    from mechfact.llm.relations import load_relations

    lm = tiny["models"]["qwen2"]
    rel = load_relations(tiny["relations"], ["tiny_colour"])[0]
    pick = L._balanced_pick

    def run(**kw):
        calls, picks = itertools.count(), []
        monkeypatch.setattr(prompts, "prefix_match", lambda tok, token, objects: next(calls) % 7 != 6)
        monkeypatch.setattr(L, "_balanced_pick", lambda *a: picks.append(pick(*a)) or picks[-1])
        return mechfact.lre(lm, rel, layer=1, n_train=2, chunk=16, ranks=[8], cache_states=False, **kw), picks

    (full, fp), (one, op), (weak, wp) = run(n_trials=3), run(n_trials=1, filter_trials=3), run(n_trials=1,
                                                                                               filter_trials=1)
    assert 4 <= full.n_known < weak.n_known, (full.n_known, weak.n_known)  # the filter has teeth, leaves facts
    assert one.n_known == full.n_known and full.n_trials == 3 and one.n_trials == 1
    assert len(fp) == 3 and op == fp[:1] and one.faithfulness_trials == full.faithfulness_trials[:1]
    with pytest.raises(ValueError, match="--filter-trials 0"):
        mechfact.lre(lm, rel, layer=1, filter_trials=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_batched_edits_match_patching_the_whole_prompt(tiny, family, one_thread):
    """edited_logits (prefix once, the suffix as m copies) = patching the full prompt once per state."""
    from mechfact import hooks
    from mechfact.llm.lre import edited_logits
    from mechfact.probes.patching import Intervention, run_with_interventions
    from mechfact.probes.queries import ProbeSet

    lm = tiny["models"][family]
    ps = _prompts(lm, tiny["relations"], k=2)
    layer = 0  # below the last layer: later blocks carry the edit to the answer position
    states, _ = _states(lm, ps, layers=[layer])
    S = states[0]
    g = torch.Generator().manual_seed(0)
    for i in (0, 3):
        new = S[i] + S[i].norm() * torch.randn(5, S.shape[1], generator=g)
        new[0] = S[i]
        got = edited_logits(lm, ps[i].tokens, ps[i].subject_last, layer, new, chunk=2)
        one = ProbeSet.from_prompts([ps[i]], pad_id=lm.pad_id)
        want = torch.cat([run_with_interventions(lm, one, [Intervention(site=hooks.resid(layer, "post"), kind="set",
                                                                        position="subject", values=v.tolist())])
                          for v in new])
        assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
        assert (got[1:] - got[0]).abs().max() > 1e-2  # the edits move the logits: the comparison has teeth


def test_lre_layer_sweep_equals_single_layer_runs(tiny, tmp_path, one_thread):
    """A sweep shares known facts, training facts and edit targets across layers: each layer's row is the row
    of a single-layer run at that layer; the relation is reported at its best layer."""
    from mechfact.llm.lre import LreConfig, run_llm_lre

    lm = tiny["models"]["qwen2"]
    opts = dict(relations=str(tiny["relations"]), relation_names=["tiny_colour"], n_train=2, facts="all", k_shot=2,
                chunk=16, n_trials=2, ranks=[4, 8])
    sweep = run_llm_lre(LreConfig(layers=[1, 0], **opts), tmp_path / "sweep", lm=lm)
    assert sweep["layers"] == [0, 1] and sweep["layer"] is None
    rows = {r["layer"]: r for r in sweep["per_relation_layer"]}
    assert set(rows) == {0, 1}
    for layer in (0, 1):
        one = run_llm_lre(LreConfig(layer=layer, **opts), tmp_path / f"l{layer}", lm=lm)["per_relation"][0]
        assert one == rows[layer]
    best = sweep["per_relation"][0]
    assert best["best_layer"] in (0, 1) and [b["layer"] for b in best["by_layer"]] == [0, 1]
    assert best["faithfulness_best_beta"] == max(r["faithfulness_best_beta"] for r in rows.values())
    assert (tmp_path / "sweep" / "fig_lre.png").exists()
    with pytest.raises(ValueError, match="--layer 1 and --layers"):
        LreConfig(layer=1, layers=[0, 1])
    with pytest.raises(ValueError, match="--layers 5: out of range"):
        run_llm_lre(LreConfig(layers=[0, 5], **opts), tmp_path / "bad", lm=lm)
