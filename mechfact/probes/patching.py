"""One generic patching engine; interventions are data; named specialisations on top.

An :class:`Intervention` says WHERE (hook point, position, unit indices) and
WHAT (``kind``)::

    zero           set the units to 0 (for post-ReLU units: switch them off); ``ablate`` is accepted for it
    mean           set the units to their mean over the clean run of the same queries
    set            set the units to ``values`` (one per unit, or one for all)
    patch          copy the units from a SOURCE run (another query set, row-aligned)

``mean`` and ``patch`` are resolved against a run before hooking, and the
resolved values are not stored (they can be large); the intervention itself
(``to_dict``) is what results save.

Specialisations:

* :func:`relation_swap` -- patch the relation token's embedding of ``[s, r]``
  with that of ``[s, r']``: the selector picture predicts the answer moves to
  ``pi_r'(s)``.
* :func:`selectivity` -- mean activation of each MLP unit per relation and a
  relation-selectivity index.
* :func:`ablate_relation_units` -- zero the units that prefer relation r, and
  the same number of random units as control; per-relation accuracy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from .. import hooks
from ..results import Result
from .queries import ProbeSet, as_probe_set, check_hooks, check_position, check_relation, logits_of, model_device

KINDS = ("zero", "mean", "set", "patch")
KIND_ALIASES = {"ablate": "zero"}  # accepted on input, stored as the canonical name


@dataclass
class Intervention:
    site: str  # hook name, e.g. blocks.0.mlp.hook_post
    kind: str = "zero"  # see KINDS
    units: list[int] | None = None  # feature indices on the last axis; None = all
    position: str = "last"  # subject | subject_first | relation | last (answer position) | all
    values: list[float] | None = None  # for kind="set"

    def __post_init__(self) -> None:
        self.kind = KIND_ALIASES.get(self.kind, self.kind)
        if self.kind not in KINDS:
            raise ValueError(f"intervention kind {self.kind!r}: allowed {', '.join(KINDS)} (ablate = zero)")
        self.position = check_position(self.position)
        if self.kind == "set" and self.values is None:
            raise ValueError("kind='set' needs values")
        if self.units is not None:
            self.units = [int(u) for u in self.units]

    def to_dict(self) -> dict:
        return asdict(self)


def _select(act: torch.Tensor, pos: torch.Tensor | None, units) -> tuple:
    rows = torch.arange(act.shape[0], device=act.device)
    u = slice(None) if units is None else torch.as_tensor(units, dtype=torch.long, device=act.device)
    if pos is None:
        return (slice(None), slice(None), u)
    return (rows, pos.to(act.device), u) if units is None else (rows[:, None], pos.to(act.device)[:, None], u[None])


def _check_units(iv: Intervention, width: int) -> None:
    if iv.units is not None and iv.units and (min(iv.units) < 0 or max(iv.units) >= width):
        raise ValueError(f"units {min(iv.units)}..{max(iv.units)} out of range for {iv.site} (width {width})")


@torch.no_grad()
def _cache(model, tokens, names):
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    return cache


@torch.no_grad()
def run_with_interventions(model, ps: ProbeSet, interventions: list[Intervention], *,
                           source: ProbeSet | None = None) -> torch.Tensor:
    """Logits at each query's answer position, (n, vocab), with every intervention applied."""
    ps = as_probe_set(ps)
    check_hooks(model, [iv.site for iv in interventions])
    dev = model_device(model)
    tokens = ps.tokens.to(dev)
    need_clean = sorted({iv.site for iv in interventions if iv.kind == "mean"})
    need_src = sorted({iv.site for iv in interventions if iv.kind == "patch"})
    clean = _cache(model, tokens, need_clean) if need_clean else {}
    if need_src:
        if source is None or len(source) != len(ps):
            raise ValueError("kind='patch' needs a row-aligned source query set of the same length")
        src = _cache(model, source.tokens.to(dev), need_src)
    fwd = []
    for iv in interventions:
        pos = ps.positions(iv.position)

        def hook(act, hook=None, iv=iv, pos=pos):
            _check_units(iv, act.shape[-1])
            act = act.clone()
            idx = _select(act, pos, iv.units)
            if iv.kind == "zero":
                act[idx] = 0.0
            elif iv.kind == "set":
                act[idx] = torch.as_tensor(iv.values, dtype=act.dtype, device=act.device)
            elif iv.kind == "mean":
                c = clean[iv.site]
                p = pos if pos is not None else None
                mean = (c[torch.arange(c.shape[0]), p.to(c.device)] if p is not None else c.reshape(-1, c.shape[-1])).mean(0)
                act[idx] = (mean if iv.units is None else mean[torch.as_tensor(iv.units, dtype=torch.long)]).to(act.dtype)
            else:  # patch: same rows and positions (source positions of the same kind)
                s = src[iv.site]
                spos = source.positions(iv.position)
                act[idx] = s[_select(s, spos, iv.units)].to(act.dtype)
            return act

        fwd.append((iv.site, hook))
    logits = logits_of(model.run_with_hooks(tokens, fwd_hooks=fwd) if fwd else model(tokens))
    return logits[torch.arange(len(ps), device=logits.device), ps.answer_pos.to(logits.device)].cpu()


def intervened_accuracy(model, ps: ProbeSet, interventions, targets=None, **kw) -> float:
    if len(ps) == 0:
        return float("nan")
    t = ps.object_tokens if targets is None else targets
    return float((run_with_interventions(model, ps, interventions, **kw).argmax(-1) == t).double().mean())


# ---- relation-token swap ------------------------------------------------------------

