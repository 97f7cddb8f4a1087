"""The statistics module: intervals cover at their nominal rate, permutation tests reject planted effects only."""

import math

import numpy as np
import pytest

from mechfact import stats


def test_wilson_matches_a_hand_computed_interval_and_stays_in_0_1():
    e = stats.wilson(8, 10)  # textbook: 0.8, Wilson 95% [0.490, 0.943]
    assert e.value == 0.8 and e.n == 10
    assert e.low == pytest.approx(0.4902, abs=1e-3) and e.high == pytest.approx(0.9433, abs=1e-3)
    z = stats.wilson(0, 4)
    assert z.low == 0.0 and 0.4 < z.high < 0.6  # 0 of 4 is no proof of 0
    assert stats.wilson(0, 0).value is None
    with pytest.raises(ValueError, match="k=5, n=4"):
        stats.wilson(5, 4)


def test_wilson_covers_the_true_rate_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    p, n = 0.3, 20
    hits = 0
    for _ in range(2000):
        e = stats.wilson(int(rng.binomial(n, p)), n)
        hits += e.low <= p <= e.high
    assert 0.92 <= hits / 2000 <= 0.98


def test_bootstrap_interval_covers_the_mean_and_clusters_widen_it():
    rng = np.random.default_rng(1)
    covered = 0
    for i in range(300):
        x = rng.normal(1.0, 1.0, 30)
        e = stats.bootstrap(x, seed=i, n_boot=500)
        covered += e.low <= 1.0 <= e.high
    assert 0.88 <= covered / 300 <= 0.99
    # ten subjects, each seen 5 times with a shared offset: resampling subjects gives a wider interval than rows
    offsets = rng.normal(0, 1, 10)
    x = np.repeat(offsets, 5) + rng.normal(0, 0.1, 50)
    by_row = stats.bootstrap(x, seed=0)
    by_subject = stats.bootstrap(x, clusters=np.repeat(np.arange(10), 5), seed=0)
    assert by_subject.n == 10 and by_row.n == 50
    assert (by_subject.high - by_subject.low) > 1.8 * (by_row.high - by_row.low)
    assert stats.bootstrap([0.5]).low is None  # one unit: no interval


def test_bootstrap_is_reproducible_by_seed():
    x = np.arange(20.0)
    assert stats.bootstrap(x, seed=3).to_dict() == stats.bootstrap(x, seed=3).to_dict()


def test_permutation_pvalue_is_never_zero_and_ranks_the_observation():
    null = np.arange(99.0)
    assert stats.permutation_pvalue(1000.0, null) == pytest.approx(1 / 100)
    assert stats.permutation_pvalue(-1.0, null) == 1.0
    assert stats.permutation_pvalue(49.0, null) == pytest.approx(51 / 100)
    with pytest.raises(ValueError, match="alternative"):
        stats.permutation_pvalue(0.0, null, "bigger")


def test_spearman_detects_a_monotone_relation_and_not_noise():
    rng = np.random.default_rng(2)
    x = rng.normal(size=25)
    s = stats.spearman(x, np.exp(x) + rng.normal(0, 0.1, 25), seed=0)
    assert s["rho"] > 0.9 and s["p_value"] < 0.01 and s["rho_ci"][0] > 0.7 and s["rho_n"] == 25
    n = stats.spearman(x, rng.normal(size=25), seed=0)
    assert n["p_value"] > 0.05 and n["rho_ci"][0] < 0 < n["rho_ci"][1]


def test_spearmans_interval_is_the_percentile_bootstrap_over_items_with_ties_and_constant_resamples():
    """The interval ranks every resample at once: it equals a per-resample scipy Spearman over the same draws of
    items (ties ranked by their average; a resample with one side constant has no rho and is left out)."""
    from scipy.stats import spearmanr

    x = np.array([0.0, 0, 0, 1, 2])
    y = np.array([1.0, 0, 1, 1, 3])
    got = stats.spearman(x, y, n_boot=400, n_perm=100, seed=3)
    draws = np.random.default_rng(3).integers(0, x.size, size=(400, x.size))
    boots = np.array([spearmanr(x[d], y[d])[0] if np.ptp(x[d]) and np.ptp(y[d]) else np.nan for d in draws])
    assert np.isnan(boots).any()  # the design holds constant resamples
    want = np.quantile(boots[np.isfinite(boots)], [0.025, 0.975])
    assert got["rho"] == pytest.approx(spearmanr(x, y)[0], abs=1e-12)
    assert got["rho_ci"] == pytest.approx(list(want), abs=1e-12)


def test_fields_and_the_reporting_rule():
    row = {"relation": "r", **stats.fields("faithfulness", stats.wilson(3, 4))}
    assert row["faithfulness_n"] == 4 and len(row["faithfulness_ci"]) == 2
    stats.check_reported(row, ["faithfulness"])
    with pytest.raises(ValueError, match="causality_ci"):
        stats.check_reported({**row, "causality": 0.5}, ["faithfulness", "causality"])


