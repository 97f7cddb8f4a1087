"""The LRE in the authors' protocol (mechfact.llm.lre.protocol_authors) on tiny random models: the prefix match, the
prompts, the object-balanced split, train-side selection, the constant baselines, the causality cap, the layer
sweep, resumption trial by trial, the known-fact filter and the rank sweeps."""

import json

import numpy as np
import pytest
import torch


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

    from mechfact.llm.lre.protocol_authors import max_coverage_split

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

    import mechfact
    from mechfact.llm.lre.protocol_authors import cap_pairs

    pairs = [(i, i + 100) for i in range(12)]
    objects = ["red"] * 8 + ["blue"] * 3 + ["green"]
    for seed in range(10):
        kept = cap_pairs(pairs, objects, 3, np.random.default_rng(seed))
        assert sorted(objects[i] for i, _ in kept) == ["blue", "green", "red"] and kept == sorted(kept)
    assert cap_pairs(pairs, objects, 20, np.random.default_rng(0)) == pairs
    from mechfact.llm.lre import protocol_authors as A

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

    import mechfact
    from mechfact.llm.lre import protocol_authors as A
    from mechfact.llm.relations import Relation
    from probes import families as F, results_llm_lre as FL

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
    table = FL.relation_tests_table(rows)
    line = next(l for l in table.splitlines() if l.startswith(f"| {F.MODELS[0]} | {rel.name} 0 |"))
    const, maj = line.split(" | ")[2:4]
    assert const.endswith("does not beat it") and maj.rstrip(" |").endswith("beats it"), line
    assert "beats the best constant first token on 0 of 3 relations" in table


def test_lre_on_answers_unrelated_to_the_model_scores_chance_and_selection_sees_training_facts_only(
        tiny, monkeypatch, one_thread):
    """Every "is this right" is a fair coin, whatever the model says: the number reported (beta chosen on the
    training facts) sits at 0.5 with a wide interval, and the beta and rank selectors only ever receive the
    training facts' counts (n_train per trial), never the scored test facts."""

    import mechfact
    from mechfact.llm.lre import protocol_authors as A

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
    from mechfact.llm.lre import protocol_authors as lre_authors
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
    from mechfact.llm.lre.protocol_authors import AUTHORS_RANKS, rank_grid

    assert rank_grid(None, 576) == [16, 32, 64, 128, 256, 576] and rank_grid(None, 48) == [16, 32, 48]
    assert rank_grid(AUTHORS_RANKS, 576) == list(range(0, 320, 8)) and rank_grid(AUTHORS_RANKS, 48)[-1] == 48


def test_the_known_fact_filter_has_one_home_for_both_kinds_of_model():
    """Fact models (no tokenizer: the object is one token) and pretrained models (a tokenizer: the object's text)
    go through the same `knows`; the fact models' `known_indices` is it applied to the model's top tokens."""
    import torch

    from mechfact.llm import prompts
    from mechfact.probes import known
    from mechfact.probes.queries import ProbeSet

    assert known.knows(None, [3, 5, 7], [3, 4, 7]) == [True, False, True]
    assert known.knows(None, [3], [3], "spells") == [True]
    assert prompts.knows is known.knows and prompts.prefix_match is known.prefix_match

    class Tops(torch.nn.Module):  # answers token (subject + 1) % 4 at every position
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, tokens):
            return torch.nn.functional.one_hot((tokens + 1) % 4, 4).float()

    ps = ProbeSet(tokens=torch.tensor([[0, 9], [1, 9], [2, 9]]), subjects=torch.arange(3),
                  relations=torch.zeros(3, dtype=torch.long), objects=torch.arange(3),
                  object_tokens=torch.tensor([1, 3, 3]), subject_pos=torch.zeros(3, dtype=torch.long),
                  answer_pos=torch.zeros(3, dtype=torch.long))
    assert known.known_indices(Tops(), ps) == [0, 2]
