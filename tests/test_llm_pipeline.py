"""The LLM pipeline on tiny random Llama / Qwen2 / Qwen3 / Phi-3 models (no downloads)."""

import json

import numpy as np
import pytest
import torch

from llm_tiny import FAMILIES


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


@pytest.mark.parametrize("family", FAMILIES)
def test_only_the_answer_positions_are_unembedded_and_the_next_tokens_are_the_full_forwards(tiny, family,
                                                                                            one_thread):
    """collect asks the HF model for the logits at each query's answer position alone (logits_to_keep): the next
    tokens are those of the plain full forward, and the unembedding sees one position per query."""
    from mechfact.probes.queries import keeps_logits

    lm = tiny["models"][family]
    assert keeps_logits(lm) and not keeps_logits(object())
    ps = _prompts(lm, tiny["relations"], k=3)
    seen = []
    handle = lm.bridge.unembed.register_forward_hook(lambda m, args, out: seen.append(tuple(out.shape)))
    try:
        nxt = _states(lm, ps, layers=[0], batch_size=5)[1]
    finally:
        handle.remove()
    assert seen and all(shape[1] == 1 for shape in seen), seen
    with torch.no_grad():
        full = [int(lm.bridge(torch.tensor([p.tokens]))[0, -1].argmax()) for p in ps]
    assert nxt.tolist() == full


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
    from mechfact.llm.readout import ProbeConfig, run_llm_probe

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
    from mechfact.llm.readout import ProbeConfig, RelationStates, layer_readouts
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
    assert real["readout_accuracy_n"] == real["n_test"] >= 40 and real["readout_accuracy_ci"][0] > 0.75, real
    perm = rng.permutation(n)
    shuffled = RelationStates(**{**rs.__dict__, "states": rs.states[:, perm]})
    sh = layer_readouts(shuffled, None, cfg, seed=0)[0]
    assert sh["readout_accuracy"] <= 0.5, sh


def test_probe_resumes_and_rejects_other_config(tiny, cache, tmp_path, one_thread):
    from mechfact.llm.readout import ProbeConfig, run_llm_probe

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


def test_every_relation_file_of_the_lre_authors_loads(lre_data):
    """The 26 factual and 6 linguistic files of the LRE authors' data load, every kind as declared (external data:
    skipped without it)."""
    from mechfact.llm.relations import load_relations

    root = lre_data
    for part in ("factual", "linguistic"):
        files = sorted((root / part).glob("*.json"))
        assert files, part
        rels = load_relations(root / part)
        assert len(rels) == len(files), (part, len(rels), len(files))


def test_linear_readout_reports_the_baselines_and_the_ceiling_with_intervals():
    from mechfact import stats
    from mechfact.probes.readout import REPORTED, linear_readout

    y = np.repeat(np.arange(5), [20, 8, 4, 2, 1])  # 35 items, unbalanced, one singleton
    te = np.array([0, 1, 2, 3, 4, 20, 21, 28, 32, 34])  # the singleton's only item is in the test part
    tr = np.setdiff1d(np.arange(len(y)), te)
    X = np.random.default_rng(0).normal(size=(len(y), 4))
    sc = linear_readout(X, y, tr, te, kind="classifier").to_dict()
    p = np.bincount(y[tr], minlength=5) / len(tr)
    assert sc["prior_baseline"] == pytest.approx(float(np.mean(p[y[te]])))
    assert sc["chance"] == pytest.approx(float(np.mean(y[te] == 0)))  # the majority-class rate
    assert sc["ceiling"] == pytest.approx(0.9)  # object 4 never occurs in training: no classifier names it
    assert sc["accuracy"] <= sc["ceiling"]
    stats.check_reported(sc, REPORTED)
    for k in REPORTED:
        lo, hi = sc[f"{k}_ci"]
        assert sc[f"{k}_n"] == len(te) and lo <= sc[k] <= hi and hi - lo > 0, (k, sc[k], lo, hi)


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


@pytest.mark.parametrize("family", FAMILIES)
def test_shared_heads_give_the_whole_prompts_states(tiny, family, one_thread):
    """Prompts sharing their in-context examples run the shared head once: the subject and last states, the next
    tokens and the edited logits equal those of the whole prompts (the authors' trial: training facts each
    with their own head, test facts with one)."""
    from mechfact import hooks
    from mechfact.llm.lre import edited_logits
    from mechfact.llm.prompts import build_prompts
    from mechfact.llm.relations import load_relations
    from mechfact.llm.lre.shared_prefix import Heads, groups_by_head, head_of, states_shared
    from mechfact.probes.queries import ProbeSet, Site, collect

    lm = tiny["models"][family]
    rel = load_relations(tiny["relations"], ["tiny_colour"])[0]
    train = [0, 1, 2]
    prompts = build_prompts(rel, lm.tokenizer, lm.bos_id, examples=train, samples=list(range(len(rel))))
    shared, alone = groups_by_head(prompts)
    # every test prompt shares its head (a subject's leading space may be its own token: a head per tokenisation)
    assert sorted(i for idx in shared.values() for i in idx) == list(range(3, len(rel))) and alone == train
    sites = [Site(hooks.resid(0, "post"), "subject"), Site(hooks.resid(lm.n_layers - 1, "post"), "last")]
    want = collect(lm, ProbeSet.from_prompts(prompts, pad_id=lm.pad_id), sites, batch_size=4)
    heads = Heads(lm)
    got = states_shared(lm, prompts, sites, batch_size=3, heads=heads)  # batches of 3 over a ragged group
    for s in sites:
        assert torch.allclose(got[s], want[s], atol=1e-4), (s, (got[s] - want[s]).abs().max())
    assert torch.equal(got.next_token, want.next_token)
    g = torch.Generator().manual_seed(1)
    for i in (1, 5):  # a training prompt (its own head) and a test prompt (the shared head)
        p = prompts[i]
        S = got[sites[0]][i]
        new = S + S.norm() * torch.randn(3, S.shape[0], generator=g)
        ref = edited_logits(lm, p.tokens, p.subject_last, 0, new)
        head = heads.cache(head_of(p))
        fast = edited_logits(lm, p.tokens, p.subject_last, 0, new, prefix=head, start=p.subject_first)
        again = edited_logits(lm, p.tokens, p.subject_last, 0, new, prefix=head, start=p.subject_first)
        assert torch.allclose(fast, ref, atol=1e-4), (fast - ref).abs().max()
        assert torch.equal(fast, again)  # the head's cache is not consumed by a run
    with pytest.raises(ValueError, match="start 9 must lie in"):
        edited_logits(lm, prompts[5].tokens, 8, 0, new, start=9)
