"""Accuracy of a fact model on a set of queries."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor, nn

from ..results import MappingResult
from .world import IGNORE, FactWorld, Queries


@dataclass(frozen=True)
class EvalResult(MappingResult):
    """Exact-match accuracy of a fact model; ``records``: one row per relation (``relation``, ``accuracy``)."""

    accuracy: float
    per_relation: list  # accuracy per relation id (NaN where the queries have none)
    token_accuracy: float
    n_queries: int

    @property
    def records(self) -> list[dict]:
        return [{"relation": r, "accuracy": a} for r, a in enumerate(self.per_relation)]


def check_compatible(model: nn.Module, world: FactWorld) -> None:
    """ValueError unless the model's vocabulary matches the world's."""
    cfg = model.cfg
    if (cfg.n_entities, cfg.n_relations) != (world.n_entities, world.n_relations):
        raise ValueError(f"model has n_entities={cfg.n_entities}, n_relations={cfg.n_relations} but the world "
                         f"has {world.n_entities}, {world.n_relations}")
    n_out = getattr(cfg, "outputs", cfg.n_entities)
    if n_out < world.n_attributes:
        raise ValueError(f"model scores {n_out} outputs (entities 0..{n_out - 1}) but the world's answers range over "
                         f"{world.n_attributes} (its attribute pool)")
    if cfg.n_special < world.n_special:
        raise ValueError(f"model has n_special={cfg.n_special}: the world needs {world.n_special} (PAD)")


def supervised_logits(model: nn.Module, tokens: Tensor, supervised: Tensor) -> Tensor:
    """Logits at the supervised positions only, shape (n_supervised, N).

    A FactModel unembeds just those positions (the unembedding dominates the
    cost for large N); any other module is run in full and indexed.
    """
    if hasattr(model, "supervised_resid"):
        return model.supervised_resid(tokens, supervised) @ model.W_U
    return model(tokens)[supervised]


@torch.no_grad()
def evaluate(model: nn.Module, world: FactWorld, queries: Queries | None = None, *,
             batch_size: int = 8192) -> EvalResult:
    """Exact-match accuracy (default: all single-hop facts of ``world``).

    A query counts as correct when the argmax logit is right at EVERY supervised
    position (for chain of thought: the whole chain). Returns ``accuracy``,
    ``per_relation`` (accuracy grouped by the query's LAST relation, a list of
    length R; NaN for a relation with no query), ``token_accuracy`` (over
    supervised positions) and ``n_queries``, as an :class:`EvalResult` (also read as a dict).
    """
    check_compatible(model, world)
    queries = world.single_hop() if queries is None else queries
    was_training = model.training
    model.eval()
    device = model.device
    ok, tok_right, tok_total = [], 0, 0
    for i in range(0, len(queries), batch_size):
        tokens = queries.tokens[i: i + batch_size].to(device)
        targets = queries.targets[i: i + batch_size].to(device)
        supervised = targets != IGNORE
        pred = torch.full_like(targets, IGNORE)
        pred[supervised] = supervised_logits(model, tokens, supervised).argmax(-1)
        right = (pred == targets) & supervised
        ok.append((right | ~supervised).all(1).cpu())
        tok_right += int(right.sum())
        tok_total += int(supervised.sum())
    model.train(was_training)
    ok_t = torch.cat(ok) if ok else torch.zeros(0, dtype=torch.bool)
    last = queries.relations[:, -1]
    per_relation = []
    for r in range(world.n_relations):
        sel = ok_t[last == r]
        per_relation.append(float(sel.double().mean()) if len(sel) else float("nan"))
    return EvalResult(accuracy=float(ok_t.double().mean()) if len(ok_t) else float("nan"),
                      per_relation=per_relation,
                      token_accuracy=tok_right / tok_total if tok_total else float("nan"),
                      n_queries=len(queries))


@torch.no_grad()
def greedy_chain(model: nn.Module, world: FactWorld, subjects: Int[Tensor, "n"],
                 relations: Int[Tensor, "n k"]) -> Int[Tensor, "n k"]:
    """Free-running chain of thought: feed ``[s, r1..rk]``, append each argmax, return e1..ek.

    Uses the grouped CoT layout of :meth:`FactWorld.k_hop`; the model must
    accept sequences of length 2k.
    """
    check_compatible(model, world)
    device = model.device
    seq = torch.cat([subjects[:, None], relations + world.n_entities], 1).to(device)
    out = []
    for _ in range(relations.shape[1]):
        nxt = model(seq)[:, -1].argmax(-1)
        out.append(nxt)
        seq = torch.cat([seq, nxt[:, None]], 1)
    return torch.stack(out, 1).cpu()
