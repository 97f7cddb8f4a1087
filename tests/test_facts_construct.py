import math

import pytest
import torch

from mechfact import hooks
from mechfact.facts.construct import (attribute_vectors, build_cot, build_single_hop, construction_d, cot_construction_d,
                                      min_block_size, superpose)
from mechfact.facts.evaluate import evaluate, greedy_chain
from mechfact.facts.world import FactWorld


pytestmark = pytest.mark.usefixtures("one_thread")


def test_superpose_block_layout():
    w = FactWorld(5, 3, seed=0)
    a = attribute_vectors(5, 4, seed=0)
    x = superpose(a, w.perms)
    assert x.shape == (5, 12)
    for s in range(5):
        for r in range(3):
            assert torch.equal(x[s, 4 * r: 4 * r + 4], a[w.perms[r, s]])


def test_attributes_are_n0_i_over_b():
    a = attribute_vectors(4000, 16, seed=1)
    assert a.pow(2).sum(1).mean().item() == pytest.approx(1.0, abs=0.03)


def test_construction_n256_r4():
    w = FactWorld(256, 4, seed=0)
    b = 24
    model = build_single_hop(w, b, seed=0)
    assert model.cfg.d == construction_d(4, b) == 100
    res = evaluate(model, w)
    assert res["accuracy"] >= 0.99 and min(res["per_relation"]) >= 0.99


def test_construction_is_a_relation_gated_selector():
    w = FactWorld(64, 3, seed=2)
    b = 20
    model = build_single_hop(w, b, seed=2)
    q = w.single_hop()
    _, cache = model.run_with_cache(q.tokens)
    post = cache[hooks.mlp_post(0)][:, 1]  # relation position, (queries, 2 R b)
    unit_relation = torch.arange(2 * 3 * b) // (2 * b)
    active = post > 0
    assert not (active & (unit_relation[None] != q.relations[:, :1])).any()  # only the queried block's units fire
    assert (cache[hooks.mlp_post(0)][:, 0] == 0).all()  # silent at the subject position
    # swapping the relation token selects the other relation's attribute
    swapped = q.tokens.clone()
    swapped[:, 1] = w.n_entities + (q.relations[:, 0] + 1) % 3
    pred = model(swapped)[:, 1].argmax(-1)
    assert (pred == w.perms[(q.relations[:, 0] + 1) % 3, q.subjects]).double().mean() >= 0.95
    # ablating the gating units destroys recall
    ablated = model.run_with_hooks(q.tokens, fwd_hooks=[(hooks.mlp_post(0), lambda a, hook: a * 0)])
    assert (ablated[:, 1].argmax(-1) == q.answers).double().mean() < 0.5


def test_block_size_grows_like_log_n():
    b64, r64 = min_block_size(64, 4, seed=0)
    b1024, r1024 = min_block_size(1024, 4, seed=0, start=b64)
    assert r64["accuracy"] >= 0.99 and r1024["accuracy"] >= 0.99
    assert b1024 > b64  # b64 is not enough for 16x more entities ...
    log_ratio = math.log(1024) / math.log(64)  # 1.67
    assert b1024 / b64 <= 2 * log_ratio  # ... but b grows like log N, not like N (ratio 16)


def test_construction_errors():
    w = FactWorld(8, 2)
    with pytest.raises(ValueError, match="block_size=0"):
        build_single_hop(w, 0)
    with pytest.raises(ValueError, match="expected \\(N, block_size\\) = \\(8, 3\\)"):
        build_single_hop(w, 3, attributes=torch.zeros(8, 4))
    with pytest.raises(ValueError, match="hops=0"):
        build_cot(w, 0, 3)
    with pytest.raises(ValueError, match="n_entities=8, n_relations=2 but the world has 9, 2"):
        evaluate(build_single_hop(w, 3), FactWorld(9, 2))


@pytest.mark.parametrize("hops", [1, 2, 4])
def test_cot_construction(hops):
    w = FactWorld(64, 3, seed=1)
    b = 24
    assert evaluate(build_single_hop(w, b, seed=1), w)["accuracy"] == 1.0
    model = build_cot(w, hops, b, seed=1)
    assert model.cfg.d == cot_construction_d(3, b, hops) and model.cfg.mlp_width == 2 * 3 * b
    q = w.k_hop(hops, cot=True, n=300, seed=0)
    res = evaluate(model, w, q)
    assert res["accuracy"] == 1.0  # teacher-forced, whole chains
    chain = greedy_chain(model, w, q.subjects, q.relations)
    assert torch.equal(chain, w.apply(q.subjects, q.relations))  # free-running generation agrees
    # the head gathers (entity, relation) half/half at the first answer position
    _, cache = model.run_with_cache(q.tokens[:2])
    pattern = cache[hooks.attn_pattern(0)][0, 0, hops]
    assert pattern[:2].sum().item() == pytest.approx(1.0) and pattern[0].item() == pytest.approx(0.5)
