"""Attribute extraction (Geva et al. 2023): attention knockout, attribute rate, extraction events.

On the explicit construction the mechanism is known: every subject attribute sits in the subject embedding (block
``r`` holds ``a_{pi_r(s)}``, and the unembedding decodes block 0), uniform attention with identity OV carries the
subject to the relation token, and the relation-gated MLP there writes the queried attribute into block 0. So:
blocking the last position's attention to the subject leaves ``2 e_r`` there, every selector pair cancels and all
logits are 0 (p = 1/N exactly); blocking its attention to itself leaves ``x_s + e_r`` (checked against the block
computed by hand); the logit lens of the subject's state tops with ``pi_0(s)``, an attribute; the MLP update alone
decodes to the object for every fact, the attention update (``(x_s + e_r) / 2``) only where ``pi_0(s)`` is the
object. A random-weight model stores nothing: its attribute rate is the random-subject baseline, and knockouts
move its near-flat output little. On a tiny llama bridge, the batched knockout equals a plain per-row loop that
sets the attention scores to -inf.
"""

import numpy as np
import pytest
import torch

from llm_tiny import build_model, write_relations


@pytest.fixture(scope="module")
def known(construction):
    from mechfact.causal import trace_queries

    model, world = construction
    queries, counts = trace_queries(model, world)
    assert counts[0]["n_known"] == counts[0]["n_samples"] == 192  # the construction knows every fact
    return queries


def _relation(world, q):
    return int(q["tokens"][1]) - world.n_entities


def test_knockout_on_the_construction_follows_the_mechanism(construction, known, one_thread):
    from mechfact.probes import extraction

    model, world = construction
    res = extraction.attention_knockout(model, known)
    assert res.window == 1 and res.layers == (0,) and res.targets == ("subject", "relation", "last")
    N = world.n_entities
    p_clean = np.array([f.p_clean for f in res.facts])
    blocked = np.stack([f.p_blocked[:, 0] for f in res.facts])  # (facts, groups)
    ch = res.changes()[:, :, 0]
    assert p_clean.min() > 0.5
    # subject blocked: the last position holds 2 e_r only, the selector pairs cancel, every logit is 0
    assert np.allclose(blocked[:, 0], 1 / N, atol=1e-7)
    assert ch[:, 0].max() < -80
    # [s, r] has no relation token besides the last: an empty group, NaN, never run
    assert np.isnan(blocked[:, 1]).all() and all(f.groups["relation"] == () for f in res.facts)
    # last blocked: the last position reads the subject alone, resid_mid = x_s + e_r (computed by hand)
    W_E = model.W_E.detach()
    for f, q in list(zip(res.facts, known))[::17]:
        h = W_E[int(q["tokens"][0])] + W_E[int(q["tokens"][1])]
        with torch.no_grad():
            want = torch.softmax(model.final_logits(h + model.blocks[0].mlp(h[None])[0]), -1)[f.target]
        assert f.p_blocked[2, 0] == pytest.approx(float(want), abs=1e-6)
    s = res.summary()
    assert s["n_facts"] == 192 and s["change"]["relation"][0]["change"] is None
    assert s["change"]["relation"][0]["change_n"] == 0
    row = s["change"]["subject"][0]
    assert row["change_ci"][0] <= row["change"] <= row["change_ci"][1] < -80
    assert s["largest_drop_subject"]["layer"] == 0
    assert len(res.records) == 192 * 3 and res.records[1]["change"] is None
    d = res.to_dict()
    assert d["facts"][0]["groups"] == {"subject": [0], "relation": [], "last": [1]}


def test_attribute_rate_on_the_construction(construction, known, one_thread):
    from mechfact.probes import extraction

    model, world = construction
    res = extraction.attribute_rate(model, known, k=1, world=world,
                                    positions=("subject_first", "subject_last", "last"))
    assert res.layers == (-1, 0)
    rate, base = res.rates()
    # the subject's state (embedding, and 2 x_s after the block) decodes to pi_0(s), one of its attributes
    assert (rate[:, :2] == 1).all()
    # the last position: the relation embedding decodes to nothing (all logits 0); after the block the object
    assert (rate[:, 2, 1] == 1).all()
    s = res.summary()
    for pos in ("subject_last", "last"):
        row = s["rate"][pos][1]
        assert row["rate"] == 1.0 and row["baseline"] < 0.1 and row["excess_ci"][0] > 0.85, row
    # with k = 3 at most the one decoded attribute is certain: the rate is at least 1/3, the baseline near 3/64
    s3 = extraction.attribute_rate(model, known, k=3, world=world).summary()
    row = s3["rate"]["subject_last"][0]
    assert 1 / 3 <= row["rate"] < 0.5 and row["baseline"] < 0.1
    assert len(res.records) == 192 * 3 * 2 and {"rate", "baseline", "position"} <= set(res.records[0])
    assert res.to_dict()["facts"][0]["n_attributes"] == len(set(world.perms[:, 0].tolist()))


