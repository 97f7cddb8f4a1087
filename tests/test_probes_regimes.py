"""The probes' verdict on both sides of the regime boundary, on a small trained model (slow tier).

Plain training (Adam, stopped at 100%) leaves the random initialisation in the
subject embeddings and no linear superposition (held-out R^2 ~ 0.5); a coupled
L2 penalty trained past 100% makes the embeddings a superposition of their
attribute vectors (held-out R^2 ~ 0.9). docs/results_probes.md.
"""

import pytest
import torch

from mechfact.facts import FactModel, FactModelConfig, FactWorld
from mechfact.probes.experiments import superposition_of
from mechfact.probes.fit import FitConfig, train_fact_model


@pytest.mark.slow
def test_l2_regime_gives_superposition_plain_does_not(one_thread):
    world = FactWorld(128, 4, seed=0)
    r2 = {}
    for name, cfg in (("plain", FitConfig(lr=1e-2, steps=1000, target_accuracy=1.0, eval_every=10)),
                      ("l2", FitConfig(lr=1e-2, steps=1500, l2=1e-3, eval_every=500))):
        model = FactModel(FactModelConfig(128, 4, d=32, mlp_width=32, seed=0))
        assert train_fact_model(model, world, cfg)[-1]["accuracy"] == 1.0
        res = superposition_of(model, world)
        assert abs(res.control_r2_heldout) < 0.05
        r2[name] = res.r2_heldout
    assert r2["l2"] >= 0.85 and r2["plain"] <= 0.7, r2