def test_trial_mean_averages_trials_and_resamples_subjects():
    # two trials, four subjects; trial 0 tests subjects 0-2, trial 1 subjects 1-3
    counts = np.array([[1, 1, 1, 0], [0, 1, 1, 1]])
    hits = np.array([[[1, 1, 0, 0], [0, 0, 0, 1]],      # setting 0: 2/3 then 1/3 -> 0.5
                     [[1, 1, 1, 0], [0, 1, 1, 1]]])     # setting 1: all right -> 1.0
    v, lo, hi, n = stats.trial_mean(hits, counts, seed=0)
    assert n == 4 and v == pytest.approx([0.5, 1.0])
    assert lo[0] < 0.5 < hi[0] and lo[1] == hi[1] == 1.0
    # shuffled outcomes of a 50% rate over 40 subjects: the interval holds 0.5 and is wide
    rng = np.random.default_rng(0)
    c = np.ones((3, 40))
    h = (rng.random((3, 40)) < 0.5).astype(float)
    v, lo, hi, n = stats.trial_mean(h, c, seed=1)
    assert lo < 0.5 < hi and hi - lo > 0.15


def test_trial_resampling_holds_the_operator_to_operator_variance():
    """Trials whose operators disagree (half the trials right on every subject, half wrong on every one): a
    subjects-only interval sees every subject at 0.5 and is a point; drawing trials first gives the wide
    interval the operators' spread deserves. Trials that agree give the same interval both ways."""
    c = np.ones((8, 30))
    h = np.repeat(np.array([1, 0] * 4, float)[:, None], 30, 1)
    v, lo, hi, n = stats.trial_mean(h, c, seed=0)
    assert v == pytest.approx(0.5) and lo == pytest.approx(0.5) and hi == pytest.approx(0.5)
    v, lo, hi, n = stats.trial_mean(h, c, seed=0, resample="trials+subjects")
    assert v == pytest.approx(0.5) and lo < 0.3 and hi > 0.7
    rng = np.random.default_rng(0)
    same = np.repeat((rng.random(30) < 0.5).astype(float)[None], 8, 0)
    a = stats.trial_mean(same, c, seed=0)
    b = stats.trial_mean(same, c, seed=0, resample="trials+subjects")
    assert a[1] == pytest.approx(b[1], abs=0.02) and a[2] == pytest.approx(b[2], abs=0.02)
    with pytest.raises(ValueError, match="resample 'trials'; allowed: subjects, trials"):
        stats.trial_mean(h, c, resample="trials")


def test_trial_difference_is_a_paired_test_that_never_calls_equal_scorings_different():
    """The same outcomes scored twice identically: difference 0, p 1, undecided (however high both are); one
    scoring right on 6 more subjects of 30 in every trial: above, with the interval around +0.2; the other way
    round: below. Several settings at once share the constant's scoring."""
    rng = np.random.default_rng(1)
    c = np.ones((6, 30))
    const = (rng.random((6, 30)) < 0.5).astype(float)
    d = stats.trial_difference(const, const, c, seed=0)
    assert d["diff"] == 0 and d["p_value"] == 1.0 and d["verdict"] == "undecided"
    better = const.copy()
    for t in range(6):
        better[t, np.flatnonzero(const[t] == 0)[:6]] = 1
    d = stats.trial_difference(np.stack([better, const]), const, c, seed=0)
    assert d["diff"][0] == pytest.approx(0.2) and d["verdict"][0] == "above" and d["p_value"][0] < 0.01
    assert 0.1 < d["low"][0] < 0.2 < d["high"][0] < 0.32 and d["verdict"][1] == "undecided"
    assert d["n_subjects"] == 30 and d["n_trials"] == 6
    assert stats.trial_difference(const, better, c, seed=0)["verdict"] == "below"


def test_stratified_bootstrap_resamples_within_strata_and_counts_its_resamples():
    from mechfact.stats import stratified_bootstrap

    # two strata far apart: any resample keeps one value of each, so the mean stays between the strata's means
    x = np.array([0.0, 0.1, 0.2, 10.0, 10.1, 10.2, 10.3])
    strata = ["a", "a", "a", "b", "b", "b", "b"]
    est, distinct = stratified_bootstrap(x, lambda v: float(v.mean()), strata=strata, n_boot=400, min_distinct=10)
    assert distinct == math.comb(5, 3) * math.comb(7, 4) == 350
    assert est.n == 7 and est.low < est.value < est.high
    # every resample has 3 values of stratum a and 4 of b: the mean can never fall below (3 * 0 + 4 * 10) / 7
    assert est.low >= 40 / 7 - 1e-12 and est.high <= (3 * 0.2 + 4 * 10.3) / 7 + 1e-12
    # an unstratified bootstrap of the same values spreads far wider (strata can drop out)
    wide = stats.bootstrap(x, n_boot=400)
    assert wide.high - wide.low > 3 * (est.high - est.low)
    # too few distinct resamples: no interval, the count said
    few, d = stratified_bootstrap(x[:4], lambda v: float(v.mean()), strata=["a", "a", "b", "b"], min_distinct=100)
    assert d == 9 and few.low is None and few.method == "none"
    with pytest.raises(ValueError, match="3 stratum labels for 7 values"):
        stratified_bootstrap(x, np.mean, strata=["a", "b", "c"])