@dataclass
class RelationSwap:
    relation: int
    new_relation: int
    moved_to_new: float  # fraction answering pi_{r'}(s)
    stayed_on_old: float  # fraction still answering pi_r(s)
    clean_accuracy: float
    intervention: dict

    def to_dict(self) -> dict:
        return asdict(self)


def relation_swap(model, ps: ProbeSet, r: int, r_new: int, site: str | None = None) -> RelationSwap:
    """Patch the relation token's embedding of ``[s, r]`` with that of ``[s, r_new]`` (same subjects)."""
    ps = as_probe_set(ps)
    check_relation(ps, r), check_relation(ps, r_new)
    if ps.relation_pos is None:
        raise ValueError("relation_swap needs queries with a single relation token (relation_pos)")
    a, b = ps.for_relation(r), ps.for_relation(r_new)
    order = {int(s): i for i, s in enumerate(b.subjects)}
    common = [i for i, s in enumerate(a.subjects.tolist()) if s in order]
    if not common:
        raise ValueError(f"relations {r} and {r_new} share no subjects")
    a = a.subset(torch.tensor(common))
    b = b.subset(torch.tensor([order[int(s)] for s in a.subjects]))
    iv = Intervention(site or hooks.embed(), "patch", None, "relation")
    pred = run_with_interventions(model, a, [iv], source=b).argmax(-1)
    clean = run_with_interventions(model, a, []).argmax(-1)
    return RelationSwap(r, r_new, float((pred == b.object_tokens).double().mean()),
                        float((pred == a.object_tokens).double().mean()),
                        float((clean == a.object_tokens).double().mean()), iv.to_dict())


# ---- selectivity and unit ablation --------------------------------------------------

@dataclass
class Selectivity:
    site: str
    mean_activation: list[list[float]]  # (units, relations)
    preferred: list[int]  # argmax relation per unit
    index: list[float]  # (top - mean of others) / (top + mean of others), in [-1, 1]; 1 = fires for one relation only
    relations: list[int]

    def to_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def selectivity(model, ps: ProbeSet, site: str | None = None) -> Selectivity:
    """Mean (post-ReLU) activation of each unit at the answer position, per relation."""
    ps = as_probe_set(ps)
    site = site or hooks.mlp_post(0)
    check_hooks(model, [site])
    cache = _cache(model, ps.tokens.to(model_device(model)), [site])[site]
    act = cache[torch.arange(len(ps)), ps.answer_pos.to(cache.device)].float().cpu()
    rels = ps.relation_ids
    A = torch.stack([act[ps.relations == r].mean(0) for r in rels], 1)  # (units, R)
    top, arg = A.max(1)
    others = (A.sum(1) - top) / max(len(rels) - 1, 1)
    idx = (top - others) / (top.abs() + others.abs()).clamp_min(1e-12)
    return Selectivity(site, A.tolist(), [rels[i] for i in arg.tolist()], idx.tolist(), rels)


@dataclass(frozen=True)
class AblationResult(Result):
    site: str
    per_relation: list[dict]
    clean_per_relation: list[float]
    chance: float
    selectivity: dict = field(repr=False, default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def records(self) -> list[dict]:
        """One row per ablated relation (without the unit lists)."""
        return [{k: v for k, v in r.items() if k not in ("ablated_units", "random_units", "intervention")}
                for r in self.per_relation]


def relation_units(sel: Selectivity, r: int, n_units: int | None = None) -> list[int]:
    """Units preferring ``r`` (or the top ``n_units`` by A[u, r] - mean_{r' != r} A[u, r'])."""
    A = np.asarray(sel.mean_activation)
    j = sel.relations.index(r)
    contrast = A[:, j] - (A.sum(1) - A[:, j]) / max(A.shape[1] - 1, 1)
    order = np.argsort(-contrast)
    if n_units is None:
        return sorted(int(u) for u in order if sel.preferred[u] == r and contrast[u] > 0)
    return sorted(int(u) for u in order[:n_units])


def ablate_relation_units(model, ps: ProbeSet, relations: list[int] | None = None, *, site: str | None = None,
                          n_units: int | None = None, kind: str = "zero", seed: int = 0) -> AblationResult:
    """Per relation r: ablate r's selector units; accuracy on r, on the others, and with random units."""
    ps = as_probe_set(ps)
    site = site or hooks.mlp_post(0)
    sel = selectivity(model, ps, site)
    rels = ps.relation_ids if relations is None else list(relations)
    for r in rels:
        check_relation(ps, r)
    width = len(sel.preferred)
    rng = np.random.default_rng(seed)
    clean = {r: intervened_accuracy(model, ps.for_relation(r), []) for r in ps.relation_ids}
    rows = []
    for r in rels:
        units = relation_units(sel, r, n_units)
        rand = sorted(int(u) for u in rng.choice(width, size=len(units), replace=False)) if units else []
        on, off = ps.for_relation(r), ps.subset(torch.nonzero(ps.relations != r).reshape(-1))
        iv, ivr = Intervention(site, kind, units), Intervention(site, kind, rand)
        rows.append({"relation": int(r), "ablated_units": units, "n_ablated": len(units),
                     "accuracy_on_relation": intervened_accuracy(model, on, [iv]) if units else clean[r],
                     "accuracy_on_others": intervened_accuracy(model, off, [iv]) if units else float("nan"),
                     "random_units": rand,
                     "random_units_accuracy_on_relation": intervened_accuracy(model, on, [ivr]),
                     "random_units_accuracy_on_others": intervened_accuracy(model, off, [ivr]),
                     "intervention": iv.to_dict()})
    chance = 1.0 / max(len(torch.unique(ps.object_tokens)), 1)
    return AblationResult(site, rows, [clean[r] for r in ps.relation_ids], chance, sel.to_dict())
