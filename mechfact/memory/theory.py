"""Closed-form pieces of the linear-memory theory (see docs/linear_memory_theory.md).

* Loads: alpha = p ln p / d^2; optimum alpha_c = 1/2, Hebb 1/8.
* Extreme values: sqrt(2 ln n) and the exact expected maximum of n i.i.d.
  standard Gaussians at finite n (numerical integral).
* Spectra: the quarter-circle law of singular values (normalised to unit mean
  square) and its truncation to the top fraction kappa.
* Rank constraint: two candidate formulas for alpha_c(kappa), both derived in
  the docs from the large-margin Gardner argument; the measured curve decides.
"""

from __future__ import annotations

from ..randmat import (energy_fraction, evt_sqrt, expected_max_gaussian, normalised_singular_values,  # noqa: F401
                       quarter_circle_cdf, quarter_circle_pdf, quarter_circle_quantile_top,
                       truncated_quarter_circle_cdf, truncated_quarter_circle_pdf)

ALPHA_OPTIMAL = 0.5
ALPHA_HEBB = 0.125


def alpha_c_rank_dof(kappa: float) -> float:
    """Candidate 1: alpha_c(kappa) = (1/2) kappa (2 - kappa) (dimension of rank-m matrices / d^2)."""
    return ALPHA_OPTIMAL * kappa * (2 - kappa)


def alpha_c_rank_energy(kappa: float) -> float:
    """Candidate 2: alpha_c(kappa) = (1/2) * int_{s_kappa}^2 s^2 rho_qc(s) ds (quarter-circle integral)."""
    return ALPHA_OPTIMAL * energy_fraction(kappa)
