"""Linear-memory experiments on the W found at one load: score distributions and singular-value spectra.

``run_scores`` compares the Hebbian and the trained W of one instance (the mechanism: how the target's score
stands out of its competitors'); ``run_spectrum`` pools the singular values of trained, Hebbian and initial W
over a few instances. Each writes a standard run directory (see :mod:`mechfact.memory.experiments`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..config import DictConfig, check_choice, check_type
from ..runs import RunDir
from . import analysis, solvers
from .problems import PROBLEMS, MemoryProblem, load, p_for_alpha
from .solvers import MemoryTrainConfig, hebb_bytes
from .solving import (SolverConfig, _check_d, _check_kappa, _check_memory, _check_positive, _check_seeds, _precheck,
                      _solver_bytes)


# ---- score distributions (mechanism) ------------------------------------------------------

@dataclass
class ScoresConfig(DictConfig):
    d: int = 64  # dimension
    alpha: float = 0.5  # load at which Hebb and trained W are compared (same instance)
    problem: str = "original"
    kappa: float = 1.0
    train: MemoryTrainConfig = field(default_factory=MemoryTrainConfig)

    def __post_init__(self) -> None:
        _check_d(self.d)
        check_choice("problem", self.problem, PROBLEMS)
        _check_kappa("kappa", self.kappa)
        _check_positive("alpha", self.alpha)
        check_type("train", self.train, MemoryTrainConfig)

    def check_cost(self) -> None:
        p = p_for_alpha(self.alpha, self.d)
        s = SolverConfig(problem=self.problem, kappa=self.kappa, train=self.train)
        _check_memory([(max(_solver_bytes(s, self.d, p, 1), hebb_bytes(self.d, p, self.kappa)),
                        f"--d {self.d} --alpha {self.alpha:g}", self.d, p, 1)], s)


def run_scores(cfg: ScoresConfig, out: str | Path, *, device: torch.device, seed: int = 0) -> dict:
    from . import plots

    _precheck(cfg, seed)  # before the run directory: a refused run writes nothing
    run = RunDir(out, cfg, kind="memory.scores", seed=seed, device=str(device))
    p = p_for_alpha(cfg.alpha, cfg.d)
    pr = MemoryProblem(cfg.problem, cfg.d, p, seed)
    Ws = {"hebb": solvers.hebb(pr, cfg.kappa), "trained": solvers.train([pr], cfg.kappa, cfg.train, device=device).W[0]}
    summary, per_input = {}, {}
    for name, W in Ws.items():
        summary[name], arr = analysis.score_summary(pr, W)
        per_input[name] = {k: np.round(v, 6).tolist() for k, v in arr.items() if k in ("z_target", "z_max")}
    result = {"d": cfg.d, "p": p, "alpha": load(p, cfg.d), "problem": cfg.problem, "kappa": cfg.kappa,
              "summary": summary, "per_input": per_input}
    return run.finish(result, plots.plot_scores, "fig_scores.png")


# ---- singular-value spectra -----------------------------------------------------------------

@dataclass
class SpectrumConfig(DictConfig):
    d: int = 64
    alpha: float = 0.8  # load of the instances (the optimum is studied near capacity)
    kappa: float = 1.0
    seeds: int = 3  # singular values are pooled over this many instances
    train: MemoryTrainConfig = field(default_factory=lambda: MemoryTrainConfig(early_stop=False, steps=3000))

    def __post_init__(self) -> None:
        _check_d(self.d)
        _check_positive("alpha", self.alpha)
        _check_kappa("kappa", self.kappa)
        _check_seeds(self.seeds)
        check_type("train", self.train, MemoryTrainConfig)

    def check_cost(self) -> None:
        """Both problems are trained (one after the other): the decoupled one, with its dense competitors, dominates."""
        p = p_for_alpha(self.alpha, self.d)
        s = SolverConfig(problem="decoupled", kappa=self.kappa, train=self.train)
        need = max(_solver_bytes(s, self.d, p, self.seeds),
                   _solver_bytes(SolverConfig(kappa=self.kappa, train=self.train), self.d, p, self.seeds))
        need += 8.0 * 4 * self.seeds * self.d * self.d  # the W kept per family (float32 and numpy copies)
        _check_memory([(need, f"--d {self.d} --alpha {self.alpha:g} --seeds {self.seeds}", self.d, p, self.seeds)], s)


def run_spectrum(cfg: SpectrumConfig, out: str | Path, *, device: torch.device, seed: int = 0) -> dict:
    from . import plots

    _precheck(cfg, seed)  # before the run directory: a refused run writes nothing
    run = RunDir(out, cfg, kind="memory.spectrum", seed=seed, device=str(device))
    p = p_for_alpha(cfg.alpha, cfg.d)
    ops = [MemoryProblem("original", cfg.d, p, seed + k) for k in range(cfg.seeds)]
    dps = [MemoryProblem("decoupled", cfg.d, p, seed + k) for k in range(cfg.seeds)]
    t_op = solvers.train(ops, cfg.kappa, cfg.train, device=device)
    t_dp = solvers.train(dps, cfg.kappa, cfg.train, device=device)
    hebbs = [solvers.hebb(op, cfg.kappa) for op in ops]
    Ws = {"trained_original": [w.numpy() for w in t_op.W], "trained_decoupled": [w.numpy() for w in t_dp.W],
          "hebb": [w.numpy() for w in hebbs], "init": [w.numpy() for w in t_op.W_init]}
    spec = analysis.spectrum_summary(Ws, cfg.kappa)
    result = {"d": cfg.d, "p": p, "alpha": load(p, cfg.d), "kappa": cfg.kappa, "seeds": cfg.seeds,
              "accuracy": {"trained_original": float(np.mean(t_op.accuracy)),
                           "trained_decoupled": float(np.mean(t_dp.accuracy)),
                           "hebb": float(np.mean([analysis.accuracy(op, w) for op, w in zip(ops, hebbs)]))},
              "ks_op_vs_dp": spec["ks_pairs"]["trained_original|trained_decoupled"],
              "ks_to_theory": spec["ks_to_theory"], "ks_pairs": spec["ks_pairs"],
              "singular_values": {k: np.round(v, 6).tolist() for k, v in spec["singular_values"].items()}}
    return run.finish(result, plots.plot_spectrum, "fig_spectrum.png")
