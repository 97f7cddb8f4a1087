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
    assert real["readout_accuracy_n"] == real["n_test"] >= 40 and real["readout_accuracy_ci"][0] > 0.75, real
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


def test_authors_protocol_reports_fixed_and_train_chosen_numbers_with_intervals(tiny, one_thread):
    import mechfact
    from mechfact import stats
    from mechfact.llm.lre import AUTHORS_BETAS
    from mechfact.llm.relations import load_relations

    lm = tiny["models"]["qwen2"]
    rel = load_relations(tiny["relations"], ["tiny_colour"])[0]
    res = mechfact.lre(lm, rel, layer=1, n_train=3, facts="all", n_trials=2, chunk=16)
    d = res.to_dict()
    assert res.n_trials == 2 and res.n_test > 0 and len(res.faithfulness_by_beta) == len(AUTHORS_BETAS) == 21
    assert d["beta"] == 2.25 and d["faithfulness_selected_on"] == "fixed"
    assert d["train_beta"] in AUTHORS_BETAS and d["faithfulness_train_beta_selected_on"] == "train"
    assert d["faithfulness_train_beta"] == d["faithfulness_by_beta"][str(d["train_beta"])]
    assert d["faithfulness_bias_only"] == d["faithfulness_by_beta"]["0.0"]
    assert d["faithfulness_best_on_test_upper_bound"] == max(d["faithfulness_by_beta"].values())
    stats.check_reported(d, ["faithfulness", "faithfulness_train_beta", "faithfulness_bias_only", "majority_baseline",
                             "causality", "faithfulness_model_beta"])
    assert set(d["train_faithfulness_by_beta"]) == {str(b) for b in AUTHORS_BETAS}
    if d["causality"] is not None:  # 16, 32, ... clipped to the width (the authors' sweep: --ranks authors)
        assert set(d["causality_by_rank"]) == {"16", "32", "48"} and d["rank"] in (16, 32, 48)
        assert d["causality"] == d["causality_by_rank"][str(d["rank"])]
    known = mechfact.lre(lm, rel, layer=1, n_train=3, n_trials=2, chunk=16)  # a random model knows nothing
    assert known.faithfulness is None and known.n_trials == 0


def test_authors_split_is_object_balanced_and_drops_training_subjects():
    import numpy as np

    from mechfact.llm.lre_authors import max_coverage_split

    objects = ["red"] * 8 + ["blue"] * 3 + ["green"]
    subjects = [f"s{i}" for i in range(11)] + ["s0"]  # s0 also has the one green fact
    for seed in range(20):
        train, test = max_coverage_split(objects, subjects, 3, np.random.default_rng(seed))
        assert sorted(objects[i] for i in train) == ["blue", "green", "red"]  # every object once before repeats
        assert not {subjects[i] for i in train} & {subjects[i] for i in test}
        assert len(train) + len(test) + sum(subjects[i] in {subjects[j] for j in train} for i in range(12)
                                            if i not in train) == 12


def test_causality_cap_keeps_every_object_and_leaves_faithfulness_alone(tiny, monkeypatch, one_thread):
    """``max_causality`` edits at most that many pairs per trial, round-robin over their objects, drawn from its own
    seed stream: the trials' splits, filters and faithfulness are those of the uncapped run."""
    import numpy as np

    import mechfact
    from mechfact.llm.lre_authors import cap_pairs

    pairs = [(i, i + 100) for i in range(12)]
    objects = ["red"] * 8 + ["blue"] * 3 + ["green"]
    for seed in range(10):
        kept = cap_pairs(pairs, objects, 3, np.random.default_rng(seed))
        assert sorted(objects[i] for i, _ in kept) == ["blue", "green", "red"] and kept == sorted(kept)
    assert cap_pairs(pairs, objects, 20, np.random.default_rng(0)) == pairs
    from mechfact.llm import lre_authors as A

    # a deterministic judge (every fact known but the teal ones), so both runs filter the same facts
    monkeypatch.setattr(A, "prefix_match", lambda tok, token, objects: objects[0] != "teal")
    lm = tiny["models"]["llama"]
    rel = _noise_relation()
    kw = dict(layer=1, n_train=4, n_trials=2, chunk=16, ranks=[8, 48])
    full = mechfact.lre(lm, rel, **kw).to_dict()
    capped = mechfact.lre(lm, rel, max_causality=5, **kw).to_dict()
    assert capped["max_causality"] == 5 and full["max_causality"] is None
    for a, b in zip(full["trials"], capped["trials"]):
        assert a["n_causality"] == b["n_causality_candidates"] > 5 and b["n_causality"] == 5
        assert a["train_subjects"] == b["train_subjects"] and a["n_test"] == b["n_test"]
    assert capped["faithfulness_by_beta"] == full["faithfulness_by_beta"] and capped["causality_n"] <= 10
    with pytest.raises(ValueError, match="max_causality 5"):
        mechfact.lre(lm, rel, max_causality=5, protocol="mechfact", layer=1)


