"""The patching engine, interventions as data, and clear errors on bad input."""

import json

import pytest
import torch

from mechfact import hooks
from mechfact.facts import FactModel, FactModelConfig, FactWorld
from mechfact.probes.patching import Intervention, intervened_accuracy, relation_swap, run_with_interventions
from mechfact.probes.queries import ProbeSet, Site, collect
from mechfact.probes.readout import readout


@pytest.fixture(scope="module")
def tiny():
    world = FactWorld(16, 3, seed=0)
    return FactModel(FactModelConfig(16, 3, d=8, mlp_width=12, seed=0)).eval(), world


def test_intervention_is_data():
    iv = Intervention(hooks.mlp_post(0), "set", [1, 2], "last", [0.5, -1.0])
    d = json.loads(json.dumps(iv.to_dict()))
    assert Intervention(**d) == iv
    with pytest.raises(ValueError, match="allowed"):
        Intervention("x", "scale")
    with pytest.raises(ValueError, match="values"):
        Intervention("x", "set")


def test_engine_semantics(tiny):
    model, world = tiny
    ps = ProbeSet.from_world(world)
    clean = run_with_interventions(model, ps, [])
    assert torch.allclose(clean, model(ps.tokens)[:, 1], atol=1e-6)
    post = hooks.mlp_post(0)
    # patching from an identical source changes nothing
    same = run_with_interventions(model, ps, [Intervention(post, "patch", [0, 3])], source=ps)
    assert torch.allclose(same, clean, atol=1e-6)
    # zeroing units == setting them to 0; mean over all units on a constant site == the clean run
    z = run_with_interventions(model, ps, [Intervention(post, "zero", [0, 3])])
    s = run_with_interventions(model, ps, [Intervention(post, "set", [0, 3], values=[0.0, 0.0])])
    assert torch.allclose(z, s) and not torch.allclose(z, clean)
    # zeroing every MLP unit == removing the MLP output (b_out stays)
    mlp = model.blocks[0].mlp
    full = run_with_interventions(model, ps, [Intervention(post, "zero")])
    no_mlp = run_with_interventions(model, ps, [Intervention(hooks.mlp_out(0), "set", None, "last",
                                                             mlp.b_out.detach().tolist())])
    assert torch.allclose(full, no_mlp, atol=1e-5)
    # mean ablation at the subject position of hook_embed: every query sees the average subject
    m = run_with_interventions(model, ps, [Intervention(hooks.embed(), "mean", None, "subject")])
    assert torch.allclose(m[0], m[3 * 5], atol=1e-5)  # queries (s=0, r=0) and (s=5, r=0) now agree


def test_collect_reads_the_right_position(tiny):
    model, world = tiny
    ps = ProbeSet.from_world(world)
    f = collect(model, ps, [Site(hooks.embed(), "subject"), Site(hooks.embed(), "last")])
    assert f[Site(hooks.embed(), "subject")].shape == (48, 8)
    assert torch.allclose(f[Site(hooks.embed(), "subject")][4], model.W_E_ent[1].detach())
    assert torch.allclose(f[Site(hooks.embed(), "last")][4], model.W_E_rel[1].detach())


def test_bad_input_names_what_exists(tiny):
    model, world = tiny
    ps = ProbeSet.from_world(world)
    with pytest.raises(ValueError, match=r"unknown hook site.*blocks\.0\.mlp\.hook_post"):
        readout(model, ps, ["blocks.0.mlp.hook_nope@last"])
    with pytest.raises(ValueError, match=r"relation 7 is not in the queries; relations present: \[0, 1, 2\]"):
        readout(model, ps, relations=[7])
    with pytest.raises(ValueError, match="relation 5 is not in the queries"):
        relation_swap(model, ps, 0, 5)
    with pytest.raises(ValueError, match="out of range"):
        intervened_accuracy(model, ps, [Intervention(hooks.mlp_post(0), "zero", [99])])
    with pytest.raises(ValueError, match="no transformer-lens hook points"):
        collect(torch.nn.Linear(2, 2), ps, [Site(hooks.embed())])
    with pytest.raises(ValueError, match="position"):
        Site("hook_embed", "middle")


def test_empty_unit_list_is_a_no_op(tiny):
    model, world = tiny
    ps = ProbeSet.from_world(world)
    clean = run_with_interventions(model, ps, [])
    assert torch.allclose(run_with_interventions(model, ps, [Intervention(hooks.mlp_post(0), "zero", [])]), clean)
