"""Freeze-and-swap transfer: new facts through the frozen MLP, by writing new subject embeddings.

The subject embeddings are replaced at the ``hook_embed`` output (subject
positions only), so every other tensor -- attention, MLP, relation embeddings,
unembedding (also when tied) -- stays exactly as trained.

* zero-shot: new random bijections ``pi'_r``; embeddings BUILT from the fitted
  superposition maps, ``x'_s = c + sum_r v_{pi'_r(s)} M_r`` (no training);
* retrained: fresh random embeddings trained on the new facts, all else frozen
  (:func:`retrain_embeddings`: a copy of the model trained by the caller's
  :class:`~mechfact.probes.protocols.Retrainer` with every other tensor frozen;
  :func:`mechfact.targets.freeze_and_swap` passes the trainer of :mod:`mechfact.facts`);
* control: the same retraining on the ORIGINAL facts (how fast the frozen
  network lets embeddings relearn facts it was built for);
* zero-shot control: embeddings built from the maps for yet another random
  world, scored on the new facts (chance level).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from dataclasses import asdict, dataclass

import numpy as np
import torch

from .. import hooks
from ..results import Result, scalar_row
from .protocols import FactWorldLike, HookedModel, Retrainer
from .queries import ProbeSet, accuracy, model_device
from .superposition import SuperpositionFit, fit_superposition

logger = logging.getLogger(__name__)


def subject_embeddings(model, n_entities: int) -> torch.Tensor:
    """(N, d): the ``hook_embed`` output for each entity token on its own."""
    tokens = torch.arange(n_entities)[:, None].to(model_device(model))
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n == hooks.embed())
    return cache[hooks.embed()][:, 0].float().cpu()


def attribute_vectors(model, n_entities: int) -> torch.Tensor:
    """(N, d): unembedding columns ``W_U[:, e]`` of the entity outputs (the justified attribute vectors)."""
    W_U = getattr(model, "W_U", None)
    if W_U is None:
        raise ValueError(f"{type(model).__name__} has no W_U: attribute vectors are its unembedding columns")
    return W_U[:, :n_entities].T.detach().float().cpu()


def embedding_hook(table: torch.Tensor, ps: ProbeSet, idx=slice(None)):
    """A ``hook_embed`` hook writing ``table[subject]`` at each query's subject position (the queries ``ps[idx]``,
    in order). Its ``for_rows(rows)`` is the same hook for the queries ``rows`` of those (what
    :func:`~mechfact.probes.queries.predictions` runs batch by batch)."""
    return (hooks.embed(), _embedding_hook(table, ps.subjects[idx], ps.subject_pos[idx]))


def _embedding_hook(table: torch.Tensor, subj: torch.Tensor, pos: torch.Tensor):
    def hook(x, hook=None):
        if x.shape[0] != len(subj):
            raise ValueError(f"embedding hook for {len(subj)} queries run on a batch of {x.shape[0]}: run it "
                             "through for_rows(rows) per batch")
        x = x.clone()
        rows = torch.arange(x.shape[0], device=x.device)
        x[rows, pos.to(x.device)] = table[subj.to(table.device)].to(x.dtype)
        return x

    hook.for_rows = lambda rows: _embedding_hook(table, subj[rows], pos[rows])
    return hook


def retrain_embeddings(model: HookedModel, world: FactWorldLike, init: torch.Tensor, retrain: Retrainer) -> list[dict]:
    """Train fresh subject embeddings ``init`` (N, d) on ``world``'s facts through the frozen network.

    A copy of ``model`` gets ``init`` as its (trainable) entity embeddings and keeps its unembedding fixed
    as trained (also when it was tied to the embeddings); ``retrain`` then trains it with every other tensor
    frozen. ``model`` itself is not touched. Returns the accuracy curve, ``[{"step", "loss", "accuracy"}]``
    from step 0.
    """
    W_U = model.W_U.detach().clone()
    m = copy.deepcopy(model)
    for name in ("W_E_ent", "W_U_ent"):
        m._parameters.pop(name, None)
        m._buffers.pop(name, None)
    m.cfg = dataclasses.replace(m.cfg, tied=False)
    m.W_E_ent = torch.nn.Parameter(init.clone().to(W_U.device))
    m.register_buffer("W_U_ent", W_U)
    frozen = [n for n, _ in m.named_parameters() if n != "W_E_ent"]
    return retrain(m, world, frozen, model_device(model))


def _world_like(world: FactWorldLike, seed: int) -> FactWorldLike:
    """Another world of ``world``'s shape and kind, drawn with ``seed``."""
    return type(world)(world.n_entities, world.n_relations, seed=seed, attributes=world.n_attributes)