def test_extraction_events_on_the_construction(construction, known, one_thread):
    from mechfact.probes import extraction

    model, world = construction
    res = extraction.extraction_events(model, known)
    objects = np.array([int(world.perms[_relation(world, q), int(q["tokens"][0])]) for q in known])
    first = np.array([int(world.perms[0, int(q["tokens"][0])]) for q in known])
    assert np.array_equal([f.target for f in res.facts], objects)
    ev = res.events()[:, :, 0]
    assert ev[:, 1].all()  # the MLP writes the queried attribute
    assert np.array_equal(ev[:, 0], first == objects)  # attention carries x_s, whose block 0 is pi_0(s)
    s = res.summary()
    assert s["mlp"][0]["rate"] == 1.0
    assert s["attn"][0]["rate"] == pytest.approx(np.mean(first == objects)) and 0.25 < s["attn"][0]["rate"] < 0.45
    assert s["attn_any"]["rate"] == s["attn"][0]["rate"] and s["attn"][0]["rate_n"] == 192
    assert len(res.records) == 192 * 2


def test_random_weights_store_no_attributes(construction, one_thread):
    from mechfact.facts.model import build_fact_model
    from mechfact.probes import extraction, tracing
    from mechfact.probes.queries import ProbeSet

    _, world = construction
    model = build_fact_model(world, d=32, mlp_width=64, seed=3)
    queries = tracing.fact_queries(ProbeSet.from_world(world))
    s = extraction.attribute_rate(model, queries, k=8, world=world).summary()
    for pos, rows in s["rate"].items():
        for row in rows:  # chance: about 3 attributes of 64 entities in either set
            assert row["rate"] < 0.1 and abs(row["excess"]) < 0.04, (pos, row)
    ko = extraction.attention_knockout(model, queries).summary()
    assert ko["p_clean"] < 0.1  # near-flat output: nothing known, nothing to knock out
    for g in ("subject", "last"):
        assert abs(ko["change"][g][0]["change"]) < 10, ko["change"][g]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from mechfact.llm.models.loading import load_model

    root = tmp_path_factory.mktemp("extraction_tiny")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    lm = load_model(str(build_model("llama", root / "llama")))
    torch.set_num_threads(n)
    return lm, write_relations(root / "relations")


def _llm_queries(lm, rels, n=4):
    from mechfact.llm.prompts import build_prompts
    from mechfact.llm.relations import load_relations

    out = []
    for rel in load_relations(rels):
        for i, p in enumerate(build_prompts(rel, lm.tokenizer, lm.bos_id, k=1, template=1, seed=0)[:n]):
            out.append({"tokens": torch.tensor(p.tokens), "subject": (p.subject_first, p.subject_last),
                        "index": len(out), "subject_text": p.subject, "relation": rel.name})
    return out


def _scores_hook(layer):
    """The pre-softmax attention scores of a bridge block (next to its pattern)."""
    from mechfact import hooks

    return hooks.attn_scores(layer)


@torch.no_grad()
def _reference(lm, tokens, blocked, layers):
    """One plain forward pass: the last row's scores at ``blocked`` set to -inf in ``layers``; p of every token."""
    def block(x, hook):
        x = x.clone()
        x[:, :, -1, blocked] = float("-inf")
        return x
    logits = lm.run_with_hooks(tokens[None], fwd_hooks=[(_scores_hook(l), block) for l in layers])
    return torch.softmax(logits[0, -1].float(), -1)


@pytest.mark.parametrize("window", [1, 3])
def test_batched_knockout_equals_a_plain_loop_on_a_bridge(tiny_llama, window, one_thread):
    from mechfact.probes import extraction
    from mechfact.probes.tracing import window_layers

    lm, rels = tiny_llama
    queries = _llm_queries(lm, rels, 2)
    res = extraction.attention_knockout(lm, queries, window=window, batch_rows=4)  # 9 rows: 3 batches
    L = lm.n_layers
    spread = []
    for f, q in zip(res.facts, queries):
        tokens = q["tokens"]
        n = len(tokens)
        s0, s1 = q["subject"]
        assert int(tokens[0]) == lm.bos_id and s0 > 0
        groups = {"subject": list(range(s0, s1 + 1)), "relation": [t for t in range(1, n - 1) if not s0 <= t <= s1],
                  "last": [n - 1]}  # the BOS at 0 stays out of every group
        assert {k: list(v) for k, v in f.groups.items()} == groups and groups["relation"]
        clean = _reference(lm, tokens, [], [])
        assert f.target == int(clean.argmax()) and f.p_clean == pytest.approx(float(clean.max()), rel=1e-5)
        for g, name in enumerate(res.targets):
            for k, layer in enumerate(res.layers):
                want = float(_reference(lm, tokens, groups[name], window_layers(layer, window, L))[f.target])
                assert f.p_blocked[g, k] == pytest.approx(want, rel=1e-5, abs=1e-9), (name, layer)
                spread.append(want / f.p_clean - 1)
    assert max(abs(x) for x in spread) > 100 * 1e-5  # the knockouts move p far more than the tolerance


