"""Statistics every probe reports with: intervals, bootstrap, permutation tests.

The rule: a reported number carries its ``n`` and an interval. A row of a
result holds ``<name>`` (the value), ``<name>_ci`` (``[low, high]``, 95% by
default) and ``<name>_n`` (the units the interval is over: facts, subjects,
trials, relations); :func:`fields` writes the three keys from an
:class:`Estimate`, :func:`check_reported` checks a row follows the rule.

* :func:`wilson` -- the Wilson score interval of an accuracy ``k / n``
  (correct near 0 and 1, where the normal interval is not).
* :func:`bootstrap` -- the percentile bootstrap of a statistic over units
  (facts, subjects, trials, seeds), optionally resampling clusters (all rows of
  one subject together); :func:`stratified_bootstrap` -- units resampled within
  each stratum (the seeds of each setting), with its count of distinct resamples.
* :func:`permutation_pvalue` -- ``(1 + #{null >= observed}) / (1 + n_null)``,
  the p-value of an observed statistic against draws from its null (never 0).
* :func:`spearman` -- rank correlation with its permutation p-value and a
  bootstrap interval over the paired items; :func:`partial_spearman` -- the same
  with a third variable partialled out.
* :func:`paired_difference` -- the mean paired difference with its interval,
  sign-flip p-value and verdict; :func:`holm` -- Holm's adjustment of a family of
  p-values (report every test of the family, adjusted).

Everything takes a ``seed``; the same inputs and seed give the same interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

CONFIDENCE = 0.95
N_BOOT = 2000


@dataclass(frozen=True)
class Estimate:
    """A value with its interval and the number of units it rests on."""

    value: float | None
    low: float | None
    high: float | None
    n: int
    method: str  # "wilson", "bootstrap", "exact", "none" (n too small for an interval)

    def to_dict(self) -> dict:
        return {"value": self.value, "ci": [self.low, self.high], "n": self.n, "ci_method": self.method}

    def __format__(self, spec: str) -> str:
        if self.value is None:
            return "n/a"
        spec = spec or ".2f"
        if self.low is None:
            return f"{self.value:{spec}} (n {self.n})"
        return f"{self.value:{spec}} [{self.low:{spec}}, {self.high:{spec}}] (n {self.n})"


def _z(confidence: float) -> float:
    from scipy.stats import norm

    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence}: must be between 0 and 1 (exclusive)")
    return float(norm.ppf(0.5 + confidence / 2))


def wilson(k: int, n: int, confidence: float = CONFIDENCE) -> Estimate:
    """Accuracy ``k / n`` with the Wilson score interval. ``n = 0`` gives no value."""
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"wilson: need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return Estimate(None, None, None, 0, "none")
    z = _z(confidence)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), n, "wilson")


def accuracy(correct: Sequence[bool] | np.ndarray, confidence: float = CONFIDENCE) -> Estimate:
    """:func:`wilson` of a vector of right/wrong outcomes."""
    c = np.asarray(correct, dtype=bool).ravel()
    return wilson(int(c.sum()), int(c.size), confidence)


def percentile_interval(boots: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The central ``confidence`` percentile interval of the finite bootstrap replicates ``boots`` (a replicate
    with no value, e.g. a constant resample's correlation, is NaN and left out)."""
    boots = np.asarray(boots, dtype=float)
    boots = boots[np.isfinite(boots)]
    a = (1 - confidence) / 2
    lo, hi = np.quantile(boots, [a, 1 - a])
    return float(lo), float(hi)


