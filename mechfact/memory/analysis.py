"""Mechanism analyses of a memory W: score distributions and singular-value spectra."""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import stats

from . import theory
from .problems import MemoryProblem, Scores, accuracy, scores

__all__ = ["accuracy", "scores", "score_summary", "spectrum_summary"]


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


def _normalised(W: np.ndarray, kappa: float) -> np.ndarray:
    s = theory.normalised_singular_values(W)
    if kappa < 1:  # keep the m = kappa d nonzero values, renormalised
        m = max(1, int(round(kappa * s.size)))
        s = np.sort(s)[::-1][:m]
        s = s / math.sqrt(np.mean(s**2))
    return s


def spectrum_summary(Ws: dict[str, list[np.ndarray]], kappa: float = 1.0) -> dict:
    """Normalised singular values per named family of W (pooled over its matrices), KS distance
    to the (truncated) quarter circle, and pairwise two-sample KS between families."""
    sv = {}
    for k, mats in Ws.items():
        mats = mats if isinstance(mats, (list, tuple)) else [mats]
        sv[k] = np.sort(np.concatenate([_normalised(np.asarray(W), kappa) for W in mats]))
    cdf = (lambda x: theory.quarter_circle_cdf(x)) if kappa >= 1 else (lambda x: theory.truncated_quarter_circle_cdf(x, kappa))
    ks_theory = {k: float(stats.kstest(v, cdf).statistic) for k, v in sv.items()}
    names = list(sv)
    ks_pairs = {f"{a}|{b}": float(stats.ks_2samp(sv[a], sv[b]).statistic) for i, a in enumerate(names) for b in names[i + 1:]}
    return {"singular_values": {k: v.tolist() for k, v in sv.items()}, "ks_to_theory": ks_theory, "ks_pairs": ks_pairs}
