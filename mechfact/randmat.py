"""Closed forms the weight probes compare with: Gaussian extremes and the quarter-circle law of singular values.

A base module (numpy and scipy only), shared by the linear memories (:mod:`mechfact.memory.theory`,
:mod:`mechfact.memory.analysis`) and the model-agnostic probes (:mod:`mechfact.probes.weights`).

* Extreme values: sqrt(2 ln n) and the exact expected maximum of n i.i.d. standard Gaussians at finite n.
* Spectra: the quarter-circle law of singular values (normalised to unit mean square), its truncation to
  the top fraction kappa, and :func:`spectrum_summary` (KS distances to it and between families).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import integrate, optimize, stats


def evt_sqrt(n: int) -> float:
    """Asymptotic maximum of n standard Gaussians: sqrt(2 ln n)."""
    return math.sqrt(2 * math.log(n))


def expected_max_gaussian(n: int) -> float:
    """E[max of n i.i.d. N(0,1)] = int x n phi(x) Phi(x)^(n-1) dx (exact, numerical)."""
    if n < 1:
        raise ValueError(f"n={n}: need n >= 1")
    f = lambda x: x * n * stats.norm.pdf(x) * np.exp((n - 1) * stats.norm.logcdf(x))
    val, _ = integrate.quad(f, -10, 12, limit=200, points=[0.0, math.sqrt(2 * math.log(max(n, 2)))])
    return float(val)


# ---- quarter-circle law (singular values of a square Gaussian matrix) --------------

def quarter_circle_pdf(x: np.ndarray) -> np.ndarray:
    """Density of singular values with E[s^2] = 1: (1/pi) sqrt(4 - x^2) on [0, 2]."""
    x = np.asarray(x, dtype=float)
    return np.where((x >= 0) & (x <= 2), np.sqrt(np.clip(4 - x * x, 0, None)) / math.pi, 0.0)


def quarter_circle_cdf(x: np.ndarray) -> np.ndarray:
    x = np.clip(np.asarray(x, dtype=float), 0, 2)
    return (x * np.sqrt(4 - x * x) / 2 + 2 * np.arcsin(x / 2)) / math.pi


def quarter_circle_quantile_top(kappa: float) -> float:
    """s_kappa with P(s > s_kappa) = kappa under the quarter-circle law."""
    if kappa >= 1:
        return 0.0
    return float(optimize.brentq(lambda s: 1 - quarter_circle_cdf(s) - kappa, 0.0, 2.0))


def truncated_quarter_circle_pdf(x: np.ndarray, kappa: float) -> np.ndarray:
    """Law of the top kappa-fraction of quarter-circle singular values, rescaled to E[s^2]=1."""
    s0 = quarter_circle_quantile_top(kappa)
    scale = math.sqrt(energy_fraction(kappa) / kappa)  # RMS of the kept values before rescaling
    x = np.asarray(x, dtype=float) * scale
    return np.where(x >= s0, quarter_circle_pdf(x) / kappa, 0.0) * scale


def truncated_quarter_circle_cdf(x: np.ndarray, kappa: float) -> np.ndarray:
    s0 = quarter_circle_quantile_top(kappa)
    scale = math.sqrt(energy_fraction(kappa) / kappa)
    x = np.asarray(x, dtype=float) * scale
    return np.clip((quarter_circle_cdf(np.maximum(x, s0)) - quarter_circle_cdf(s0)) / kappa, 0, 1)


def energy_fraction(kappa: float) -> float:
    """Share of E[s^2] carried by the top kappa-fraction: int_{s_kappa}^2 s^2 rho(s) ds."""
    if kappa >= 1:
        return 1.0
    s0 = quarter_circle_quantile_top(kappa)
    val, _ = integrate.quad(lambda s: s * s * quarter_circle_pdf(s), s0, 2.0)
    return float(val)


def normalised_singular_values(W) -> np.ndarray:
    """Singular values of W scaled to unit mean square (so laws compare without scale)."""
    s = np.linalg.svd(np.asarray(W, dtype=np.float64), compute_uv=False)
    return s / math.sqrt(np.mean(s**2))


def _normalised(W: np.ndarray, kappa: float) -> np.ndarray:
    s = normalised_singular_values(W)
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
    cdf = (lambda x: quarter_circle_cdf(x)) if kappa >= 1 else (lambda x: truncated_quarter_circle_cdf(x, kappa))
    ks_theory = {k: float(stats.kstest(v, cdf).statistic) for k, v in sv.items()}
    names = list(sv)
    ks_pairs = {f"{a}|{b}": float(stats.ks_2samp(sv[a], sv[b]).statistic) for i, a in enumerate(names) for b in names[i + 1:]}
    return {"singular_values": {k: v.tolist() for k, v in sv.items()}, "ks_to_theory": ks_theory, "ks_pairs": ks_pairs}
