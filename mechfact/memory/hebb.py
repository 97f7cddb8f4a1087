"""The Hebbian solver, and the rank of W shared by every solver.

* ``hebb``: W = sum_mu u_mu e_mu^T (DP: the private targets t_mu); with
  kappa < 1 its best rank-m approximation (truncated SVD), m = ``rank_of(d, kappa)``.
* ``hebb_bytes``: its estimated peak memory.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .problems import MemoryProblem


def check_kappa(kappa: float) -> float:
    if not (0.0 < kappa <= 1.0):
        raise ValueError(f"kappa={kappa}: must lie in (0, 1]")
    return kappa


def rank_of(d: int, kappa: float) -> int:
    """m = round(kappa * d), at least 1."""
    return max(1, int(round(check_kappa(kappa) * d)))



def hebb(problem: MemoryProblem, kappa: float = 1.0) -> Tensor:
    """Hebbian W = sum_mu u_mu e_mu^T (truncated to rank kappa*d if kappa < 1)."""
    E, U = problem.inputs().double(), problem.outputs().double()
    W = U.T @ E
    m = rank_of(problem.d, kappa)
    if m < problem.d:
        Uw, S, Vh = torch.linalg.svd(W)
        W = (Uw[:, :m] * S[:m]) @ Vh[:m]
    return W.float()


def hebb_bytes(d: int, p: int, kappa: float = 1.0) -> float:
    """Estimated peak bytes of :func:`hebb` plus the float64 accuracy check of its W (E, U, V in float64, W and
    its SVD)."""
    return 8.0 * (4 * p * d + (5 if kappa < 1 else 2) * d * d)
