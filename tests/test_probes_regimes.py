"""The probes' verdict on both sides of the regime boundary, on a small trained model (slow tier).

Plain training (Adam, stopped at 100%) leaves the random initialisation in the
subject embeddings and no linear superposition (held-out R^2 ~ 0.5); a coupled
L2 penalty trained past 100% makes the embeddings a superposition of their
attribute vectors (held-out R^2 ~ 0.9). docs/results_probes.md.
"""

import pytest

from mechfact.facts import FactModel, FactModelConfig, FactWorld, TrainConfig, train
from mechfact.probes.experiments import superposition

RETRAIN = dict(lr=1e-2, target_accuracy=None)


@pytest.mark.slow
def test_l2_regime_gives_superposition_plain_does_not(one_thread):
    world = FactWorld(128, 4, seed=0)
    r2 = {}
    for name, cfg in (("plain", TrainConfig(lr=1e-2, steps=1000, target_accuracy=1.0, eval_every=10)),
                      ("l2", TrainConfig(lr=1e-2, steps=1500, l2=1e-3, eval_every=500, target_accuracy=None))):
        model = FactModel(FactModelConfig(128, 4, d=32, mlp_width=32, seed=0))
        assert train(model, world, cfg)["accuracy"] == 1.0
        res = superposition(model, world)
        assert abs(res.control_r2_heldout) < 0.05
        r2[name] = res.r2_heldout
    assert r2["l2"] >= 0.85 and r2["plain"] <= 0.7, r2


@pytest.mark.slow
def test_frozen_network_takes_new_facts_only_in_attribute_pool_worlds(one_thread):
    """Bijection worlds let the network co-adapt to which attributes co-occur; pool worlds do not.

    Same model and optimiser; only the world differs (bijections vs a pool of 16 attributes).
    Measured (N = 256, R = 4, d = 64, m = 128): retrained-new 0.66 vs 0.997, zero-shot 0.15 vs 0.55.
    """
    from mechfact.targets import freeze_and_swap

    res = {}
    for A in (None, 16):
        world = FactWorld(256, 4, seed=0, attributes=A)
        model = FactModel(FactModelConfig(256, 4, d=64, mlp_width=128, seed=0))
        assert train(model, world, TrainConfig(lr=1e-2, steps=1000, target_accuracy=1.0,
                                               eval_every=10))["accuracy"] == 1.0
        sw = freeze_and_swap(model, world, sfit=superposition(model, world).fit,
                             retrain=TrainConfig(steps=200, eval_every=50, **RETRAIN))
        assert sw.control_relearn_accuracy >= 0.99  # the frozen network always relearns its OWN facts
        res[A] = sw
    assert res[None].retrained_accuracy <= 0.8 and res[16].retrained_accuracy >= 0.95
    assert res[16].chance == 1 / 16 and res[None].chance == 1 / 256
    assert res[16].zero_shot_accuracy >= 0.4 and res[16].zero_shot_accuracy >= 5 * res[16].zero_shot_control_accuracy
    assert res[16].zero_shot_accuracy >= 2 * res[None].zero_shot_accuracy


@pytest.mark.slow
def test_geometric_regime_meets_the_papers_bar_in_pool_worlds(one_thread):
    """The issue's bar for trained models -- held-out superposition R^2 >= 0.9 AND zero-shot freeze-and-swap
    >= 0.8 -- in one regime: squared-error loss + coupled L2 + zero-initialised subject embeddings
    (REGIMES["geometric"]), on a world whose relations map 256 subjects into a pool of 16 attributes.
    The default regime on the same world stays below it. Measured (N = 256, R = 4): geometric R^2 0.96,
    zero-shot 0.99 (control 0.07, chance 1/16); plain R^2 0.5, zero-shot 0.5.
    """
    from mechfact.facts.regimes import REGIMES
    from mechfact.targets import freeze_and_swap

    world = FactWorld(256, 4, seed=0, attributes=16)
    out = {}
    for name in ("plain", "geometric"):
        model, res = REGIMES[name].fit(world, seed=0)
        assert res["accuracy"] == 1.0
        sup = superposition(model, world)
        assert abs(sup.control_r2_heldout) < 0.05
        sw = freeze_and_swap(model, world, sfit=sup.fit, retrain=TrainConfig(steps=100, eval_every=50, **RETRAIN))
        assert sw.zero_shot_control_accuracy <= 2 * sw.chance
        out[name] = (sup.r2_heldout, sw.zero_shot_accuracy)
    assert out["geometric"][0] >= 0.9 and out["geometric"][1] >= 0.8, out
    assert out["plain"][0] <= 0.75 and out["plain"][1] <= 0.7, out


def test_the_swap_embedding_hook_follows_the_batches_of_a_large_query_set():
    """More queries than one batch (N R > 4096 at the pool page's N = 1024, R = 8): each batch writes its own
    queries' embeddings, so the accuracy is the one-batch accuracy; a per-query hook run on a batch of another
    size is refused by name."""
    import torch

    from mechfact.probes.queries import as_probe_set, predictions
    from mechfact.probes.swap import embedding_hook

    world = FactWorld(64, 4, seed=0, attributes=8)
    model = FactModel(FactModelConfig(64, 4, d=8, mlp_width=16, n_outputs=8))
    ps = as_probe_set(world)
    table = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    hook = embedding_hook(table, ps)
    whole = predictions(model, ps, [hook], batch_size=len(ps))
    assert torch.equal(predictions(model, ps, [hook], batch_size=50), whole)  # 256 queries in 6 batches
    assert not torch.equal(whole, predictions(model, ps))  # the hook changes the answers
    with pytest.raises(ValueError, match="embedding hook for 256 queries run on a batch of 50"):
        model.run_with_hooks(ps.tokens[:50], fwd_hooks=[hook])
