"""The relation selectivity of last-position MLP units: does ablating the units that prefer one relation remove
that relation and no other? On a FactModel (its FactWorld) or any hooked model (:class:`KnownFacts`; pretrained-model
relations: :func:`mechfact.relation_selectivity`).

On the known facts (each
scored against its clean top-1 token: the object token, or a token prefix-matching the object), the units of
``blocks.<layer>.mlp.hook_post`` at the last position that prefer relation r
(:func:`~mechfact.probes.patching.selectivity`, :func:`~mechfact.probes.patching.relation_units`) are zeroed,
and the accuracy is measured on every relation r2: the matrix ``accuracy[r][r2]``. The drop ``clean[r2] -
accuracy[r][r2]`` on the diagonal minus its mean off the diagonal is the selectivity score (1: ablating r's units
removes r and nothing else; 0: no relation-specific units). The control ablates as many random units
(:func:`~mechfact.probes.patching.ablate_relation_units` draws both sets; its numbers are the matrix's diagonal and
the pooled off-diagonal).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from .. import hooks
from .queries import ProbeSet, predictions
from .state_transfer import _is_world, _n_layers


@dataclass
class KnownFacts:
    """What :func:`relation_selectivity` runs on: the known facts as a ProbeSet (``object_tokens``: each fact's
    clean top-1) and the name of every relation id. From a FactWorld here; from pretrained-model relations by
    :func:`mechfact.llm.transfer.known_facts`."""

    ps: ProbeSet
    names: list[str]


@dataclass
class RelationSelectivity:
    """``accuracy[i][j]``: accuracy on relation ``relations[j]`` with the units preferring ``relations[i]``
    zeroed; ``random_accuracy``: the same with as many random units; ``drop`` = ``clean[j] - accuracy[i][j]``."""

    site: str
    layer: int
    relations: list[str]
    n_facts: list[int]  # known facts per relation (the facts every accuracy is measured on)
    n_units: list[int]  # units ablated per relation (the random control ablates as many)
    clean: list[float]
    accuracy: list[list[float]]
    random_accuracy: list[list[float]]
    drop: list[list[float]]
    random_drop: list[list[float]]
    score: float | None  # mean diagonal drop minus mean off-diagonal drop (None: one relation)
    random_score: float | None
    per_relation: list[dict]  # relation, own drop, mean drop on the others, the same for random units
    ablation: dict = field(repr=False, default_factory=dict)  # ablate_relation_units' result

    def to_dict(self) -> dict:
        return asdict(self)


def _score(drop: np.ndarray) -> float | None:
    R = drop.shape[0]
    if R < 2:
        return None
    off = ~np.eye(R, dtype=bool)
    return float(np.mean(np.diag(drop)) - np.mean(drop[off]))


def world_known_facts(model, world) -> KnownFacts:
    """The facts of a FactWorld the model answers, scored against their object tokens."""
    ps = ProbeSet.from_world(world)
    known = torch.nonzero(predictions(model, ps) == ps.object_tokens).reshape(-1)
    return KnownFacts(ps.subset(known), [f"r{r}" for r in range(world.n_relations)])


def relation_selectivity(model, relations, *, layer: int | None = None, n_units: int | None = None,
                         seed: int = 0) -> RelationSelectivity:
    """Relation selectivity of the last-position MLP units of ``layer`` (module docstring).

    ``model``: a FactModel with ``relations`` its FactWorld, or any hooked model with :class:`KnownFacts`
    (pretrained-model relations: :func:`mechfact.relation_selectivity`). ``layer``: default the middle block
    (``n_layers // 2``). ``n_units``: units ablated per relation (default every unit preferring it). Only the
    known facts are scored, each against its clean top-1 token (the object token of a fact model; for a pretrained
    model a token that is a prefix of the object, as in :func:`state_transfer`); a relation with none is left
    out.
    """
    from .experiments import default_layer
    from .patching import Intervention, ablate_relation_units, intervened_accuracy

    L = _n_layers(model)
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, (int, np.integer))
                              or not 0 <= layer < L):
        raise ValueError(f"layer {layer!r}: allowed 0..{L - 1} (the model has {L} layer{'s' if L != 1 else ''})")
    if n_units is not None and (isinstance(n_units, bool) or not isinstance(n_units, int) or n_units < 1):
        raise ValueError(f"n_units {n_units!r}: must be a positive integer or None (every unit preferring r)")
    layer = default_layer(model, None if layer is None else int(layer))
    site = hooks.mlp_post(layer)
    if _is_world(relations):
        relations = world_known_facts(model, relations)
    if not isinstance(relations, KnownFacts):
        raise ValueError(f"relations of type {type(relations).__name__}: expected a FactWorld or KnownFacts "
                         "(relations of a pretrained model: mechfact.relation_selectivity)")
    ps, names = relations.ps, relations.names
    if len(ps) == 0:
        raise ValueError(f"no known facts: the model answers none of the facts of {', '.join(names)}; relation "
                         "selectivity needs facts the model knows")
    ab = ablate_relation_units(model, ps, site=site, n_units=n_units, seed=seed)
    rels = ps.relation_ids
    clean = np.array(ab.clean_per_relation)
    subsets = {r: ps.for_relation(r) for r in rels}

    def matrix(key: str) -> np.ndarray:
        M = np.empty((len(rels), len(rels)))
        for i, row in enumerate(ab.per_relation):
            units = row[key]
            for j, r2 in enumerate(rels):
                M[i, j] = intervened_accuracy(model, subsets[r2], [Intervention(site, "zero", units)]) if units \
                    else clean[j]
        return M

    acc, rnd = matrix("ablated_units"), matrix("random_units")
    drop, rdrop = clean[None] - acc, clean[None] - rnd
    R = len(rels)
    per = []
    for i, r in enumerate(rels):
        others = [j for j in range(R) if j != i]
        per.append({"relation": names[r], "n_units": ab.per_relation[i]["n_ablated"], "drop_on_relation": drop[i, i],
                    "drop_on_others": float(drop[i, others].mean()) if others else None,
                    "random_drop_on_relation": rdrop[i, i],
                    "random_drop_on_others": float(rdrop[i, others].mean()) if others else None})
    return RelationSelectivity(site=site, layer=layer, relations=[names[r] for r in rels],
                               n_facts=[len(subsets[r]) for r in rels],
                               n_units=[row["n_ablated"] for row in ab.per_relation], clean=clean.tolist(),
                               accuracy=acc.tolist(), random_accuracy=rnd.tolist(), drop=drop.tolist(),
                               random_drop=rdrop.tolist(), score=_score(drop), random_score=_score(rdrop),
                               per_relation=[{k: (float(v) if isinstance(v, np.floating) else v) for k, v in p.items()}
                                             for p in per],
                               ablation=ab.to_dict())


__all__ = ["KnownFacts", "RelationSelectivity", "relation_selectivity", "world_known_facts"]
