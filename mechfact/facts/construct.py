"""Explicit constructions (no training): block superposition + ReLU selector.

Attribute vectors: one per entity, ``a_e ~ N(0, I_b / b)`` with block size
``b = Theta(log N)`` (``generator(seed, "facts.construct.attr", b)``).

Residual stream, ``d = R * b + R`` coordinates::

    [block 0 | block 1 | ... | block R-1 | flag 0 ... flag R-1]
       b         b               b            one per relation

* Subject embedding (geometric memorisation): block r of subject s holds
  ``a_{pi_r(s)}``; flags are 0. So ``x_s`` is the superposition of its R
  attribute vectors, each in its own block.
* Relation embedding: ``e_r`` = unit vector on flag r. The R flag coordinates
  are the only extra room: they keep the relation signal orthogonal to every
  subject superposition so the gates below are exact.
* Attention: uniform (causal mean including the current position), W_V = W_O =
  I. At the relation position of ``[s, r]``: ``resid_mid = x_s / 2 + 3 e_r / 2``.
* MLP (the selector), width ``m = 2 R b``: one pair of units per (relation r,
  coordinate j), signs +/-; unit (r, j, sign) computes
  ``ReLU(sign * 2 * resid[block r, j] + lam * (2/3) * resid[flag r] - lam)``,
  i.e. ``ReLU(sign * a_j)`` when relation r is queried and 0 otherwise
  (``lam = 4 max|a| + 1`` dominates every coordinate, also at subject
  positions). The pair writes ``out_scale * (ReLU(a_j) - ReLU(-a_j)) =
  out_scale * a_j`` into coordinate j of block 0.
* Unembedding: ``u_e = a_e`` on block 0, zero elsewhere, so the logit is
  ``out_scale * a_e . a_{pi_r(s)} + a_e . a_{pi_0(s)} / 2`` (the second term is
  the subject's own block 0 reaching the output through the residual stream; a
  large ``out_scale`` makes it negligible). Decoding = nearest attribute vector
  by dot product.

Correctness then only needs ``|a_t|^2 > a_e . a_t`` for all e != t, which holds
with high probability once ``b >~ C log N``: so ``d = Theta(R log N)``.

Chain of thought (:func:`build_cot`): the same selector, applied at every step
to the (entity, relation) pair that a position-only attention head gathers into
a separate "copy" region of the residual stream; ``d = 2 (R b + R) + 2k``, MLP
width ``2 R b``, for any number of hops k. The model is built for one k (the
attention targets depend on it) on the grouped layout of
:meth:`~mechfact.facts.world.FactWorld.k_hop` with ``cot=True``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..seeding import generator
from .evaluate import EvalResult, evaluate
from .model import FactModel, FactModelConfig
from .world import FactWorld

logger = logging.getLogger(__name__)

__all__ = ["attribute_vectors", "superpose", "build_single_hop", "build_cot", "construct", "min_block_size",
           "scan_block_size", "ConstructResult", "construction_d", "cot_construction_d", "construction_width", "block_size_for"]


def construction_d(n_relations: int, block_size: int) -> int:
    """Residual width of the single-hop construction: R blocks plus R relation flags."""
    return n_relations * block_size + n_relations


def attribute_vectors(n_entities: int, block_size: int, seed: int = 0) -> Float[Tensor, "N b"]:
    """One attribute vector per entity, rows i.i.d. N(0, I_b / b)."""
    if block_size < 1:
        raise ValueError(f"block_size={block_size}: must be a positive integer")
    g = generator(seed, "facts.construct.attr", block_size)
    return torch.randn(n_entities, block_size, generator=g) / block_size**0.5


def superpose(attributes: Float[Tensor, "N b"], perms: Int[Tensor, "R N"]) -> Float[Tensor, "N Rb"]:
    """Subject embeddings: block r of row s is ``attributes[perms[r, s]]``."""
    R, N = perms.shape
    if attributes.shape[0] != N:
        raise ValueError(f"attributes has {attributes.shape[0]} rows: perms needs one per entity ({N})")
    return attributes[perms].permute(1, 0, 2).reshape(N, R * attributes.shape[1])


def _check_attributes(world: FactWorld, block_size: int, seed: int, out_scale: float,
                      attributes: Tensor | None) -> Tensor:
    N, b = world.n_entities, block_size
    if attributes is None:
        attributes = attribute_vectors(N, b, seed)
    if attributes.shape != (N, b):
        raise ValueError(f"attributes has shape {tuple(attributes.shape)}: expected (N, block_size) = ({N}, {b})")
    if out_scale <= 0:
        raise ValueError(f"out_scale={out_scale}: must be positive")
    return attributes


def _write_embeddings(model: FactModel, world: FactWorld, attributes: Tensor) -> None:
    """Token region [0, R b + R): entity superpositions on the blocks, relation flags after them."""
    R, b = world.n_relations, attributes.shape[1]
    flag = R * b
    model.W_E_ent.zero_()
    model.W_E_ent[:, :flag] = superpose(attributes, world.perms)
    model.W_E_rel.zero_()
    model.W_E_rel[torch.arange(R), flag + torch.arange(R)] = 1.0
    model.W_E_special.zero_()
    model.W_U_ent.zero_()
    model.W_U_ent[:b] = attributes.T  # decode block 0 of the token region


def _write_selector(model: FactModel, R: int, b: int, *, read: int, read_scale: float, flag_scale: float,
                    lam: float, out_scale: float) -> None:
    """The relation-gated ReLU selector; reads blocks at ``read``, flags right after, writes block 0.

    Unit 2c + k (c = r b + j, sign = +1 for k = 0, -1 for k = 1) computes
    ``ReLU(sign * read_scale * resid[read + c] + lam * flag_scale * resid[read + R b + r] - lam)``.
    """
    mlp = model.blocks[0].mlp
    mlp.W_in.zero_(), mlp.b_in.fill_(-lam), mlp.W_out.zero_(), mlp.b_out.zero_()
    c = torch.arange(R * b)
    for k, sign in enumerate((1.0, -1.0)):
        mlp.W_in[read + c, 2 * c + k] = sign * read_scale  # the block coordinate
        mlp.W_in[read + R * b + c // b, 2 * c + k] = lam * flag_scale  # the gate
        mlp.W_out[2 * c + k, c % b] = sign * out_scale  # ReLU(a) - ReLU(-a) = a, into block 0


@torch.no_grad()
def build_single_hop(world: FactWorld, block_size: int, *, seed: int = 0, out_scale: float = 16.0,
                     attributes: Float[Tensor, "N b"] | None = None) -> FactModel:
    """The explicit single-hop construction for ``world`` (module docstring), as a FactModel on CPU.

    ``attributes`` overrides the random attribute vectors (shape (N, block_size)).
    """
    attributes = _check_attributes(world, block_size, seed, out_scale, attributes)
    N, R, b = world.n_entities, world.n_relations, block_size
    d = construction_d(R, b)
    model = FactModel(FactModelConfig(N, R, d=d, mlp_width=2 * R * b, attention="uniform",
                                      embeddings="trainable", n_special=world.n_special, seed=seed))
    _write_embeddings(model, world, attributes)
    attn = model.blocks[0].attn
    attn.W_V.copy_(torch.eye(d))
    attn.W_O.copy_(torch.eye(d))
    # at [s, r]: resid_mid = x_s / 2 + 3 e_r / 2; at the subject position 2 x_s (so lam > 4 max|a|)
    lam = 4 * float(attributes.abs().max()) + 1.0
    _write_selector(model, R, b, read=0, read_scale=2.0, flag_scale=1 / 1.5, lam=lam, out_scale=out_scale)
    return model


def cot_construction_d(n_relations: int, block_size: int, hops: int) -> int:
    """Residual width of the CoT construction: token region, copy region, 2k one-hot positions."""
    return 2 * construction_d(n_relations, block_size) + 2 * hops


@torch.no_grad()
def build_cot(world: FactWorld, hops: int, block_size: int, *, seed: int = 0, out_scale: float = 16.0,
              beta: float = 40.0, attributes: Float[Tensor, "N b"] | None = None) -> FactModel:
    """Chain-of-thought construction for k = ``hops`` (grouped layout of ``world.k_hop(k, cot=True)``).

    Each step is the single-hop selector applied to (entity, relation) pairs that
    a position-only attention head gathers. Residual layout, ``d = 2 (R b + R) + 2k``::

        [token region T: R blocks + R flags | copy region C (same shape) | one-hot positions 0..2k-1]

    * Tokens and the unembedding use region T exactly as in :func:`build_single_hop`.
    * Attention (learned, scores from positions only, ``beta`` = score gap): the
      position k (token r_k) attends half/half to positions 0 (s) and 1 (r_1);
      position k+i (token e_i, i >= 1) attends half/half to position i+1
      (r_{i+1}) and to itself (e_i). Positions < k attend to themselves
      (unsupervised). OV copies region T into region C at scale 2, so C holds
      exactly ``x_e + e_r`` for the (entity, relation) of the current step,
      free of the current token's own embedding, which stays in T.
    * MLP: the single-hop selector reading region C, width ``2 R b``; it writes
      ``out_scale * a_{pi_r(e)}`` into block 0 of T, which the unembedding decodes.

    So ``d = O(R log N + k)`` and ``m = O(R log N)`` for any number of hops.
    Teacher-forced exact-chain accuracy (what :func:`evaluate` measures) equals
    the accuracy of greedy generation: if every step is right, greedy decoding
    feeds back the same tokens.
    """
    attributes = _check_attributes(world, block_size, seed, out_scale, attributes)
    if isinstance(hops, bool) or not isinstance(hops, int) or hops < 1:
        raise ValueError(f"hops={hops!r}: must be an integer >= 1")
    N, R, b, k = world.n_entities, world.n_relations, block_size, hops
    t = construction_d(R, b)  # size of the token region (and of the copy region)
    pos0, n_ctx = 2 * t, 2 * k
    d = cot_construction_d(R, b, k)
    model = FactModel(FactModelConfig(N, R, d=d, mlp_width=2 * R * b, attention="learned",
                                      embeddings="trainable", n_special=world.n_special, n_ctx=n_ctx, seed=seed))
    _write_embeddings(model, world, attributes)
    model.W_pos.zero_()
    model.W_pos[torch.arange(n_ctx), pos0 + torch.arange(n_ctx)] = 1.0

    attn = model.blocks[0].attn
    for W in (attn.W_Q, attn.W_K, attn.W_V, attn.W_O):
        W.zero_()
    attn.W_K[pos0 + torch.arange(n_ctx), pos0 + torch.arange(n_ctx)] = 1.0
    score = beta * d**0.5  # the head divides scores by sqrt(d)
    for p in range(n_ctx):
        keys = [0, 1] if p == k else ([p - k + 1, p] if p > k else [p])
        attn.W_Q[pos0 + p, [pos0 + j for j in keys]] = score
    attn.W_V[torch.arange(t), t + torch.arange(t)] = 2.0  # T -> C, undoing the half/half average
    attn.W_O.copy_(torch.eye(d))

    lam = 4 * float(attributes.abs().max()) + 1.0  # region C entries are at most 2 max|a| anywhere
    _write_selector(model, R, b, read=t, read_scale=1.0, flag_scale=1.0, lam=lam, out_scale=out_scale)
    return model


def scan_block_size(score: Callable[[int], tuple[FactModel, dict]], *, target: float, start: int = 1,
                    max_block: int = 256) -> tuple[int, FactModel, dict, list[dict]]:
    """Smallest block size b >= ``start`` with ``score(b)[1]["accuracy"] >= target``.

    ``score(b)`` builds a construction and evaluates it, returning ``(model, evaluate(...))``.
    Returns ``(b, model, result, scanned)``, ``scanned`` one ``{"block_size", "accuracy"}`` per b tried.
    """
    if start < 1:
        raise ValueError(f"start={start}: must be a positive integer")
    scanned = []
    for b in range(start, max_block + 1):
        model, res = score(b)
        scanned.append({"block_size": b, "accuracy": res["accuracy"]})
        logger.debug("b=%d accuracy=%.4f", b, res["accuracy"])
        if res["accuracy"] >= target:
            return b, model, res, scanned
    raise ValueError(f"no block size in {start}.. max_block={max_block} reaches accuracy {target}")


def min_block_size(n_entities: int, n_relations: int, *, target: float = 0.99, seed: int = 0,
                   start: int = 1, max_block: int = 256) -> tuple[int, dict]:
    """Smallest block size b >= ``start`` whose construction reaches ``target`` single-hop accuracy.

    Scans b = start, start + 1, ... on ``FactWorld(n_entities, n_relations, seed)`` with
    attributes seeded by ``seed``; returns ``(b, evaluate(...))``.
    """
    world = FactWorld(n_entities, n_relations, seed)

    def score(b: int) -> tuple[FactModel, dict]:
        model = build_single_hop(world, b, seed=seed)
        return model, evaluate(model, world)

    b, _, res, _ = scan_block_size(score, target=target, start=start, max_block=max_block)
    return b, res


def construction_width(n_relations: int, block_size: int, hops: int = 1, cot: bool = False) -> int:
    """Residual width of the construction with block size ``block_size`` (CoT for ``cot``)."""
    return cot_construction_d(n_relations, block_size, hops) if cot else construction_d(n_relations, block_size)


def block_size_for(d: int, n_relations: int, hops: int = 1, cot: bool = False) -> int:
    """The largest block size whose construction fits in width ``d`` (ValueError if none does)."""
    lo = construction_width(n_relations, 1, hops, cot)
    if d < lo:
        raise ValueError(f"--d {d}: the construction needs d >= {lo} for R={n_relations}"
                         + (f", k={hops}" if cot else ""))
    b = 1
    while construction_width(n_relations, b + 1, hops, cot) <= d:
        b += 1
    return b


@dataclass(frozen=True)
class ConstructResult(EvalResult):
    """:class:`EvalResult` of a construction on its queries, with its ``block_size``, width ``d`` and ``scan``
    (``{"block_size", "d", "accuracy"}`` per block size tried; empty when ``d`` was given)."""

    block_size: int = 0
    d: int = 0
    scan: list = field(default_factory=list)


def construct(world: FactWorld, d: int | None = None, *, hops: int = 1, cot: bool = False,
              target_accuracy: float = 0.99, seed: int = 0, device: str | torch.device = "cpu"
              ) -> tuple[FactModel, ConstructResult]:
    """The explicit construction for ``world``, evaluated: ``(model, info)``.

    ``d`` given: the largest block size fitting in width ``d``; ``d=None``: the
    smallest block size whose construction reaches ``target_accuracy``.
    ``hops > 1`` needs ``cot=True`` (:func:`build_cot`); ``seed`` draws the
    attribute vectors. ``info`` (a :class:`ConstructResult`, also read as a dict) is :func:`evaluate` on the
    training queries plus ``block_size``, ``d`` and ``scan`` (every block size tried).
    """
    if hops > 1 and not cot:
        raise ValueError(f"--hops {hops} without --cot: the explicit multi-hop construction is the "
                         "chain-of-thought one (direct k-hop answering has no compact construction)")
    R = world.n_relations
    queries = world.single_hop() if hops == 1 else world.k_hop(hops, cot=cot)

    def score(b: int) -> tuple[FactModel, dict]:
        model = build_cot(world, hops, b, seed=seed) if cot else build_single_hop(world, b, seed=seed)
        return model, evaluate(model.to(device), world, queries)

    scanned: list[dict] = []
    if d is not None:
        b = block_size_for(d, R, hops, cot)
        model, res = score(b)
    else:
        b, model, res, scanned = scan_block_size(score, target=target_accuracy)
        scanned = [{"block_size": s["block_size"], "d": construction_width(R, s["block_size"], hops, cot),
                    "accuracy": s["accuracy"]} for s in scanned]
    return model, ConstructResult(**res, block_size=b, d=model.cfg.d, scan=scanned)