def test_bridge_pattern_hook_is_the_attention_used(tiny_llama, one_thread):
    """Zeroing and renormalising the pattern at the knockout hook equals -inf scores; and changes the output."""
    from mechfact.probes import extraction

    lm, rels = tiny_llama
    tokens = _llm_queries(lm, rels, 1)[0]["tokens"]
    blocked = [1, 2]

    def renorm(x, hook):
        x = x.clone()
        x[:, :, -1, blocked] = 0
        return x / x.sum(-1, keepdim=True)
    with torch.no_grad():
        base = lm(tokens[None])[0, -1]
        via_pattern = lm.run_with_hooks(tokens[None], fwd_hooks=[(extraction.knockout_hook(0), renorm)])[0, -1]
        via_scores = _reference(lm, tokens, blocked, [0])
    assert (via_pattern - base).abs().max() > 1e-3
    assert torch.allclose(torch.softmax(via_pattern.float(), -1), via_scores, atol=1e-6)


def test_attribute_rate_and_events_on_a_bridge_equal_the_cache(tiny_llama, one_thread):
    from mechfact import hooks
    from mechfact.llm.relations import load_relations
    from mechfact.probes import extraction

    lm, rels = tiny_llama
    queries = extraction.relation_attributes(lm.tokenizer, _llm_queries(lm, rels, 3), load_relations(rels))
    assert all(len(q["attributes"]) == 1 for q in queries)  # each tiny subject has one relation
    k = 20
    ar = extraction.attribute_rate(lm, queries, k=k, batch_size=2)
    ev = extraction.extraction_events(lm, queries, batch_size=2)
    L = lm.n_layers
    assert ar.layers == tuple(range(-1, L)) and ev.layers == tuple(range(L))
    for q, fa, fe in zip(queries, ar.facts, ev.facts):
        with torch.no_grad():
            logits, cache = lm.run_with_cache(q["tokens"][None])
        assert fe.target == int(logits[0, -1].argmax())
        for p, pos in enumerate((q["subject"][1], len(q["tokens"]) - 1)):
            for j, layer in enumerate(ar.layers):
                x = cache[hooks.resid(0, "pre") if layer < 0 else hooks.resid(layer, "post")][0, pos]
                top = lm.final_logits(x[None])[0].topk(k).indices.tolist()
                assert fa.rate[p, j] == pytest.approx(len(set(top) & set(q["attributes"])) / k)
        for s, name in enumerate((hooks.attn_out, hooks.mlp_out)):
            for layer in range(L):
                assert fe.top[s, layer] == int(lm.final_logits(cache[name(layer)][0, -1][None])[0].argmax())
    assert all(queries[f.control]["subject_text"] != q["subject_text"] for q, f in zip(queries, ar.facts))
    s = ar.summary()
    assert s["rate"]["last"][0]["rate_n"] == len(queries) and 0 <= s["rate"]["last"][-1]["rate"] <= 1
    assert set(ev.summary()) == {"n_facts", "attn", "attn_any", "mlp", "mlp_any"}


def test_bad_input_is_named(construction, known, tiny_llama):
    from mechfact.probes import extraction

    model, world = construction
    lm, _ = tiny_llama
    q = known[:2]
    with pytest.raises(ValueError, match=r"window 4: must be an integer in 1\.\.3"):
        extraction.attention_knockout(lm, q, window=4)
    with pytest.raises(ValueError, match=r"window 0: must be an integer in 1\.\.1"):
        extraction.attention_knockout(model, q, window=0)
    with pytest.raises(ValueError, match="target group 'object': allowed subject, relation, last"):
        extraction.attention_knockout(model, q, targets=["subject", "object"])
    with pytest.raises(ValueError, match="targets 'subject': a non-empty list"):
        extraction.attention_knockout(model, q, targets="subject")
    with pytest.raises(ValueError, match=r"layers \[1\]: allowed 0\.\.0"):
        extraction.attention_knockout(model, q, layers=[1])
    with pytest.raises(ValueError, match="queries is empty"):
        extraction.attention_knockout(model, [])
    with pytest.raises(ValueError, match="queries is empty"):
        extraction.extraction_events(model, [])
    with pytest.raises(ValueError, match="queries is empty"):
        extraction.attribute_rate(model, [], world=world)
    with pytest.raises(ValueError, match=r"k 0: must be an integer in 1\.\.64"):
        extraction.attribute_rate(model, q, k=0, world=world)
    with pytest.raises(ValueError, match=r"k 65: must be an integer in 1\.\.64"):
        extraction.attribute_rate(model, q, k=65, world=world)
    with pytest.raises(ValueError, match="position 'relation': allowed subject_first, subject_last, last"):
        extraction.attribute_rate(model, q, positions=["relation"], world=world)
    with pytest.raises(ValueError, match="queries without attributes"):
        extraction.attribute_rate(model, q)
    with pytest.raises(ValueError, match=r"subject tokens 1\.\.1 must lie inside the prompt before its last"):
        extraction.attention_knockout(model, [{"tokens": torch.tensor([0, 65]), "subject": (1, 1)}])
