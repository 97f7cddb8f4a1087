"""The model choices and cost estimates shared by the fact experiments (train, construct, capacity, multi-hop).

:class:`ModelSpec` is the architecture part of their configs; the checks of worlds, hops and seeds and the memory
estimates (:func:`training_cost`, :func:`world_bytes`) let each command refuse an oversized run before it writes
anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import DictConfig, bad, check_choice, check_int
from ..limits import check_memory
from .model import OUTPUTS, FactModelConfig, scores_attributes
from .train import train_cost
from .world import MAX_ENUMERATE, FactWorld, Queries


@dataclass
class ModelSpec(DictConfig):
    """The architecture choices shared by train, capacity and multihop."""

    attention: str = "uniform"  # uniform | learned
    embeddings: str = "trainable"  # trainable | frozen | frozen-input
    tied: bool = False  # entity unembedding tied to the input embedding
    layer_norm: bool = False
    entity_init: str = "normal"  # normal | zero (entity input embeddings start at 0)
    entity_init_scale: float = 1.0  # multiplies the normal init's std of the entity input embeddings
    outputs: str = "auto"  # auto (the pool for single-hop pool worlds) | entities | attributes

    def __post_init__(self) -> None:
        check_choice("outputs", self.outputs, OUTPUTS)
        FactModelConfig(2, 1, **self.config_kwargs())  # the model config's own checks, once

    def model_kwargs(self, embeddings: str | None = None) -> dict:
        """Keyword arguments of :func:`~mechfact.facts.model.build_fact_model` (``embeddings`` overrides)."""
        return {**self.to_dict(), **({"embeddings": embeddings} if embeddings else {})}

    def config_kwargs(self, embeddings: str | None = None) -> dict:
        """Keyword arguments of :class:`~mechfact.facts.model.FactModelConfig` (the output vocabulary aside: its
        size depends on the world)."""
        return {k: v for k, v in self.model_kwargs(embeddings).items() if k != "outputs"}


def _check_hops(hops: int, attention: str) -> None:
    check_int("hops", hops, 1)
    if hops > 1 and attention == "uniform":
        raise ValueError(f"--hops {hops} with --attention uniform: a uniform average loses the ORDER of the "
                         "relations; use --attention learned (positions are added for k > 1)")


def _check_world_and_size(cfg) -> None:
    check_int("subjects", cfg.subjects, 2)
    check_int("relations", cfg.relations, 1)
    check_int("d", cfg.d, 1)
    check_int("mlp_width", cfg.mlp_width, 1)


def _check_seed(field_: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise bad(field_, value, "must be an integer")


def n_chains(subjects: int, relations: int, hops: int) -> int:
    """Queries of ``hops``-hop facts (every chain enumerated): ``subjects * relations ** hops``."""
    return subjects * relations ** hops


def _check_chains(subjects: int, relations: int, hops: int) -> None:
    """k-hop queries are enumerated: refuse more than MAX_ENUMERATE chains before anything is built or written."""
    if hops == 1:
        return
    huge = relations > 1 and hops > 64  # relations ** hops: not worth computing exactly
    if huge or n_chains(subjects, relations, hops) > MAX_ENUMERATE:
        total = f"about 10^{hops * math.log10(relations):.0f}" if huge else f"{n_chains(subjects, relations, hops)}"
        raise ValueError(f"--hops {hops}: {subjects} subjects x {relations}^{hops} relation chains = {total} queries, "
                         f"over the {MAX_ENUMERATE} that can be enumerated; "
                         "use fewer --subjects, --relations or --hops")


def _positions(hops: int, cot: bool) -> tuple[int, int]:
    """(tokens per query, supervised positions per query) of k-hop queries."""
    return (2 * hops, hops) if cot else (hops + 1, 1)


def world_bytes(subjects: int, relations: int) -> float:
    """A FactWorld's tables (int64, as built and checked) and its world.json (Python ints while written)."""
    return (3 * 8.0 + 44.0) * subjects * relations


def training_cost(subjects: int, relations: int, d: int, mlp_width: int, spec: "ModelSpec", hops: int = 1,
                  cot: bool = False, batch_size: int | None = None, embeddings: str | None = None,
                  attributes: int | None = None) -> tuple[float, str]:
    """(estimated peak bytes, what dominates) of training one model on every ``hops``-hop fact of a world (with an
    attribute pool of ``attributes``, scored over that pool when ``spec.outputs`` says so)."""
    n_ctx = 0 if hops == 1 else _positions(hops, cot)[0]
    kw = spec.config_kwargs(embeddings)
    n_out = attributes if scores_attributes(spec.outputs, subjects, attributes, hops) else 0
    mcfg = FactModelConfig(subjects, relations, d=d, mlp_width=mlp_width, n_ctx=n_ctx, n_outputs=n_out, **kw)
    need, what = train_cost(mcfg, n_chains(subjects, relations, hops), *_positions(hops, cot), batch_size)
    return need + world_bytes(subjects, relations), what


def _refuse_if_too_big(rows: list[tuple[float, str, str]]) -> None:
    """``rows``: (bytes, flags, what dominates); refuses the largest one over the memory limit."""
    need, flags, what = max(rows, key=lambda r: r[0])
    check_memory(need, f"{flags} (mostly {what})")


def training_queries(world: FactWorld, hops: int, cot: bool) -> Queries:
    return world.single_hop() if hops == 1 else world.k_hop(hops, cot=cot)
