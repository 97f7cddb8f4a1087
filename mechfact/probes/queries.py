"""What every probe consumes: a hooked model plus a :class:`ProbeSet` of (subject, relation, object) queries.

A ``ProbeSet`` is model-agnostic: token ids, the position of the subject's
(last) token, the position whose logits predict the object, and integer ids.
:func:`from_world` builds one from a :class:`~mechfact.facts.FactWorld`
(tokens ``[s, r]``: subject at position 0, answer read at position 1); a
pretrained-model loader builds the same object from prompt templates.

Sites name what a probe reads: a hook point plus a position, ``subject``
(the subject's token) or ``last`` (the answer position), e.g.
``Site("blocks.0.hook_resid_mid", "last")``. :func:`collect` runs the model once
with a cache restricted to the requested hooks and returns one
(n_queries, features) array per site.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

POSITIONS = ("subject", "last")


@dataclass
class ProbeSet:
    """n queries; all tensors (n,) except ``tokens`` (n, pos)."""

    tokens: Int[Tensor, "n pos"]
    subjects: Int[Tensor, "n"]  # subject ids (e.g. entity ids)
    relations: Int[Tensor, "n"]  # relation ids 0..R-1
    objects: Int[Tensor, "n"]  # object ids (rows of an object-vector table)
    object_tokens: Int[Tensor, "n"]  # output-vocabulary index of the object (accuracy = argmax == this)
    subject_pos: Int[Tensor, "n"]  # position of the subject's (last) token
    answer_pos: Int[Tensor, "n"]  # position whose logits predict the object
    relation_pos: Int[Tensor, "n"] | None = None  # position of the relation token, where one exists
    relation_token_ids: Int[Tensor, "R"] | None = None  # token of each relation (for relation swaps)

    def __post_init__(self) -> None:
        n = self.tokens.shape[0]
        if self.tokens.ndim != 2:
            raise ValueError(f"tokens has shape {tuple(self.tokens.shape)}: expected (n, pos)")
        for name in ("subjects", "relations", "objects", "object_tokens", "subject_pos", "answer_pos"):
            v = getattr(self, name)
            if v.shape != (n,):
                raise ValueError(f"{name} has shape {tuple(v.shape)}: expected ({n},), one per query")

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def relation_ids(self) -> list[int]:
        return sorted(int(r) for r in self.relations.unique())

    def subset(self, index) -> "ProbeSet":
        index = torch.as_tensor(index)
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        return ProbeSet(self.tokens[index], self.subjects[index], self.relations[index], self.objects[index],
                        self.object_tokens[index], self.subject_pos[index], self.answer_pos[index],
                        pick(self.relation_pos), self.relation_token_ids)

    def for_relation(self, r: int) -> "ProbeSet":
        check_relation(self, r)
        return self.subset(torch.nonzero(self.relations == r).reshape(-1))


def check_relation(ps: ProbeSet, r: int) -> None:
    if int(r) not in ps.relation_ids:
        raise ValueError(f"relation {r} is not in the queries; relations present: {ps.relation_ids}")


def from_world(world, subjects=None) -> ProbeSet:
    """Single-hop queries ``[s, r]`` of a FactWorld (all subjects by default)."""
    q = world.single_hop(subjects)
    n = len(q)
    return ProbeSet(tokens=q.tokens, subjects=q.subjects, relations=q.relations[:, 0], objects=q.answers,
                    object_tokens=q.answers, subject_pos=torch.zeros(n, dtype=torch.long),
                    answer_pos=torch.ones(n, dtype=torch.long), relation_pos=torch.ones(n, dtype=torch.long),
                    relation_token_ids=torch.arange(world.n_relations) + world.n_entities)


@dataclass(frozen=True)
class Site:
    """A hook point and the position read there (``subject`` or ``last`` = answer position)."""

    hook: str
    position: str = "last"

    def __post_init__(self) -> None:
        if self.position not in POSITIONS:
            raise ValueError(f"site position {self.position!r}: allowed {', '.join(POSITIONS)}")

    def __str__(self) -> str:
        return f"{self.hook}@{self.position}"

    @classmethod
    def parse(cls, text: str) -> "Site":
        hook, _, pos = text.partition("@")
        return cls(hook, pos or "last")


def hook_names(model) -> list[str]:
    return sorted(getattr(model, "hook_dict", {}))


def check_hooks(model, names) -> None:
    """ValueError naming the missing hook points and the ones the model has."""
    have = set(getattr(model, "hook_dict", {}) or {})
    if not have:
        raise ValueError(f"{type(model).__name__} has no transformer-lens hook points (hook_dict); "
                         "probes need a HookedRootModule / TransformerBridge model")
    missing = [n for n in names if n not in have]
    if missing:
        import difflib

        m = missing[0]
        near = sorted(n for n in have if n.rsplit(".", 1)[0] == m.rsplit(".", 1)[0])
        near = near or difflib.get_close_matches(m, sorted(have), n=12, cutoff=0.5)
        shown = ", ".join(near or sorted(have)[:30])
        raise ValueError(f"unknown hook site(s) {missing}; the model has {len(have)} hook points, "
                         f"{'near it' if near else 'e.g.'}: {shown}")


def model_device(model) -> torch.device:
    dev = getattr(model, "device", None)
    if isinstance(dev, torch.device):
        return dev
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def logits_of(out) -> Tensor:
    return out.logits if hasattr(out, "logits") else out


@torch.no_grad()
def collect(model, ps: ProbeSet, sites: list[Site], batch_size: int = 4096) -> dict[Site, np.ndarray]:
    """Activations at each site, (n, features) float64, read at the site's position of each query."""
    sites = list(sites)
    check_hooks(model, [s.hook for s in sites])
    names = sorted({s.hook for s in sites})
    dev = model_device(model)
    out: dict[Site, list] = {s: [] for s in sites}
    for i in range(0, len(ps), batch_size):
        sl = slice(i, i + batch_size)
        _, cache = model.run_with_cache(ps.tokens[sl].to(dev), names_filter=lambda n: n in names)
        rows = torch.arange(ps.tokens[sl].shape[0])
        for s in sites:
            pos = (ps.subject_pos if s.position == "subject" else ps.answer_pos)[sl]
            act = cache[s.hook]
            if act.ndim != 3:
                raise ValueError(f"hook {s.hook} has shape {tuple(act.shape)}: readouts need (batch, pos, features)")
            out[s].append(act[rows, pos.to(act.device)].float().cpu())
    return {s: torch.cat(v).double().numpy() for s, v in out.items()}


@torch.no_grad()
def predictions(model, ps: ProbeSet, fwd_hooks=(), batch_size: int = 4096) -> Tensor:
    """Argmax token at each query's answer position (optionally under forward hooks)."""
    dev = model_device(model)
    preds = []
    for i in range(0, len(ps), batch_size):
        tok = ps.tokens[i: i + batch_size].to(dev)
        logits = logits_of(model.run_with_hooks(tok, fwd_hooks=list(fwd_hooks)) if fwd_hooks else model(tok))
        rows = torch.arange(tok.shape[0], device=logits.device)
        preds.append(logits[rows, ps.answer_pos[i: i + batch_size].to(logits.device)].argmax(-1).cpu())
    return torch.cat(preds) if preds else torch.zeros(0, dtype=torch.long)


def accuracy(model, ps: ProbeSet, fwd_hooks=(), targets: Tensor | None = None) -> float:
    if len(ps) == 0:
        return float("nan")
    t = ps.object_tokens if targets is None else targets
    return float((predictions(model, ps, fwd_hooks) == t).double().mean())
