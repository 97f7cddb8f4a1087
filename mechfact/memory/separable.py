"""The exact finite-size decision whether perfect recall is achievable (:func:`separable`).

Perfect recall is a homogeneous linear feasibility problem in vec(W): (u_mu - u_rho)^T W e_mu > 0 for all
rho != mu. We solve max t s.t. a_k . w >= t, |w_i| <= 1 with HiGHS on a
working set of constraints, adding violated ones until W recalls everything
(a certificate of separability) or the working set alone is infeasible
(t* <= tol: a certificate that the full set is infeasible too).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .hebb import hebb
from .problems import ROW_BLOCK, MemoryProblem, scores


@dataclass(frozen=True)
class SeparableOutput:
    """The LP's decision for one problem; ``records``: that one row."""

    separable: bool
    W: Tensor | None  # a perfect-recall W when separable
    t_star: float  # LP optimum of the last working set (max-min margin, box-normalised)
    n_constraints: int
    iterations: int

    @property
    def records(self) -> list[dict]:
        return [self.to_dict()]

    def to_dict(self) -> dict:
        """The numbers (a perfect-recall matrix stays in ``W``)."""
        return {"separable": self.separable, "t_star": self.t_star, "n_constraints": self.n_constraints,
                "iterations": self.iterations}


def _constraint_rows(problem: MemoryProblem, E: Tensor, T: Tensor, pairs: np.ndarray) -> np.ndarray:
    """Rows a_k = vec((target_mu - competitor) e_mu^T) * d for (mu, j) pairs."""
    mu, j = pairs[:, 0], pairs[:, 1]
    if problem.kind == "original":
        diff = T[mu] - T[j]
    else:
        diff = np.empty((len(pairs), problem.d))
        for blk in np.unique(mu // ROW_BLOCK):  # regenerate each needed input block once
            r0 = int(blk) * ROW_BLOCK
            c = problem.competitors(r0, min(problem.p, r0 + ROW_BLOCK)).double().numpy()
            sel = mu // ROW_BLOCK == blk
            diff[sel] = T[mu[sel]] - c[mu[sel] - r0, j[sel]]
    return np.einsum("ki,kj->kij", diff, E[mu]).reshape(len(pairs), -1) * problem.d


def _violators(problem: MemoryProblem, W: Tensor, k: int, slack: float) -> np.ndarray:
    """Up to k most-violating (mu, j) pairs per input: competitor >= target - slack."""
    sc, comp = scores(problem, W, keep_competitors=True)
    comp = comp.numpy()
    tgt = sc.target.numpy()[:, None]
    viol = comp - (tgt - slack)
    out = []
    for mu in np.nonzero((viol >= 0).any(1))[0]:
        order = np.argsort(-viol[mu])[:k]
        order = order[viol[mu, order] >= 0]
        cols = order if problem.kind == "decoupled" else np.where(order >= mu, order + 1, order)
        out.extend((mu, c) for c in cols)
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def separable(problem: MemoryProblem, W_hint: Tensor | None = None, *, k_init: int = 8, k_add: int = 4,
              max_iter: int = 200, tol: float = 1e-7, time_limit: float = 900.0) -> SeparableOutput:
    """Decide exactly (up to LP tolerance) whether perfect recall is achievable.

    ``W_hint`` (e.g. a trained W) seeds the working set with its strongest
    competitors; if it already recalls everything it is itself the certificate.
    Cuts added each round: per input, up to ``k_add`` competitors whose margin
    under the current LP solution is below t* (they cut the current optimum).
    """
    from scipy.optimize import linprog

    if problem.p > 5000:
        raise ValueError(f"separable: p={problem.p} is too large for the exact LP here (at most 5000)")
    d = problem.d
    hint = hebb(problem).double() if W_hint is None else W_hint.double()
    if W_hint is not None and scores(problem, hint).accuracy == 1.0:
        return SeparableOutput(True, W_hint.float(), float("nan"), 0, 0)
    E = problem.inputs().double().numpy()
    T = problem.outputs().double().numpy()
    pairs = _violators(problem, hint, k_init, slack=float("inf"))
    rows = _constraint_rows(problem, E, T, pairs)
    nvar = d * d + 1
    c = np.zeros(nvar)
    c[-1] = -1.0
    bounds = [(-1.0, 1.0)] * (d * d) + [(None, None)]
    t_star = 0.0
    for it in range(1, max_iter + 1):
        A = np.hstack([-rows, np.ones((len(rows), 1))])
        res = linprog(c, A_ub=A, b_ub=np.zeros(len(rows)), bounds=bounds, method="highs-ds",
                      options={"time_limit": time_limit})
        if res.status != 0:
            raise RuntimeError(f"LP solver failed (status {res.status}: {res.message})")
        t_star = float(-res.fun)
        if t_star <= tol:
            return SeparableOutput(False, None, t_star, len(rows), it)
        W = torch.from_numpy(res.x[:-1].reshape(d, d))
        if scores(problem, W).accuracy == 1.0:
            return SeparableOutput(True, W.float(), t_star, len(rows), it)
        # rows are scaled by d: margin_k = d * (target - comp); cut where margin < t* (1 - 1e-9)
        new = _violators(problem, W, k_add, slack=t_star * (1 - 1e-9) / d)
        rows = np.vstack([rows, _constraint_rows(problem, E, T, new)])
        pairs = np.vstack([pairs, new])
    raise RuntimeError(f"separable(): no decision after {max_iter} constraint-generation rounds "
                       f"(d={d}, p={problem.p}, {len(rows)} constraints)")
