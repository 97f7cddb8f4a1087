"""Solvers for the linear-memory problem: Hebb, gradient training, exact LP.

The names every caller imports from here; each solver lives in its own module:

* ``hebb`` (:mod:`mechfact.memory.hebb`): W = sum_mu u_mu e_mu^T (DP: the private targets t_mu); with
  kappa < 1 its best rank-m approximation (truncated SVD).
* ``trained`` (:mod:`mechfact.memory.train`): full-batch Adam on cross-entropy over all p outputs, many runs
  of one shape trained together as one batched computation, its step fused into one pass over cache-sized
  chunks of rows (:mod:`mechfact.memory.fused`).
* ``separable`` (:mod:`mechfact.memory.separable`): an exact finite-size decision by linear programming.
"""

from __future__ import annotations

import logging

from .fused import CHUNK_BYTES, DP_CHUNK_BYTES
from .fused import _FusedRows  # noqa: F401
from .hebb import check_kappa, hebb, hebb_bytes, rank_of
from .separable import SeparableOutput, separable
from .train import (DIVERGENCE_CHECK_EVERY, LOSSES, MAX_LR, MAX_STEPS, MemoryTrainConfig, TrainOutput, diverged,
                    train, train_bytes)
from .train import _pad  # noqa: F401


logger = logging.getLogger(__name__)

METHODS = ("hebb", "trained", "separable")

__all__ = ["METHODS", "check_kappa", "rank_of", "hebb", "hebb_bytes", "LOSSES", "MAX_LR", "MAX_STEPS",
           "DIVERGENCE_CHECK_EVERY", "diverged", "MemoryTrainConfig", "train_bytes", "TrainOutput", "CHUNK_BYTES",
           "DP_CHUNK_BYTES", "train", "SeparableOutput", "separable"]