def check_new_seed(world: FactWorldLike, new_seed: int) -> FactWorldLike:
    """The world of the new facts; ValueError when ``new_seed`` reproduces the model's own world."""
    new = _world_like(world, new_seed)
    if torch.equal(new.perms, world.perms):
        raise ValueError(f"--new-seed {new_seed}: reproduces the model's own world (the same facts); pick another")
    return new


@dataclass(frozen=True)
class SwapResult(Result):
    zero_shot_accuracy: float  # new facts, embeddings built from the fitted maps, nothing trained
    zero_shot_control_accuracy: float  # embeddings built for an unrelated world, scored on the new facts
    reconstructed_accuracy: float  # ORIGINAL facts with embeddings rebuilt from the fitted maps (fit precision)
    retrained_accuracy: float  # new facts, subject embeddings retrained, everything else frozen
    control_relearn_accuracy: float  # original facts relearned the same way
    original_accuracy: float  # the model on its own facts
    chance: float
    retrain_curve: list[dict]
    control_relearn_curve: list[dict]
    retrain: dict
    new_world_seed: int

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def records(self) -> list[dict]:
        """One row: the accuracies and the chance rate (the curves stay in the fields)."""
        return [scalar_row(self)]


def freeze_and_swap(model: HookedModel, world: FactWorldLike, *, retrain: Retrainer, new_seed: int = 1,
                    sfit: SuperpositionFit | None = None, seed: int = 0) -> SwapResult:
    """Zero-shot and retrained transfer to a new random world (module docstring).

    ``retrain``: trains the fresh embeddings (:class:`~mechfact.probes.protocols.Retrainer`; for a fact model
    :func:`mechfact.targets.freeze_and_swap` passes :func:`mechfact.targets.fact_retrainer`, default Adam lr
    1e-2, 300 steps); ``sfit``: superposition maps already fitted on the model (default: fitted here on every
    subject); ``seed``: the fresh embeddings' initialisation.
    """
    N = world.n_entities
    X = subject_embeddings(model, N)
    V = attribute_vectors(model, N)
    if sfit is None:
        sfit = fit_superposition(X, V, world.perms, np.arange(N))
    new = check_new_seed(world, new_seed)
    other = _world_like(world, new_seed + 7919)
    ps_new, ps_old = ProbeSet.from_world(new), ProbeSet.from_world(world)
    dev = model_device(model)
    zero = accuracy(model, ps_new, [embedding_hook(sfit.build(V, new.perms).to(dev), ps_new)])
    recon = accuracy(model, ps_old, [embedding_hook(sfit.build(V, world.perms).to(dev), ps_old)])
    zero_ctrl = accuracy(model, ps_new, [embedding_hook(sfit.build(V, other.perms).to(dev), ps_new)])
    g = torch.Generator().manual_seed(seed)
    rms = float(X.pow(2).mean().sqrt())
    init = torch.randn(N, X.shape[1], generator=g) * rms  # same scale as the trained embeddings
    curve = retrain_embeddings(model, new, init, retrain)
    ctrl_curve = retrain_embeddings(model, world, init, retrain)
    return SwapResult(zero_shot_accuracy=zero, zero_shot_control_accuracy=zero_ctrl,
                      reconstructed_accuracy=recon,
                      retrained_accuracy=curve[-1]["accuracy"], control_relearn_accuracy=ctrl_curve[-1]["accuracy"],
                      original_accuracy=accuracy(model, ps_old), chance=1.0 / world.n_attributes, retrain_curve=curve,
                      control_relearn_curve=ctrl_curve, retrain=retrain.to_dict(), new_world_seed=new_seed)
