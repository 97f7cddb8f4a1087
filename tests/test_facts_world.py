import pytest
import torch

from mechfact.facts.world import IGNORE, FactWorld, Queries


pytestmark = pytest.mark.usefixtures("one_thread")


def test_perms_are_seeded_bijections():
    w = FactWorld(16, 3, seed=5)
    assert w.perms.shape == (3, 16)
    for r in range(3):
        assert torch.equal(w.perms[r].sort().values, torch.arange(16))
    assert w == FactWorld(16, 3, seed=5)
    assert not torch.equal(w.perms, FactWorld(16, 3, seed=6).perms)
    # relation r's permutation does not depend on how many relations exist
    assert torch.equal(FactWorld(16, 5, seed=5).perms[:3], w.perms)


def test_token_layout_and_single_hop():
    w = FactWorld(10, 3, seed=0)
    assert (w.vocab_size, w.pad_token, w.relation_token(2)) == (14, 13, 12)
    q = w.single_hop()
    assert q.kind == "single" and len(q) == w.n_facts == 30 and q.tokens.shape == (30, 2)
    s, r = q.tokens[:, 0], q.tokens[:, 1] - 10
    assert torch.equal(s, torch.arange(10).repeat_interleave(3))  # subject-major
    assert torch.equal(r, torch.arange(3).repeat(10))
    assert (q.targets[:, 0] == IGNORE).all()
    assert torch.equal(q.targets[:, 1], w.perms[r, s])
    assert torch.equal(q.answers, w.perms[r, s])


def test_k_hop_direct():
    w = FactWorld(8, 3, seed=1)
    q = w.k_hop(2)
    assert q.kind == "direct" and len(q) == 8 * 3**2 and q.tokens.shape == (72, 3)
    s, r1, r2 = q.tokens[:, 0], q.tokens[:, 1] - 8, q.tokens[:, 2] - 8
    expected = w.perms[r2, w.perms[r1, s]]
    assert torch.equal(q.targets[:, 2], expected) and torch.equal(q.answers, expected)
    assert (q.targets[:, :2] == IGNORE).all()
    assert len({tuple(t) for t in q.tokens.tolist()}) == 72  # every chain exactly once


def test_k_hop_cot_positions():
    w = FactWorld(8, 2, seed=2)
    k = 3
    q = w.k_hop(k, cot=True, n=20, seed=0)
    assert q.tokens.shape == (20, 2 * k)
    chain = w.apply(q.subjects, q.relations)
    assert torch.equal(q.tokens[:, 1: k + 1], q.relations + 8)
    assert torch.equal(q.tokens[:, k + 1:], chain[:, :-1])  # emitted intermediates e1..e_{k-1}
    assert (q.targets[:, :k] == IGNORE).all()
    assert torch.equal(q.targets[:, k:], chain)  # position k -> e1, ..., position 2k-1 -> ek
    # one hop with CoT is exactly the single-hop query
    one = w.k_hop(1, cot=True)
    assert torch.equal(one.tokens, w.single_hop().tokens) and torch.equal(one.targets, w.single_hop().targets)


def test_sampled_queries_are_seeded():
    w = FactWorld(50, 4, seed=0)
    assert w.k_hop(3, n=30, seed=1) == w.k_hop(3, n=30, seed=1)
    assert w.k_hop(3, n=30, seed=1) != w.k_hop(3, n=30, seed=2)


def test_split_subjects():
    w = FactWorld(40, 2, seed=3)
    train, held = w.split_subjects(0.25)
    assert len(held) == 10 and len(train) == 30
    assert torch.equal(torch.cat([train, held]).sort().values, torch.arange(40))
    q = w.single_hop(subjects=held)
    assert set(q.subjects.tolist()) == set(held.tolist()) and len(q) == 20
    assert torch.equal(w.split_subjects(0.25)[1], held)


def test_world_json_round_trip(tmp_path):
    w = FactWorld(12, 3, seed=9)
    w.save_json(tmp_path / "world.json")
    assert FactWorld.load_json(tmp_path / "world.json") == w


@pytest.mark.parametrize("make", [lambda w: w.single_hop(), lambda w: w.k_hop(2),
                                  lambda w: w.k_hop(3, cot=True, n=17)])
def test_queries_round_trip(tmp_path, make):
    q = make(FactWorld(6, 2, seed=0))
    q.save_json(tmp_path / "q.json")
    assert Queries.load_json(tmp_path / "q.json") == q
    ds = q.to_dataset()
    assert len(ds) == len(q) and set(ds.column_names) >= {"tokens", "targets"}
    assert Queries.from_dataset(ds) == q


@pytest.mark.parametrize("call, match", [
    (lambda: FactWorld(10, 0), "n_relations=0"),
    (lambda: FactWorld(1, 2), "n_entities"),
    (lambda: FactWorld(10, 2).k_hop(0), "hops=0"),
    (lambda: FactWorld(10, 2).single_hop(subjects=[3, 10]), "subject 10"),
    (lambda: FactWorld(3, 1, perms=torch.tensor([[0, 0, 1]])), "not a permutation"),
    (lambda: FactWorld(100, 10).k_hop(6), "pass n="),
    (lambda: FactWorld(10, 2).split_subjects(1.0), "heldout_fraction"),
    (lambda: FactWorld(10, 2.5), "n_relations"),
])
def test_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_attribute_pool_worlds():
    w = FactWorld(64, 3, seed=5, attributes=8)
    assert not w.is_bijective and w.n_attributes == 8
    for r in range(3):  # balanced: every attribute is the value of exactly N / A = 8 subjects per relation
        assert torch.equal(torch.bincount(w.perms[r], minlength=8), torch.full((8,), 8))
    assert not torch.equal(w.perms[0], w.perms[1])
    assert FactWorld(64, 3, seed=5, attributes=8) == w and FactWorld.from_dict(w.to_dict()) == w
    assert "attributes=8" in repr(w)
    # attributes = N is the bijection world, draw for draw; files from before pools load as bijections
    b = FactWorld(64, 3, seed=5)
    assert b.is_bijective and FactWorld(64, 3, seed=5, attributes=64) == b
    old = {k: v for k, v in b.to_dict().items() if k != "n_attributes"}
    assert FactWorld.from_dict(old) == b
    q = w.single_hop()
    assert int(q.answers.max()) < 8
    for bad, msg in ((1, r"attributes=1: must be an integer >= 2"), (65, r"attributes=65: .* <= n_entities=64")):
        with pytest.raises(ValueError, match=msg):
            FactWorld(64, 3, attributes=bad)
    with pytest.raises(ValueError, match=r"perms\[0\] has values outside the attribute pool 0..7"):
        FactWorld(64, 3, perms=torch.full((3, 64), 9), attributes=8)