def bootstrap(values: Sequence[float] | np.ndarray, statistic: Callable[[np.ndarray], float] | None = None, *,
              clusters: Sequence | None = None, n_boot: int = N_BOOT, seed: int = 0,
              confidence: float = CONFIDENCE) -> Estimate:
    """The statistic (default: the mean) of ``values`` with a percentile bootstrap interval.

    ``values``: one entry per unit (or rows of a 2-d array, e.g. paired observations). ``clusters``: a label per
    row; whole clusters are resampled (rows of one subject, one seed, one trial stay together) and ``n`` counts
    clusters. Fewer than 2 units: the value with no interval.
    """
    x = np.asarray(values, dtype=float)
    stat = statistic or (lambda v: float(np.mean(v)))
    if x.shape[0] == 0:
        return Estimate(None, None, None, 0, "none")
    value = float(stat(x))
    if clusters is None:
        groups = [np.array([i]) for i in range(x.shape[0])]
    else:
        if len(clusters) != x.shape[0]:
            raise ValueError(f"bootstrap: {len(clusters)} cluster labels for {x.shape[0]} values")
        labels = {}
        for i, c in enumerate(clusters):
            labels.setdefault(c, []).append(i)
        groups = [np.array(v) for v in labels.values()]
    m = len(groups)
    if m < 2:
        return Estimate(value, None, None, m, "none")
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, m, size=(n_boot, m))
    if clusters is None and statistic is None and x.ndim == 1:  # the common case, vectorised
        boots = x[draws].mean(1)
    else:
        boots = np.array([stat(x[np.concatenate([groups[g] for g in d])]) for d in draws])
    lo, hi = percentile_interval(boots, confidence)
    return Estimate(value, lo, hi, m, "bootstrap")


MIN_DISTINCT = 100  # a stratified bootstrap with fewer distinct resamples gives no interval


def stratified_bootstrap(values: Sequence[float] | np.ndarray, statistic: Callable[[np.ndarray], float], *,
                         strata: Sequence, n_boot: int = N_BOOT, seed: int = 0, confidence: float = CONFIDENCE,
                         min_distinct: int = MIN_DISTINCT) -> tuple[Estimate, int]:
    """The statistic of ``values`` with a percentile bootstrap that resamples the units of each stratum
    independently, with replacement, as many as the stratum holds (e.g. the seeds of each setting: every setting
    keeps its size, none is dropped), and the number of distinct resamples that scheme has: the product over
    strata of C(2k - 1, k) (multisets of k of k units). Fewer than ``min_distinct``: no interval (so few resamples
    make a percentile interval a handful of points). ``n`` counts the units."""
    x = np.asarray(values, dtype=float)
    labels: dict = {}
    for i, s in enumerate(strata):
        labels.setdefault(s, []).append(i)
    if len(strata) != x.shape[0]:
        raise ValueError(f"stratified_bootstrap: {len(strata)} stratum labels for {x.shape[0]} values")
    groups = [np.array(v) for v in labels.values()]
    distinct = 1
    for g in groups:
        distinct *= math.comb(2 * len(g) - 1, len(g))
    value = float(statistic(x))
    if distinct < min_distinct:
        return Estimate(value, None, None, int(x.shape[0]), "none"), distinct
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        idx = np.concatenate([g[rng.integers(0, len(g), len(g))] for g in groups])
        boots.append(statistic(x[idx]))
    lo, hi = percentile_interval(boots, confidence)
    return Estimate(value, lo, hi, int(x.shape[0]), "bootstrap"), distinct


TRIAL_RESAMPLING = ("subjects", "trials+subjects")


