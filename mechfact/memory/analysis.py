"""Mechanism analyses of a memory W: score distributions and singular-value spectra."""

from __future__ import annotations

import torch

from ..randmat import spectrum_summary
from . import theory
from .problems import MemoryProblem, Scores, accuracy, scores

__all__ = ["accuracy", "scores", "score_summary", "spectrum_summary"]  # spectrum_summary: mechfact.randmat


def score_summary(problem: MemoryProblem, W: torch.Tensor) -> tuple[dict, dict]:
    """Per-input scores in units of that input's competitor std.

    Returns (summary numbers, per-input arrays). z_target = (target - comp_mean) / comp_std,
    z_max = (comp_max - comp_mean) / comp_std; margin = z_target - z_max (> 0 iff recalled).
    """
    sc: Scores = scores(problem, W)
    mean, std = sc.comp_mean, sc.comp_std
    z_t = ((sc.target - mean) / std).numpy()
    z_m = ((sc.comp_max - mean) / std).numpy()
    n = problem.p - 1
    summary = {
        "accuracy": sc.accuracy,
        "target_mean": float(sc.target.mean()),
        "target_std": float(sc.target.std()),
        "competitor_std": float(std.mean()),
        "max_competitor_mean": float(sc.comp_max.mean()),
        "z_target_mean": float(z_t.mean()),
        "z_target_std": float(z_t.std(ddof=1)),
        "z_max_competitor_mean": float(z_m.mean()),
        "z_max_competitor_std": float(z_m.std(ddof=1)),
        "z_margin_mean": float((z_t - z_m).mean()),
        "z_margin_min": float((z_t - z_m).min()),
        "frac_target_above_evt_sqrt": float((z_t > theory.evt_sqrt(n)).mean()),
        "evt_sqrt_2lnp": theory.evt_sqrt(n),
        "expected_max_gaussian": theory.expected_max_gaussian(n),
        # scale-free spread: std of target scores relative to the competitor std
        "target_std_over_comp_std": float(sc.target.std() / std.mean()),
    }
    arrays = {"z_target": z_t, "z_max": z_m, "target": sc.target.numpy(), "comp_std": std.numpy()}
    return summary, arrays
