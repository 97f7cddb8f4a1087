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

``held_out=True`` (the default): the units are chosen on one half of each relation's known facts and the
accuracies measured on the other half, then the halves swap and each cell is the mean over both, weighted by the
facts scored (cross-fitting: no fact scores units chosen on it). A relation needs two known facts to be split;
one with fewer is left out. ``held_out=False`` chooses and scores on the same facts (an upper bound).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from .. import hooks
from ..results import Result
from .known import known_indices
from .queries import ProbeSet
from .state_transfer import _is_world, _n_layers


@dataclass
class KnownFacts:
    """What :func:`relation_selectivity` runs on: the known facts as a ProbeSet (``object_tokens``: each fact's
    clean top-1) and the name of every relation id. From a FactWorld here; from pretrained-model relations by
    :func:`mechfact.llm.transfer.known_facts`."""

    ps: ProbeSet
    names: list[str]


@dataclass
class RelationSelectivity(Result):
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

    @property
    def records(self) -> list[dict]:
        """One row per relation whose units were ablated (``per_relation``), with the site and layer."""
        return [{"site": self.site, "layer": self.layer, **r} for r in self.per_relation]

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
    known = torch.tensor(known_indices(model, ps), dtype=torch.long)
    return KnownFacts(ps.subset(known), [f"r{r}" for r in range(world.n_relations)])


def _halves(ps: ProbeSet, seed: int) -> tuple[ProbeSet, ProbeSet]:
    """Each relation's facts split in two (a seeded order; the first half gets the odd one)."""
    rng = np.random.default_rng(seed)
    a, b = [], []
    for r in ps.relation_ids:
        idx = torch.nonzero(ps.relations == r).reshape(-1).numpy()
        idx = idx[rng.permutation(len(idx))]
        h = (len(idx) + 1) // 2
        a += idx[:h].tolist()
        b += idx[h:].tolist()
    return ps.subset(torch.tensor(sorted(a))), ps.subset(torch.tensor(sorted(b)))


def _held_out(model, ps: ProbeSet, site: str, n_units: int | None, seed: int):
    """(accuracy, random-unit accuracy, n_units per relation, the folds' units): units chosen on one half, scored
    on the other, both ways (module docstring)."""
    from .patching import Intervention, intervened_accuracy, relation_units, selectivity

    rels = ps.relation_ids
    R = len(rels)
    halves = _halves(ps, seed)
    acc, rnd, weight = np.zeros((R, R)), np.zeros((R, R)), np.zeros((R, R))
    folds = []
    for k, (choose, score) in enumerate((halves, halves[::-1])):
        sel = selectivity(model, choose, site)
        rng = np.random.default_rng([seed, k])
        width = len(sel.preferred)
        fold = []
        for i, r in enumerate(rels):
            units = relation_units(sel, r, n_units)
            rand = sorted(int(u) for u in rng.choice(width, size=len(units), replace=False)) if units else []
            fold.append({"relation": int(r), "ablated_units": units, "random_units": rand})
            for j, r2 in enumerate(rels):
                facts = score.for_relation(r2)
                w = len(facts)
                clean = intervened_accuracy(model, facts, [])
                acc[i, j] += w * (intervened_accuracy(model, facts, [Intervention(site, "zero", units)])
                                  if units else clean)
                rnd[i, j] += w * (intervened_accuracy(model, facts, [Intervention(site, "zero", rand)])
                                  if rand else clean)
                weight[i, j] += w
        folds.append(fold)
    n = [int(round(np.mean([len(f[i]["ablated_units"]) for f in folds]))) for i in range(R)]
    return acc / weight, rnd / weight, n, folds


def relation_selectivity(model, relations, *, layer: int | None = None, n_units: int | None = None,
                         seed: int = 0, held_out: bool = True) -> RelationSelectivity:
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
    if held_out:
        few = [r for r in ps.relation_ids if len(ps.for_relation(r)) < 2]
        if few:
            ps = ps.subset(torch.nonzero(~torch.isin(ps.relations, torch.tensor(few))).reshape(-1))
        if len(ps.relation_ids) == 0:
            raise ValueError(f"no relation of {', '.join(names)} has two known facts: held-out selectivity chooses "
                             "units on one half of a relation's facts and scores the other (held_out=False scores "
                             "the facts it chose on)")
        rels = ps.relation_ids
        subsets = {r: ps.for_relation(r) for r in rels}
        clean = np.array([intervened_accuracy(model, subsets[r], []) for r in rels])
        acc, rnd, n_abl, folds = _held_out(model, ps, site, n_units, seed)
        return _result(site, layer, names, rels, subsets, n_abl, clean, acc, rnd,
                       {"held_out": True, "left_out": [names[r] for r in few], "folds": folds})
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

    return _result(site, layer, names, rels, subsets, [row["n_ablated"] for row in ab.per_relation], clean,
                   matrix("ablated_units"), matrix("random_units"), {"held_out": False, **ab.to_dict()})


def _result(site, layer, names, rels, subsets, n_units, clean, acc, rnd, ablation) -> RelationSelectivity:
    drop, rdrop = clean[None] - acc, clean[None] - rnd
    R = len(rels)
    per = []
    for i, r in enumerate(rels):
        others = [j for j in range(R) if j != i]
        per.append({"relation": names[r], "n_units": n_units[i], "drop_on_relation": drop[i, i],
                    "drop_on_others": float(drop[i, others].mean()) if others else None,
                    "random_drop_on_relation": rdrop[i, i],
                    "random_drop_on_others": float(rdrop[i, others].mean()) if others else None})
    return RelationSelectivity(site=site, layer=layer, relations=[names[r] for r in rels],
                               n_facts=[len(subsets[r]) for r in rels],
                               n_units=list(n_units), clean=clean.tolist(),
                               accuracy=acc.tolist(), random_accuracy=rnd.tolist(), drop=drop.tolist(),
                               random_drop=rdrop.tolist(), score=_score(drop), random_score=_score(rdrop),
                               per_relation=[{k: (float(v) if isinstance(v, np.floating) else v) for k, v in p.items()}
                                             for p in per],
                               ablation=ablation)


__all__ = ["KnownFacts", "RelationSelectivity", "relation_selectivity", "world_known_facts"]
