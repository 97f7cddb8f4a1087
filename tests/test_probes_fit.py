"""The probes' trainer: chosen tensors only, coupled L2, frozen tensors stay put."""

import pytest
import torch

from mechfact.facts import FactModel, FactModelConfig, FactWorld, evaluate
from mechfact.probes.fit import FitConfig, train_fact_model


def test_train_fact_model_freezes_and_learns(one_thread):
    world = FactWorld(24, 2, seed=0)
    model = FactModel(FactModelConfig(24, 2, d=16, mlp_width=32, seed=0))
    U0 = model.W_U_ent.detach().clone()
    hist = train_fact_model(model, world, FitConfig(lr=3e-2, steps=150, eval_every=50), freeze=("W_U_ent",))
    assert torch.equal(model.W_U_ent, U0)
    assert [h["step"] for h in hist] == [0, 50, 100, 150]
    assert hist[-1]["accuracy"] == evaluate(model, world)["accuracy"] >= 0.9


def test_l2_shrinks_weights(one_thread):
    world = FactWorld(24, 2, seed=0)
    norms = []
    for l2 in (0.0, 0.1):
        model = FactModel(FactModelConfig(24, 2, d=16, mlp_width=32, seed=0))
        train_fact_model(model, world, FitConfig(lr=3e-2, steps=100, l2=l2, eval_every=100))
        norms.append(float(model.W_E_ent.detach().norm()))
    assert norms[1] < 0.7 * norms[0]


def test_bad_fit_input():
    with pytest.raises(ValueError, match="FitConfig"):
        FitConfig(lr=0)
    world = FactWorld(8, 1, seed=0)
    with pytest.raises(ValueError, match="unknown parameters.*W_U_ent"):
        train_fact_model(FactModel(FactModelConfig(8, 1, d=4, mlp_width=4)), world, FitConfig(steps=1),
                         freeze=("W_U",))
    with pytest.raises(ValueError, match="loss='hinge': allowed"):
        FitConfig(loss="hinge")


def test_squared_answer_loss_matches_its_definition():
    from mechfact.probes.fit import answer_loss

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 3, 5, generator=g)
    pos, t = torch.tensor([0, 2, 1, 1, 0, 2]), torch.tensor([4, 0, 1, 3, 3, 2])
    z = logits[torch.arange(6), pos]
    ref = ((z - 2.0 * torch.nn.functional.one_hot(t, 5)) ** 2).sum(-1).mean()
    assert answer_loss(logits, pos, t, "mse", 2.0).item() == pytest.approx(ref.item(), rel=1e-6)
    assert answer_loss(logits, pos, t).item() == pytest.approx(torch.nn.functional.cross_entropy(z, t).item())
