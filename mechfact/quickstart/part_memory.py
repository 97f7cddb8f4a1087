"""Part 1 (paper A): the linear associative memory's capacity, score distributions and spectra."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..executor import LocalExecutor
from ..memory import experiments as ex
from ..memory.solvers import MemoryTrainConfig
from . import claims, layout
from .layout import Part
from .sizes import Sizes, sizes_for

logger = logging.getLogger(__name__)


def memory_part(out: Path, *, device: torch.device, seed: int = 0, fast: bool = False,
                sizes: Sizes | None = None) -> Part:
    sz = sizes or sizes_for(fast)
    train = MemoryTrainConfig(steps=sz.memory_steps, patience=sz.memory_patience)
    executor = LocalExecutor(progress=True, desc="quickstart")
    part = Part()

    logger.info("linear-memory capacity: Hebb vs trained")
    caps = {}
    for method in ("hebb", "trained"):
        cfg = ex.CapacityConfig(d=list(sz.memory_d), seeds=sz.memory_seeds,
                                solver=ex.SolverConfig(method=method, train=train),
                                rel_tol=0.03, alpha_lo=0.02 if method == "hebb" else 0.3)
        caps[method] = ex.run_capacity(cfg, out / f"memory_capacity_{method}", device=device, seed=seed,
                                       executor=executor)
    sec = layout.memory_capacity_section(out, caps)
    part.sections.append(sec)
    part.claims += [claims.claim_capacity(caps["trained"]["summary"], caps["trained"]["extrapolation"], sec.anchor),
                    claims.claim_hebb(caps["hebb"]["summary"], caps["hebb"]["extrapolation"],
                                      caps["trained"]["summary"], sec.anchor)]

    logger.info("linear-memory score distributions")
    sc = ex.run_scores(ex.ScoresConfig(d=sz.scores_d, alpha=0.5, train=train), out / "memory_scores",
                       device=device, seed=seed)
    sec = layout.memory_scores_section(out, sc)
    part.sections.append(sec)
    part.claims.append(claims.claim_scores(sc["summary"], sc["p"], sc["d"], sec.anchor))

    logger.info("linear-memory singular-value spectra")
    sp = ex.run_spectrum(ex.SpectrumConfig(d=sz.spectrum_d, alpha=0.7, seeds=sz.spectrum_seeds,
                                           train=MemoryTrainConfig(early_stop=False, steps=sz.spectrum_steps)),
                         out / "memory_spectrum", device=device, seed=seed)
    sec = layout.memory_spectrum_section(out, sp)
    part.sections.append(sec)
    part.claims += [claims.claim_op_dp(sp, sec.anchor), claims.claim_spectrum(sp, sec.anchor),
                    claims.claim_rank_not_run()]
    return part
