"""The one-call causal experiments of ``mechfact`` on a FactWorld, where the construction's mechanism gives the
answer: attributes stored in the subject embedding, carried by attention to the last position, the MLP there
selecting the relation's."""

import pytest


def test_knockout_of_the_subject_removes_the_fact(construction, one_thread):
    import mechfact

    model, world = construction
    s = mechfact.attention_knockout(model, world, window=1, max_facts=20).summary()
    assert s["n_facts"] == 20
    subj = s["change"]["subject"][0]
    assert subj["change"] < -90 and subj["change_ci"][1] < -90  # percent: the attribute arrives by attention
    assert s["change"]["relation"][0]["change_n"] == 0  # two-token queries: no relation position besides the last


def test_attribute_rate_sits_at_the_subject_from_the_embedding(construction, one_thread):
    import mechfact

    model, world = construction
    s = mechfact.attribute_rate(model, world, k=1, max_facts=20).summary()
    subj = {r["layer"]: r for r in s["rate"]["subject_last"]}
    last = {r["layer"]: r for r in s["rate"]["last"]}
    assert subj[-1]["rate"] == 1.0 and subj[-1]["baseline"] <= 0.25  # the embedding's top token: an attribute
    assert last[-1]["rate"] <= 0.2 and last[0]["rate"] == 1.0  # the relation token gets it only after the block


def test_attribution_patching_ranks_cells_as_exact_patching(construction, one_thread):
    import mechfact

    model, world = construction
    g = mechfact.attribution_patching(model, world, agreement=True, max_facts=10).summary()
    assert g["n_facts"] == 10 and g["spearman"] > 0.8 and g["spearman_ci"][0] > 0.75


def test_extraction_events_are_in_the_mlp(construction, one_thread):
    import mechfact

    model, world = construction
    s = mechfact.extraction_events(model, world, max_facts=20).summary()
    assert s["mlp_any"]["rate"] == 1.0 and s["attn_any"]["rate"] < 0.6


def test_relations_need_a_language_model(construction):
    import mechfact
    from mechfact.llm.relations import Relation

    model, _ = construction
    rel = Relation("colour", ["The colour of {} is"], [("zorb", "red"), ("plim", "blue")])
    for fn in (mechfact.state_transfer, mechfact.relation_selectivity):
        with pytest.raises(ValueError, match="relations need a LanguageModel; a fact model takes its FactWorld"):
            fn(model, rel)