def _trial_boots(h: np.ndarray, c: np.ndarray, n_boot: int, seed: int, resample: str):
    """``h`` (K, T, S) hits and ``c`` (T, S) counts, subjects without outcomes already dropped: the mean over
    trials of each trial's accuracy (K,) and its bootstrap draws (K, n_boot), or None below 2 subjects.
    ``resample``: "subjects" (one multinomial draw of subject weights, every trial kept) or "trials+subjects"
    (trials drawn with replacement too: a trial's split, prompt and operator are one unit, so the interval
    holds the operator-to-operator variance as well as the subject-to-subject one)."""
    S, T = int(c.shape[1]), int(c.shape[0])

    def means(w: np.ndarray, v: np.ndarray) -> np.ndarray:  # subject (B, S), trial (B, T) weights -> (K, B)
        num = np.einsum("kts,bs->kbt", h, w)
        den = np.einsum("ts,bs->bt", c, w)
        ok = (den > 0) & (v > 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.where(ok[None], num / np.where(den > 0, den, 1), 0.0)
            wt = np.where(ok, v, 0.0)
            return np.where(wt.sum(-1) > 0, (r * wt[None]).sum(-1) / np.where(wt.sum(-1) > 0, wt.sum(-1), 1),
                            np.nan)

    value = means(np.ones((1, S)), np.ones((1, T)))[:, 0]
    if S < 2:
        return value, None
    rng = np.random.default_rng(seed)
    w = rng.multinomial(S, np.full(S, 1 / S), size=n_boot).astype(float)
    v = (rng.multinomial(T, np.full(T, 1 / T), size=n_boot).astype(float) if resample == "trials+subjects"
         else np.ones((n_boot, T)))
    return value, means(w, v)


def _trial_arrays(hits, counts, name: str, resample: str):
    if resample not in TRIAL_RESAMPLING:
        raise ValueError(f"{name}: resample {resample!r}; allowed: {', '.join(TRIAL_RESAMPLING)}")
    h = np.asarray(hits, dtype=float)
    c = np.asarray(counts, dtype=float)
    if h.shape[-2:] != c.shape:
        raise ValueError(f"{name}: hits {h.shape} do not end in the counts' shape {c.shape}")
    lead = h.shape[:-2]
    h = h.reshape(-1, *c.shape)
    c = c[c.sum(1) > 0]  # a trial with no outcome is left out (and never drawn)
    h = h[:, np.asarray(counts, dtype=float).sum(1) > 0]
    seen = c.sum(0) > 0
    return h[..., seen], c[:, seen], lead


def trial_mean(hits: np.ndarray, counts: np.ndarray, *, n_boot: int = N_BOOT, seed: int = 0,
               confidence: float = CONFIDENCE, resample: str = "subjects"
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Mean over trials of each trial's accuracy, with a bootstrap interval that resamples subjects (and, with
    ``resample="trials+subjects"``, trials first: the hierarchical interval of an estimate whose trials each
    fit their own operator).

    ``counts`` (T, S): outcomes of subject s in trial t (0 where s was not tested); ``hits`` (..., T, S): how many
    were right, for each of the leading settings (betas, ranks) at once. A trial with no outcome is left out of
    the mean. Returns ``(value, low, high, n_subjects)``, arrays of the leading shape (NaN where nothing was
    tested); all settings share the same resamples, so their intervals are comparable.
    """
    h, c, lead = _trial_arrays(hits, counts, "trial_mean", resample)
    S = int(c.shape[1])
    if S == 0:
        nan = np.full(lead, np.nan)
        return nan, nan.copy(), nan.copy(), 0
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a resample may leave a trial empty: it is left out
        value, boots = _trial_boots(h, c, n_boot, seed, resample)
        if boots is None:
            nan = np.full(value.shape, np.nan)
            return value.reshape(lead), nan.reshape(lead), nan.copy().reshape(lead), S
    a = (1 - confidence) / 2
    lo, hi = np.nanquantile(boots, a, axis=1), np.nanquantile(boots, 1 - a, axis=1)
    return value.reshape(lead), lo.reshape(lead), hi.reshape(lead), S


def trial_difference(hits_a: np.ndarray, hits_b: np.ndarray, counts: np.ndarray, *, n_boot: int = N_BOOT,
                     seed: int = 0, confidence: float = CONFIDENCE, resample: str = "trials+subjects") -> dict:
    """A paired test of two scorings of the SAME outcomes (e.g. an LRE's hits and a constant answer's hits on
    the same test facts of the same trials): the difference of their trial means, with an interval and a
    two-sided p-value from one bootstrap that draws trials, then subjects (``resample``), each draw shared by
    both scorings. ``hits_a`` (..., T, S) against ``hits_b`` (T, S) or the same shape. Returns arrays of the
    leading shape: ``diff``, ``low``, ``high``, ``p_value`` (twice the share of draws on the far side of zero,
    with the draw at zero counted on both sides; 1 when the two never differ), ``verdict`` ("above" / "below"
    when p < 1 - confidence and the difference is positive / negative, else "undecided"), and the counts
    ``n_subjects``, ``n_trials``."""
    a = np.asarray(hits_a, dtype=float)
    b = np.broadcast_to(np.asarray(hits_b, dtype=float), a.shape)
    ha, c, lead = _trial_arrays(a, counts, "trial_difference", resample)
    hb, _, _ = _trial_arrays(b, counts, "trial_difference", resample)
    K, S, T = ha.shape[0], int(c.shape[1]), int(c.shape[0])
    out = {"n_subjects": S, "n_trials": T, "resample": resample}
    nan = np.full(lead, np.nan)
    if S == 0:
        return {**out, "diff": nan, "low": nan.copy(), "high": nan.copy(), "p_value": nan.copy(),
                "verdict": np.full(lead, "undecided", dtype=object)}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        value, boots = _trial_boots(np.concatenate([ha, hb]), c, n_boot, seed, resample)
    diff = value[:K] - value[K:]
    if boots is None:
        return {**out, "diff": diff.reshape(lead), "low": nan.copy(), "high": nan.copy(), "p_value": nan.copy(),
                "verdict": np.full(lead, "undecided", dtype=object)}
    d = boots[:K] - boots[K:]
    q = (1 - confidence) / 2
    lo, hi = np.nanquantile(d, q, axis=1), np.nanquantile(d, 1 - q, axis=1)
    fin = np.isfinite(d)
    n = np.maximum(fin.sum(1), 1)
    p = np.minimum(1.0, 2 * np.minimum(((d <= 0) & fin).sum(1), ((d >= 0) & fin).sum(1)) / n)
    verdict = np.where(p < 1 - confidence, np.where(diff > 0, "above", "below"), "undecided").astype(object)
    return {**out, "diff": diff.reshape(lead), "low": lo.reshape(lead), "high": hi.reshape(lead),
            "p_value": p.reshape(lead), "verdict": verdict.reshape(lead)}


def format_p(p: float | None) -> str:
    """A p-value for a page: three decimals, ``< 0.001`` below that (never a printed 0.000), a dash for None."""
    return "—" if p is None else f"{p:.3f}" if p >= 0.001 else "< 0.001"


def permutation_pvalue(observed: float, null: Sequence[float] | np.ndarray, alternative: str = "greater") -> float:
    """p-value of ``observed`` against null draws: ``(1 + #{null at least as extreme}) / (1 + n_null)``.

    ``alternative``: "greater" (large is extreme), "less", or "two-sided" (``|null - median| >=
    |observed - median|``).
    """
    z = np.asarray(null, dtype=float)
    z = z[np.isfinite(z)]
    if z.size == 0:
        raise ValueError("permutation_pvalue: no finite null draws")
    if alternative == "greater":
        k = int((z >= observed).sum())
    elif alternative == "less":
        k = int((z <= observed).sum())
    elif alternative == "two-sided":
        c = float(np.median(z))
        k = int((np.abs(z - c) >= abs(observed - c)).sum())
    else:
        raise ValueError(f"alternative {alternative!r}: allowed values are greater, less, two-sided")
    return (1 + k) / (1 + z.size)


def null_summary(observed: float, null: Sequence[float] | np.ndarray, alternative: str = "greater") -> dict:
    """``p_value``, ``n_null`` and the null's 50 / 95 / 99% quantiles, for a result row."""
    z = np.asarray(null, dtype=float)
    q = np.quantile(z, [0.5, 0.95, 0.99])
    return {"p_value": permutation_pvalue(observed, z, alternative), "n_null": int(z.size),
            "null_median": float(q[0]), "null_q95": float(q[1]), "null_q99": float(q[2])}


def spearman(x: Sequence[float], y: Sequence[float], *, n_boot: int = N_BOOT, n_perm: int = 10000, seed: int = 0,
             confidence: float = CONFIDENCE) -> dict:
    """Spearman's rho of paired items with a bootstrap interval (over items) and a permutation p-value (two-sided).

    Returns ``{"rho", "rho_ci", "rho_n", "p_value"}``; fewer than 3 pairs, or a constant side, give ``rho`` None.
    """
    from scipy.stats import rankdata

    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"spearman: {a.size} values against {b.size}")
    n = a.size
    if n < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:  # a constant side has no ranks to correlate
        return {"rho": None, "rho_ci": [None, None], "rho_n": int(n), "p_value": None}

    # the bootstrap of :func:`bootstrap` (the same draws of items), every resample ranked at once
    draws = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    ra_b, rb_b = rankdata(a[draws], axis=1), rankdata(b[draws], axis=1)
    ra_b, rb_b = ra_b - ra_b.mean(1, keepdims=True), rb_b - rb_b.mean(1, keepdims=True)
    den = np.sqrt((ra_b ** 2).sum(1) * (rb_b ** 2).sum(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        boots = np.where(den > 0, (ra_b * rb_b).sum(1) / den, np.nan)  # a constant resample has no rho
    lo, hi = percentile_interval(boots, confidence)
    rng = np.random.default_rng(seed + 1)
    ra, rb = rankdata(a), rankdata(b)
    rb_c = (rb - rb.mean()) / (rb.std() or 1.0)
    ra_c = (ra - ra.mean()) / (ra.std() or 1.0)
    perms = np.argsort(rng.random((n_perm, n)), axis=1)
    null = (ra_c[perms] * rb_c).mean(1)
    obs = float((ra_c * rb_c).mean())
    p = permutation_pvalue(abs(obs), np.abs(null), "greater")
    return {"rho": obs, "rho_ci": [lo, hi], "rho_n": int(n), "p_value": p}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (same order as given): the family-wise error rate is
    controlled at level alpha when each adjusted p is compared with alpha."""
    p = np.asarray(pvalues, dtype=float)
    m = p.size
    order = np.argsort(p, kind="stable")
    adj = np.empty(m)
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * p[i]))
        adj[i] = running
    return adj.tolist()


def paired_difference(a: Sequence[float], b: Sequence[float], *, n_boot: int = N_BOOT, seed: int = 0,
                      confidence: float = CONFIDENCE) -> dict:
    """The mean of ``a - b`` over paired units with a bootstrap interval (units resampled with their pair) and a
    sign-flip permutation p-value (two-sided); ``verdict`` from the sign-flip test (exact in its null at any n,
    where a percentile bootstrap of few units is too narrow): ``above`` / ``below`` when p < ``1 - confidence``
    and the mean difference is positive / negative, else ``undecided``."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired_difference: {x.size} values against {y.size}")
    d = x - y
    est = bootstrap(d, n_boot=n_boot, seed=seed, confidence=confidence)
    if d.size < 2:
        return {"diff": est.value, "diff_ci": [None, None], "diff_n": int(d.size), "p_value": None,
                "verdict": "undecided"}
    rng = np.random.default_rng(seed + 1)
    signs = rng.choice([-1.0, 1.0], size=(10000, d.size))
    p = permutation_pvalue(abs(float(d.mean())), np.abs((signs * d).mean(1)), "greater")
    verdict = "undecided" if p >= 1 - confidence else "above" if d.mean() > 0 else "below"
    return {"diff": est.value, "diff_ci": [est.low, est.high], "diff_n": int(d.size), "p_value": p,
            "verdict": verdict}


def partial_spearman(x: Sequence[float], y: Sequence[float], z: Sequence[float], *, n_perm: int = 10000,
                     seed: int = 0) -> dict:
    """Spearman's rho of ``x`` and ``y`` with ``z`` partialled out (the ranks of x and y each residualised on the
    ranks of z by least squares; the correlation of the residuals), with a permutation p-value (two-sided, the
    residuals of y permuted). Fewer than 4 items: ``rho`` None."""
    from scipy.stats import rankdata

    a, b, c = (np.asarray(v, dtype=float) for v in (x, y, z))
    if not a.shape == b.shape == c.shape:
        raise ValueError(f"partial_spearman: {a.size}, {b.size} and {c.size} values")
    if a.size < 4:
        return {"rho": None, "rho_n": int(a.size), "p_value": None}
    Z = np.stack([np.ones(a.size), rankdata(c)], 1)

    def resid(v):
        r = rankdata(v)
        return r - Z @ np.linalg.lstsq(Z, r, rcond=None)[0]
    ra, rb = resid(a), resid(b)
    if ra.std() == 0 or rb.std() == 0:
        return {"rho": None, "rho_n": int(a.size), "p_value": None}
    rho = float(np.corrcoef(ra, rb)[0, 1])
    rng = np.random.default_rng(seed)
    perms = np.argsort(rng.random((n_perm, a.size)), axis=1)
    za, zb = (ra - ra.mean()) / ra.std(), (rb - rb.mean()) / rb.std()
    null = (za[None] * zb[perms]).mean(1)
    return {"rho": rho, "rho_n": int(a.size), "p_value": permutation_pvalue(abs(rho), np.abs(null), "greater")}


def fields(name: str, est: Estimate) -> dict:
    """``{name: value, name_ci: [low, high], name_n: n}``: one reported number in a result row."""
    return {name: est.value, f"{name}_ci": [est.low, est.high], f"{name}_n": est.n}


def check_reported(row: dict, names: Sequence[str]) -> None:
    """Raise ``ValueError`` unless each of ``names`` in ``row`` carries ``<name>_ci`` and ``<name>_n``."""
    missing = [f"{k}{s}" for k in names for s in ("_ci", "_n") if row.get(k) is not None and f"{k}{s}" not in row]
    if missing:
        raise ValueError(f"reported numbers without n or interval: {', '.join(missing)}")
