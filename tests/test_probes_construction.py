"""The probes on the explicit construction, where the geometric mechanism holds by design.

These numbers are the probes' own correctness tests: a wrong readout, fit,
patching engine or swap fails them.
"""

import numpy as np
import pytest
import torch

from mechfact.facts import FactWorld, build_single_hop
from mechfact.probes.experiments import superposition
from mechfact.facts import TrainConfig
from mechfact.probes.patching import ablate_relation_units, relation_swap, selectivity
from mechfact.probes.queries import ProbeSet
from mechfact.probes.readout import readout
from mechfact.targets import freeze_and_swap
from mechfact.probes.weights import scores_and_spectra

N, R, B = 128, 4, 24


@pytest.fixture(scope="module")
def cons():
    torch.set_num_threads(1)
    world = FactWorld(N, R, seed=0)
    return build_single_hop(world, B), world


def test_superposition_recovers_blocks(cons):
    model, world = cons
    res = superposition(model, world, seed=0)
    assert res.r2_train > 0.99 and res.r2_heldout >= 0.95
    assert res.control_r2_heldout < 0.1  # unrelated permutations explain nothing
    ov = np.asarray(res.block_overlap)
    assert np.allclose(np.diag(ov), 1.0) and ov[~np.eye(R, dtype=bool)].max() < 1e-6  # disjoint blocks
    assert np.allclose(res.per_relation_variance_share, 1 / R, atol=0.02)
    assert abs(res.attribute_coadaptation_r2) < 0.05  # independent random attribute vectors
    assert res.n_features == R * B < res.n_train


def test_readout_heldout_subjects(cons):
    model, world = cons
    res = readout(model, ProbeSet.from_world(world), ["hook_embed@subject", "blocks.0.hook_resid_mid@last"])
    for row in res.per_relation:
        assert row["kind"] == "vector" and row["accuracy"] >= 0.95, row
        assert row["control_accuracy"] <= 0.15 and row["chance"] == pytest.approx(1 / N)


def test_relation_swap_moves_answer(cons):
    model, world = cons
    sw = relation_swap(model, ProbeSet.from_world(world), 1, 3)
    assert sw.clean_accuracy == 1.0 and sw.moved_to_new >= 0.95 and sw.stayed_on_old <= 0.05
    assert sw.intervention["kind"] == "patch" and sw.intervention["position"] == "relation"


def test_selector_ablation_breaks_only_that_relation(cons):
    model, world = cons
    ps = ProbeSet.from_world(world)
    sel = selectivity(model, ps)
    assert np.mean(sel.index) > 0.99  # every construction unit fires for one relation only
    res = ablate_relation_units(model, ps, [1, 2, 3])
    for row in res.per_relation:
        assert row["n_ablated"] == 2 * B  # the (+, -) pair of every coordinate of the relation's block
        assert row["accuracy_on_relation"] <= 0.1, row  # near chance (1/N)
        assert row["accuracy_on_others"] >= 0.95
        assert row["random_units_accuracy_on_relation"] >= 0.9  # same number of random units: little harm


def test_relation_zero_survives_through_the_skip_path(cons):
    """Block 0 of the subject reaches the unembedding through the residual stream: by design."""
    model, world = cons
    row = ablate_relation_units(model, ProbeSet.from_world(world), [0]).per_relation[0]
    assert row["accuracy_on_relation"] >= 0.9


def test_constructed_swap_zero_shot(cons):
    model, world = cons
    res = freeze_and_swap(model, world, new_seed=5, retrain=TrainConfig(steps=20, eval_every=10, lr=3e-2, target_accuracy=None))
    assert res.original_accuracy == 1.0
    assert res.zero_shot_accuracy >= 0.95 and res.zero_shot_control_accuracy <= 0.05
    assert res.reconstructed_accuracy == 1.0
    assert [p["step"] for p in res.retrain_curve] == [0, 10, 20]
    assert res.retrain_curve[-1]["accuracy"] > res.retrain_curve[0]["accuracy"]
    assert model.W_E_ent.requires_grad  # freezing is undone


def test_scores_and_spectra(cons):
    model, world = cons
    res = scores_and_spectra(model, ProbeSet.from_world(world))
    assert res.accuracy == 1.0 and res.z_margin_min > 0 and res.frac_target_above_evt > 0.9
    assert res.spectra["numerical_rank"]["W_in W_out"] == B  # the selector writes into one block
    assert np.asarray(res.gate_fraction).shape == (R, 2 * R * B)


def test_quick_api_for_the_quickstart(one_thread):
    from mechfact.targets import quick

    res = quick(96, 2, retrain_steps=3)  # the fit needs more training subjects than R * rank(W_U) = 48
    assert res["model"] == "construct" and res["train_accuracy"] == 1.0
    assert res["r2_heldout"] >= 0.95 and res["readout_embed_min"] >= 0.95 and res["zero_shot_accuracy"] >= 0.95
    assert max(res["ablation_on_relation"][1:]) <= 0.1 and min(res["relation_swap_moved"]) >= 0.95
    with pytest.raises(ValueError, match="allowed construct, trained"):
        quick(8, 1, model="magic")


def test_block_overlap_falls_back_to_qr_iteration_when_the_svd_does_not_converge(monkeypatch):
    """numpy's gesdd can fail to converge on a finite matrix (it did on a fitted map at N = 4096): the overlap is then
    computed with gesvd, with the same result; a non-finite map is refused by name."""
    import numpy as np

    from mechfact.probes import superposition as S

    rng = np.random.default_rng(0)
    maps = rng.normal(size=(3, 12, 8))
    want = S.block_overlap(maps)

    def fails(*a, **k):
        raise np.linalg.LinAlgError("SVD did not converge")

    monkeypatch.setattr(np.linalg, "svd", fails)
    got = S.block_overlap(maps)
    assert got[1] == want[1] and np.allclose(got[0], want[0], atol=1e-10)
    maps[1, 2, 3] = np.nan
    with pytest.raises(ValueError, match=r"shape \(12, 8\) given to the SVD holds non-finite values"):
        S.block_overlap(maps)
