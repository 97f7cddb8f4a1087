"""What the probes need of a model, of a fact world and of a trainer: nothing more than these methods.

The probes import no model package: :mod:`mechfact.facts` (one-layer fact models and their worlds),
:mod:`mechfact.llm` (pretrained models) and anything else that has these attributes work alike. A caller
that needs more (freeze-and-swap retrains embeddings) passes it in: :class:`Retrainer`.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class HookedModel(Protocol):
    """A transformer-lens style model: hook points by name, and runs with caches and hooks.

    ``hook_dict`` names the hook points (:mod:`mechfact.hooks`); ``run_with_cache(tokens, names_filter=...)``
    returns ``(logits, cache)``; ``run_with_hooks(tokens, fwd_hooks=[(name, fn)])`` the logits; ``n_layers`` the
    blocks; ``final_logits(resid)`` the logits (n, vocab) of last-block residual states (n, d) (the final norm and
    the unembedding: a run that stops after the last block unembeds only what it needs); ``blocks[i]`` the blocks
    (weight probes read ``blocks[i].mlp.W_in / W_out``, and ``W_U`` (d, vocab)). :class:`mechfact.FactModel` and
    :class:`mechfact.llm.LanguageModel` are both one (a test holds them to it).
    """

    hook_dict: dict
    n_layers: int
    blocks: Any

    def final_logits(self, resid: torch.Tensor) -> torch.Tensor: ...

    def run_with_cache(self, tokens: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[Any, Any]: ...

    def run_with_hooks(self, tokens: torch.Tensor, *args: Any, **kwargs: Any) -> Any: ...


class SingleHopQueries(Protocol):
    """What :meth:`mechfact.probes.queries.ProbeSet.from_world` reads of ``world.single_hop(subjects)``."""

    tokens: torch.Tensor
    subjects: torch.Tensor
    relations: torch.Tensor
    answers: torch.Tensor

    def __len__(self) -> int: ...


class FactWorldLike(Protocol):
    """A world of facts: R bijections (or maps) of N subjects onto attributes.

    ``perms`` (R, N) holds the attribute of each (relation, subject); ``type(world)(N, R, seed=..., attributes=...)``
    draws another world of the same shape (freeze-and-swap's new facts).
    """

    n_entities: int
    n_relations: int
    n_attributes: int
    pad_token: int
    perms: torch.Tensor

    def single_hop(self, subjects: Any = None) -> SingleHopQueries: ...


class Retrainer(Protocol):
    """Trains the free tensors of ``model`` on ``world``'s facts, the tensors named in ``frozen`` fixed.

    Returns the accuracy curve ``[{"step", "loss", "accuracy"}]`` from step 0; ``to_dict()`` is recorded in
    the result (:func:`mechfact.targets.fact_retrainer` wraps the trainer of :mod:`mechfact.facts`).
    """

    def __call__(self, model: Any, world: Any, frozen: Sequence[str], device: torch.device) -> list[dict]: ...

    def to_dict(self) -> dict: ...


class SwapSpec(Protocol):
    """How :func:`~mechfact.probes.experiments.probe_all` runs freeze-and-swap: the seed of the new facts and
    the retrainer (:class:`mechfact.targets.SwapConfig` is one)."""

    new_seed: int

    def retrainer(self) -> Retrainer: ...


__all__ = ["HookedModel", "SingleHopQueries", "FactWorldLike", "Retrainer", "SwapSpec"]
