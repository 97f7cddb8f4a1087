"""Original (OP) and decoupled (DP) linear-memory problems.

Embeddings are i.i.d. N(0, I_d / d). Score s[mu, rho] = u_rho^T W e_mu; input mu
is recalled iff its own output scores highest.

* OP: one shared set of outputs U (p x d); competitors of input mu are the
  other rows of U.
* DP: input mu has a private target t_mu and p - 1 private competitors
  c^(mu)_1..c^(mu)_{p-1}. They are never stored as a dense p x p x d tensor:
  they are generated in blocks (input block i, competitor block j), each from
  its own derived seed, so any slice can be regenerated on demand.

Everything is generated in fixed-size row blocks with per-block seeds, so an
instance of size p is exactly the first p rows of any larger instance with the
same seed ("nested instances"): recall is then monotone in p up to solver noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import torch
from jaxtyping import Float
from torch import Tensor

from ..seeding import generator

PROBLEMS = ("original", "decoupled")
ROW_BLOCK = 64  # rows per generated block of E, U, T; also the DP input block
COMP_BLOCK = 256  # competitors per generated DP block


def load(p: int, d: int) -> float:
    """alpha = p ln p / d^2."""
    return p * math.log(p) / d**2


def p_for_alpha(alpha: float, d: int) -> int:
    """Smallest integer p >= 2 with p ln p / d^2 >= alpha."""
    target = alpha * d * d
    lo, hi = 2, 2
    while hi * math.log(hi) < target:
        hi *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        if mid * math.log(mid) >= target:
            hi = mid
        else:
            lo = mid + 1
    return max(lo, 2)


def _rows(seed: int, tag: str, n: int, d: int) -> Float[Tensor, "n d"]:
    """First n rows of the seeded block stream ``tag`` (CPU, float32)."""
    blocks = []
    for b in range(math.ceil(n / ROW_BLOCK)):
        g = generator(seed, tag, d, b)
        blocks.append(torch.randn(ROW_BLOCK, d, generator=g))
    return torch.cat(blocks)[:n] / math.sqrt(d)


@dataclass(frozen=True)
class MemoryProblem:
    """One seeded instance: ``kind`` in PROBLEMS, p associations in dimension d."""

    kind: str
    d: int
    p: int
    seed: int

    def __post_init__(self) -> None:
        if self.kind not in PROBLEMS:
            raise ValueError(f"problem {self.kind!r}: allowed values are {', '.join(PROBLEMS)}")
        if self.d < 1:
            raise ValueError(f"d={self.d}: must be a positive integer")
        if self.p < 2:
            raise ValueError(f"p={self.p}: need at least 2 associations")

    @property
    def alpha(self) -> float:
        return load(self.p, self.d)

    def inputs(self) -> Float[Tensor, "p d"]:
        return _rows(self.seed, "E", self.p, self.d)

    def outputs(self) -> Float[Tensor, "p d"]:
        """OP: the shared outputs U. DP: the private targets t_mu."""
        return _rows(self.seed, "U" if self.kind == "original" else "T", self.p, self.d)

    # ---- decoupled competitors -------------------------------------------------
    def competitors(self, start: int, stop: int, out: Tensor | None = None) -> Float[Tensor, "rows p_minus_1 d"]:
        """DP competitors of inputs start..stop-1, shape (stop-start, p-1, d) (dense: moderate p only).

        With ``out`` (a float32 (stop-start, p-1, d) tensor or view, e.g. a slice of a padded batch) the
        blocks are written straight into it: generated once, scaled on the way, no intermediate copy.
        """
        if self.kind != "decoupled":
            raise ValueError("competitors() exists only for the decoupled problem")
        shape = (stop - start, self.p - 1, self.d)
        if out is None:
            out = torch.empty(shape)
        elif tuple(out.shape) != shape or out.dtype != torch.float32:
            raise ValueError(f"competitors(out=...): need a float32 tensor of shape {shape}, got "
                             f"{out.dtype} {tuple(out.shape)}")
        buf = torch.empty(ROW_BLOCK, COMP_BLOCK, self.d)
        scale = math.sqrt(self.d)
        for i in range(start // ROW_BLOCK, math.ceil(stop / ROW_BLOCK)):
            r0, r1 = max(start, i * ROW_BLOCK), min(stop, (i + 1) * ROW_BLOCK)
            for c0, c1, raw in self._raw_blocks(i, buf):  # same values as competitor_blocks: raw / sqrt(d)
                torch.div(raw[r0 - i * ROW_BLOCK : r1 - i * ROW_BLOCK], scale, out=out[r0 - start : r1 - start, c0:c1])
        return out

    def _raw_blocks(self, i: int, buf: Tensor) -> Iterator[tuple[int, int, Tensor]]:
        """Unscaled N(0, 1) competitor blocks of input block i, generated into ``buf`` (see competitor_blocks)."""
        rows = min(self.p, (i + 1) * ROW_BLOCK) - i * ROW_BLOCK
        n_comp = self.p - 1
        for j in range(math.ceil(n_comp / COMP_BLOCK)):
            g = generator(self.seed, "C", self.d, i, j)
            torch.randn(ROW_BLOCK, COMP_BLOCK, self.d, generator=g, out=buf)
            c0, c1 = j * COMP_BLOCK, min(n_comp, (j + 1) * COMP_BLOCK)
            yield c0, c1, buf[:rows, : c1 - c0]

    def competitor_blocks(self, i: int, buf: Tensor | None = None) -> Iterator[tuple[int, int, Tensor]]:
        """For input block i: (c0, c1, competitors[rows of block i, c0:c1]) one block at a time.

        Each yielded tensor is only valid until the next one: with ``buf`` (a float32
        (ROW_BLOCK, COMP_BLOCK, d) tensor) every block is generated into it in place, so
        scanning all p^2 candidates allocates nothing per block.
        """
        if self.kind != "decoupled":
            raise ValueError("competitor_blocks() exists only for the decoupled problem")
        if buf is None:
            buf = torch.empty(ROW_BLOCK, COMP_BLOCK, self.d)
        for c0, c1, raw in self._raw_blocks(i, buf):
            buf.div_(math.sqrt(self.d))
            yield c0, c1, raw

    def dense_bytes(self) -> int:
        """Bytes a dense float32 copy of the competitors would take."""
        return 4 * self.p * (self.p - 1) * self.d if self.kind == "decoupled" else 4 * self.p * self.d


# ---- scores -------------------------------------------------------------------

@dataclass
class Scores:
    """Per-input target score and competitor statistics for one W."""

    target: Tensor  # (p,) s[mu, mu]
    comp_mean: Tensor  # (p,) mean over the p-1 competitors
    comp_std: Tensor  # (p,) std over the p-1 competitors
    comp_max: Tensor  # (p,) max over the p-1 competitors

    @property
    def recalled(self) -> Tensor:
        return self.target > self.comp_max

    @property
    def accuracy(self) -> float:
        return float(self.recalled.double().mean())


def _std(C: Tensor) -> Tensor:
    """Per-row competitor std (0 when there is a single competitor, p = 2)."""
    return C.std(1) if C.shape[1] > 1 else torch.zeros(C.shape[0], dtype=C.dtype)


@torch.no_grad()
def scores(problem: MemoryProblem, W: Float[Tensor, "d d"], *, keep_competitors: bool = False, chunk: int = ROW_BLOCK,
           competitors: Tensor | None = None):
    """Target/competitor score statistics of W on ``problem`` (float64, chunked).

    With ``keep_competitors`` also returns the (p, p-1) competitor score matrix
    (only sensible for moderate p). ``competitors``: the decoupled problem's dense
    float32 (p, p-1, d) competitors when the caller already holds them (training
    does); they are then read instead of regenerated, block by block as generated,
    so the result is the same to the bit.
    """
    W = W.detach().to("cpu", torch.float64)
    E = problem.inputs().double()
    V = E @ W.T  # (p, d): v_mu = W e_mu
    T = problem.outputs().double()
    target = (T * V).sum(-1)
    means, stds, maxs, comps = [], [], [], []
    if problem.kind == "original":
        for start in range(0, problem.p, chunk):
            stop = min(problem.p, start + chunk)
            S = V[start:stop] @ T.T  # (rows, p)
            idx = torch.arange(start, stop)
            mask = torch.ones_like(S, dtype=torch.bool)
            mask[idx - start, idx] = False
            C = S[mask].view(stop - start, problem.p - 1)
            means.append(C.mean(1)); stds.append(_std(C)); maxs.append(C.max(1).values)
            if keep_competitors:
                comps.append(C)
    else:  # one (64 inputs x 256 candidates) block at a time: memory stays O(block), whatever p
        if competitors is not None and tuple(competitors.shape) != (problem.p, problem.p - 1, problem.d):
            raise ValueError(f"scores(competitors=...): need shape {(problem.p, problem.p - 1, problem.d)}, "
                             f"got {tuple(competitors.shape)}")
        buf = torch.empty(ROW_BLOCK, COMP_BLOCK, problem.d)  # reused for every block
        buf64 = torch.empty(ROW_BLOCK, COMP_BLOCK, problem.d, dtype=torch.float64)
        for i in range(math.ceil(problem.p / ROW_BLOCK)):
            Vi = V[i * ROW_BLOCK : (i + 1) * ROW_BLOCK]
            C = torch.empty(Vi.shape[0], problem.p - 1, dtype=torch.float64)  # (rows, p-1) scores only
            for c0, c1, Cb in _blocks_of(problem, i, buf, competitors):
                Cd = buf64[: Cb.shape[0], : Cb.shape[1]]
                Cd.copy_(Cb)
                C[:, c0:c1] = torch.einsum("rkd,rd->rk", Cd, Vi)
            means.append(C.mean(1)); stds.append(_std(C)); maxs.append(C.max(1).values)
            if keep_competitors:
                comps.append(C)
    sc = Scores(target, torch.cat(means), torch.cat(stds), torch.cat(maxs))
    if keep_competitors:
        return sc, torch.cat(comps)
    return sc


def _blocks_of(problem: MemoryProblem, i: int, buf: Tensor, dense: Tensor | None) -> Iterator[tuple[int, int, Tensor]]:
    """Competitor blocks of input block i: generated into ``buf``, or sliced from ``dense`` (same blocks)."""
    if dense is None:
        yield from problem.competitor_blocks(i, buf)
        return
    r0, r1 = i * ROW_BLOCK, min(problem.p, (i + 1) * ROW_BLOCK)
    for c0 in range(0, problem.p - 1, COMP_BLOCK):
        c1 = min(problem.p - 1, c0 + COMP_BLOCK)
        yield c0, c1, dense[r0:r1, c0:c1]


def accuracy(problem: MemoryProblem, W: Tensor) -> float:
    """Fraction of inputs whose target strictly beats every competitor."""
    return scores(problem, W).accuracy