def _noise_relation(n=60, n_obj=6):
    from mechfact.llm.relations import Relation

    syll = ["ka", "lo", "mi", "ne", "pu", "ri", "so", "tu", "ve", "zo"]
    subjects = [syll[i % 10] + syll[(i // 10) % 10] + syll[(3 * i + 1) % 10] for i in range(n)]
    objects = ["red", "blue", "green", "pink", "grey", "teal"][:n_obj]
    return Relation("noise", ["The colour of {} is"], [(s, objects[i % n_obj]) for i, s in enumerate(subjects)])


def test_an_lre_that_answers_the_best_constant_token_does_not_beat_a_constant(tiny, monkeypatch, one_thread):
    """A planted LRE that decodes every subject to one token, " University" (an operator collapsed onto its
    bias), on a relation whose objects are half "University of X" and half other names: F is the share of
    University objects, exactly what the best constant first token gets on the same facts, so the paired
    per-relation test (trials, then subjects) finds a difference of 0 with p 1 and the page says F does not
    beat it -- while the majority object (one university of six) is beaten by a wide margin, which is what
    the page concluded before it had the constant token. The constant is chosen by the real rule: the longest
    most-shared token prefix."""
    import torch

    import mechfact
    from mechfact.llm import lre_authors as A
    from mechfact.llm.relations import Relation
    from probes import families as F

    U = 7  # the token the planted operator always decodes to; its text is "university"
    monkeypatch.setattr(A, "_vocab_strings", lambda tok: frozenset({"u", "university", "uni", "m", "cal"}))
    monkeypatch.setattr(A, "decode_top", lambda lm, o: torch.full((o.shape[0],), U))
    # the judge: the planted token is right on University objects; the model's own answers all count as known
    monkeypatch.setattr(A, "prefix_match", lambda tok, token, objects: str(objects[0]).lower().startswith(
        "university") if int(token) == U else True)
    syll = ["ka", "lo", "mi", "ne", "pu", "ri", "so", "tu", "ve", "zo"]
    objects = [f"University of {c}" for c in "ABC"] + ["MIT", "Caltech", "Cambridge"]
    facts = [(syll[i % 10] + syll[(i // 10) % 10] + syll[(3 * i + 1) % 10], objects[i % 6]) for i in range(48)]
    rel = Relation("person university", ["{} studied at"], facts)
    d = mechfact.lre(tiny["models"]["llama"], rel, layer=1, n_train=4, n_trials=4, chunk=16,
                     max_causality=0).to_dict()
    assert all(t["constant_token"] == "university" for t in d["trials"] if not t["skipped"])
    assert d["faithfulness"] == pytest.approx(0.5, abs=0.1)
    assert d["constant_token_baseline"] == d["faithfulness"] and d["majority_baseline"] < 0.3
    assert d["intervals"] == "trials+subjects" and d["causality"] is None
    diff, lo, hi, p = d["faithfulness_vs_constant_token_by_beta"]["2.25"]
    assert diff == 0 and lo == hi == 0 and p == 1.0
    diff, lo, hi, p = d["faithfulness_vs_majority_by_beta"]["2.25"]
    assert diff > 0.2 and lo > 0 and p < 0.01
    rows = {m: {} for m in F.MODELS}
    for k in range(3):
        rows[F.MODELS[0]][f"{rel.name} {k}"] = {**d, "relation": f"{rel.name} {k}", "part": "factual"}
    A.add_model_beta(list(rows[F.MODELS[0]].values()))
    table = F.relation_tests_table(rows)
    line = next(l for l in table.splitlines() if l.startswith(f"| {F.MODELS[0]} | {rel.name} 0 |"))
    const, maj = line.split(" | ")[2:4]
    assert const.endswith("does not beat it") and maj.rstrip(" |").endswith("beats it"), line
    assert "beats the best constant first token on 0 of 3 relations" in table


def test_lre_on_answers_unrelated_to_the_model_scores_chance_and_selection_sees_training_facts_only(
        tiny, monkeypatch, one_thread):
    """Every "is this right" is a fair coin, whatever the model says: the number reported (beta chosen on the
    training facts) sits at 0.5 with a wide interval, and the beta and rank selectors only ever receive the
    training facts' counts (n_train per trial), never the scored test facts."""
    import numpy as np

    import mechfact
    from mechfact.llm import lre_authors as A

    coin = np.random.default_rng(0)
    monkeypatch.setattr(A, "prefix_match", lambda tok, token, objects: bool(coin.random() < 0.5))
    seen = {"beta": [], "rank": []}
    sb, sr = A.select_beta, A.select_rank
    monkeypatch.setattr(A, "select_beta", lambda hits, n, fixed: seen["beta"].append(n) or sb(hits, n, fixed))
    monkeypatch.setattr(A, "select_rank", lambda hits, n, ranks: seen["rank"].append(n) or sr(hits, n, ranks))
    lm = tiny["models"]["llama"]
    res = mechfact.lre(lm, _noise_relation(), layer=1, n_train=4, n_trials=3, chunk=16, ranks=[8, 48]).to_dict()
    assert res["n_trials"] == 3 and res["n_test"] >= 15
    lo, hi = res["faithfulness_train_beta_ci"]
    assert lo < 0.5 < hi and hi - lo > 0.12, res["faithfulness_train_beta_ci"]
    assert abs(res["faithfulness_train_beta"] - 0.5) < 0.2
    assert seen["beta"] and set(seen["beta"]) == {4 * 3}  # 4 leave-one-out training facts x 3 trials
    assert seen["rank"] and max(seen["rank"]) <= 4 * 3
    assert res["faithfulness_best_on_test_upper_bound"] >= res["faithfulness_train_beta"]


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
    from mechfact.llm.shared_heads import Heads, groups_by_head, head_of, states_shared
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


def test_lre_layer_sweep_equals_single_layer_runs(tiny, tmp_path, one_thread):
    """A sweep shares the trials' splits, known facts and edit targets across layers: each layer's row is the
    row of a single-layer run at that layer; the relation is reported at the layers its training facts choose."""
    from mechfact.llm.lre import LreConfig, run_llm_lre

    lm = tiny["models"]["qwen2"]
    opts = dict(relations=str(tiny["relations"]), relation_names=["tiny_colour"], n_train=2, facts="all", k_shot=2,
                chunk=16, n_trials=2, ranks=[4, 8])
    sweep = run_llm_lre(LreConfig(layers=[1, 0], **opts), tmp_path / "sweep", lm=lm)
    assert sweep["layers"] == [0, 1] and sweep["layer"] is None
    rows = {r["layer"]: r for r in sweep["per_relation_layer"]}
    assert set(rows) == {0, 1}
    added = ("edit_layer", "layer_selected_on", "model_beta", "faithfulness_model_beta")
    for layer in (0, 1):
        one = run_llm_lre(LreConfig(layer=layer, **opts), tmp_path / f"l{layer}", lm=lm)["per_relation"][0]
        assert {k: v for k, v in one.items() if not k.startswith(added)} == \
            {k: v for k, v in rows[layer].items() if not k.startswith(added)}
    best = sweep["per_relation"][0]
    rate = {l: r["train_faithfulness_by_beta"][str(r["train_beta"])] for l, r in rows.items()}
    rate = {l: h / n for l, (h, n) in rate.items()}
    assert best["layer"] == max(sorted(rate), key=lambda l: rate[l]) and best["layer_selected_on"] == "train"
    assert best["edit_layer"] in (0, 1) and [b["layer"] for b in best["by_layer"]] == [0, 1]
    assert (tmp_path / "sweep" / "fig_lre.png").exists()
    # the in-memory sweep: one result per layer, the run's layer rows number for number
    import mechfact
    from mechfact.llm.lre import lre, lre_sweep
    from mechfact.llm.relations import load_relations

    rel = load_relations(tiny["relations"], ["tiny_colour"])[0]
    api = {k: v for k, v in opts.items() if k not in ("relations", "relation_names")}
    res = lre_sweep(lm, rel, [1, 0], **api)
    assert [r.layer for r in res] == [0, 1] and res[-1].operator is not None
    for r in res:
        want = {k: v for k, v in rows[r.layer].items() if not k.startswith(added)}
        assert {k: v for k, v in r.records[0].items() if not k.startswith(added)} == want
        assert r["faithfulness"] == r.faithfulness == rows[r.layer]["faithfulness"]
    with pytest.raises(TypeError, match="lre_sweep"):
        lre(lm, rel, [0, 1], **api)
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        res[0].nonsense
    assert mechfact.lre is lre
    with pytest.raises(ValueError, match="--layer 1 and --layers"):
        LreConfig(layer=1, layers=[0, 1])
    with pytest.raises(ValueError, match="--layers 5: out of range"):
        run_llm_lre(LreConfig(layers=[0, 5], **opts), tmp_path / "bad", lm=lm)


def test_an_interrupted_relation_resumes_at_its_next_trial_with_the_same_numbers(tiny, tmp_path, monkeypatch,
                                                                                 one_thread):
    """The authors' protocol keeps a relation's finished trials: a run killed in trial 3 of 4 resumes there (trials
    1-2 are not recomputed) and writes the uninterrupted run's result.json; the checkpoint goes once the
    relation's rows are in result.json. A checkpoint of other facts is ignored."""
    from mechfact.llm import lre_authors
    from mechfact.llm.lre import TRIALS_DIR, LreConfig, run_llm_lre

    lm = tiny["models"]["qwen2"]
    cfg = LreConfig(relations=str(tiny["relations"]), relation_names=["tiny_colour"], n_train=2, facts="all",
                    k_shot=2, chunk=16, n_trials=4, ranks=[4, 8], layers=[0, 1])
    whole = run_llm_lre(cfg, tmp_path / "whole", lm=lm)
    assert whole["per_relation"][0]["n_trials"] == 4

    real, calls = lre_authors.states_at, []

    def dies_in_trial_3(*a, **k):  # states_at runs once per trial, first thing after the split
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")
        return real(*a, **k)

    monkeypatch.setattr(lre_authors, "states_at", dies_in_trial_3)
    with pytest.raises(KeyboardInterrupt):
        run_llm_lre(cfg, tmp_path / "cut", lm=lm)
    ck = list((tmp_path / "cut" / TRIALS_DIR).glob("*.npz"))
    assert len(ck) == 1
    calls.clear()
    again = run_llm_lre(cfg, tmp_path / "cut", lm=lm)
    assert len(calls) == 2  # trials 3 and 4 only
    assert again["per_relation"] == whole["per_relation"]
    assert again["per_relation_layer"] == whole["per_relation_layer"]
    assert not (tmp_path / "cut" / TRIALS_DIR).exists()
    assert json.loads((tmp_path / "cut" / "result.json").read_text()) == \
        json.loads((tmp_path / "whole" / "result.json").read_text())

    # a checkpoint written for other facts (same relation name) is not resumed: all 4 trials run again
    from mechfact.llm.relations import Relation, load_relations

    rel = load_relations(tiny["relations"], ["tiny_colour"])[0]
    other = Relation(rel.name, rel.prompt_templates, list(zip(rel.subjects, reversed(rel.objects))), kind=rel.kind)
    calls.clear()
    monkeypatch.setattr(lre_authors, "states_at", dies_in_trial_3)
    path = tmp_path / "other.npz"
    with pytest.raises(KeyboardInterrupt):
        lre_authors.evaluate(lm, other, cfg, [0, 1], 0, checkpoint=path)
    assert path.is_file()
    calls.clear()
    monkeypatch.setattr(lre_authors, "states_at", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    rows, _ = lre_authors.evaluate(lm, rel, cfg, [0, 1], 0, checkpoint=path)
    assert len(calls) == 4
    assert [{k: v for k, v in r.items() if k in ("faithfulness", "causality", "n_trials")} for r in rows] == \
        [{k: v for k, v in r.items() if k in ("faithfulness", "causality", "n_trials")}
         for r in whole["per_relation_layer"]]


def test_one_known_fact_filter_with_both_rules_and_a_clear_error(tiny):
    """`knows`: the LRE authors' prefix rule counts " the" for "the United States"; the tracing rule does not (a
    generic word, not the attribute), nor a one-letter prefix of a longer object; an unknown rule is refused."""
    from mechfact.llm.prompts import knows

    tok = tiny["models"]["llama"].tokenizer
    text = {i: tok.decode([i]).strip() for i in range(len(tok))}
    the = next(i for i, t in text.items() if t.lower() == "the")
    word = next(i for i, t in text.items() if len(t) >= 3 and t.isalpha() and t.lower() not in ("the", "and"))
    letter = next(i for i, t in text.items() if len(t) == 1 and t.isalpha())
    ids = [the, word, letter]
    objects = ["the United States", text[word] + "ville", text[letter] + "xyz"]
    assert knows(tok, ids, objects, "prefix") == [True, True, True]
    assert knows(tok, ids, objects, "spells") == [False, True, False]
    with pytest.raises(ValueError, match="known 'exact': allowed values are spells, prefix"):
        knows(tok, ids, objects, "exact")


def test_the_rank_sweeps_default_and_the_authors():
    from mechfact.llm.lre_authors import AUTHORS_RANKS, rank_grid

    assert rank_grid(None, 576) == [16, 32, 64, 128, 256, 576] and rank_grid(None, 48) == [16, 32, 48]
    assert rank_grid(AUTHORS_RANKS, 576) == list(range(0, 320, 8)) and rank_grid(AUTHORS_RANKS, 48)[-1] == 48
