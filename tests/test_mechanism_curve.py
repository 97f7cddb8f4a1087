"""synthetic.mechanism_curve: the mechanism on a ladder of widths d = x R A (planted summaries; one tiny run)."""

import pytest

from synthetic import mechanism_curve as M


def _row(n, regime, ratio, seed, train, zero, r2, r=2, a=8):
    return {"subjects": n, "relations": r, "attributes": a, "regime": regime, "ratio": ratio, "seed": seed,
            "d": M.width(ratio, r, a), "train_accuracy": train, "zero_shot_accuracy": zero, "r2_heldout": r2,
            "zero_shot_control_accuracy": 0.1}


def test_each_regime_s_own_threshold_is_the_first_rung_that_memorises_not_a_cutoff_on_the_probes():
    """Geometric memorises from x = 1 (seed 0) and x = 2 (seed 1); default from the first rung (a bound, `<=`);
    a seed that never memorises is `> the last rung`, with nothing reported there."""
    rows = [_row(64, "geometric", x, 0, t, z, 0.9) for x, t, z in ((0.5, 0.4, 0.2), (1, 0.995, 0.97), (2, 1, 0.99))]
    rows += [_row(64, "geometric", x, 1, t, z, 0.9) for x, t, z in ((0.5, 0.3, 0.2), (1, 0.9, 0.5), (2, 1, 0.95))]
    rows += [_row(64, "geometric", x, 2, 0.5, 0.3, 0.9) for x in (0.5, 1, 2)]
    rows += [_row(64, "default", x, s, 1.0, 0.4, 0.5) for x in (0.5, 1, 2) for s in (0, 1)]
    got = {(t["key"][3], t["key"][4]): t for t in M.own_thresholds(rows)}
    assert got["geometric", 0]["ratio"] == 1 and got["geometric", 0]["zero_shot"] == 0.97
    assert got["geometric", 1]["ratio"] == 2 and not got["geometric", 1]["at_min"]
    assert got["geometric", 2]["ratio"] is None
    assert got["default", 0]["ratio"] == 0.5 and got["default", 0]["at_min"]
    page = "\n".join(M.section(rows))
    assert "| 64 | 2 | 8 | geometric | 1, 2, > 2 | 0.97, 0.95 | 0.90, 0.90 |" in page
    assert "| 64 | 2 | 8 | default | <= 0.5, <= 0.5 | 0.40, 0.40 |" in page
    # the reading: a threshold only where every seed memorises somewhere on the ladder; a first-rung one is a bound
    assert ("- N = 64, R = 2, A = 8, default: mean zero-shot 0.40 at x = 0.5, 0.40 at x = 2 (highest 0.40, at "
            "x = 0.5); its own threshold at x = 0.5 (median over 2 seeds, a bound: the first rung), zero-shot there "
            "0.40.") in page
    assert ("- N = 64, R = 2, A = 8, geometric: mean zero-shot 0.23 at x = 0.5, 0.75 at x = 2 (highest 0.75, "
            "at x = 2).") in page


def test_a_seed_mean_gets_an_interval_only_from_five_seeds_on_and_the_range_below():
    """Two or four seeds have 3 or 35 distinct resamples (< 100): the seeds' range, said so; five have 126."""
    assert M._seed_mean([0.2, 0.4]) == "0.30 (range 0.20-0.40)"
    assert "range" in M._seed_mean([0.1, 0.2, 0.3, 0.4])
    five = M._seed_mean([0.1, 0.2, 0.3, 0.4, 0.5])
    assert five.startswith("0.30 [") and "range" not in five


def test_the_same_absolute_d_across_n_gives_the_difference_with_seeds_resampled_within_each_n():
    """N = 64 and N = 256 at the same R, A and d: zero-shot 0.9 vs 0.4 in every seed is a difference of -0.50 with
    a bootstrap interval (5 seeds each); R^2 equal gives +0.00."""
    rows = [_row(64, "geometric", 1, s, 1.0, 0.9, 0.8) for s in range(5)]
    rows += [_row(256, "geometric", 1, s, 1.0, 0.4, 0.8) for s in range(5)]
    lines = M._across_n(rows)
    row = next(x for x in lines if x.startswith("| 2 | 8 | geometric | 16 | 1 |"))
    assert "| 0.90 | 0.40 | -0.50 [-0.50, -0.50] |" in row and "| 0.80 | 0.80 | +0.00 [+0.00, +0.00] |" in row
    assert M._across_n([r for r in rows if r["subjects"] == 64]) == []  # one N: nothing to compare


def test_bad_ratios_are_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        M.main(["--out", str(tmp_path), "--ratios", "1", "0", "-2"])
    assert "--ratios 0 -2: each must be > 0" in capsys.readouterr().err


@pytest.mark.slow  # seconds of training: the slow tier keeps the fast one under 5 minutes
def test_the_ladder_trains_both_regimes_at_x_r_a_resumes_and_exports(tmp_path, one_thread):
    argv = ["--out", str(tmp_path / "c"), "--subjects", "32", "--relations", "2", "--attributes", "4", "--ratios",
            "0.5", "2", "--seeds", "0", "--steps", "200", "--mlp-width", "16"]
    M.main(argv)
    rows = M.collect(tmp_path / "c")
    assert sorted((r["regime"], r["ratio"], r["d"]) for r in rows) == [
        ("default", 0.5, 4), ("default", 2.0, 16), ("geometric", 0.5, 4), ("geometric", 2.0, 16)]
    first = (tmp_path / "c" / "N32_R2_A4" / "geometric_r2_seed0" / "summary.json").read_text()
    M.main(argv)  # finished models are read back, not retrained
    assert (tmp_path / "c" / "N32_R2_A4" / "geometric_r2_seed0" / "summary.json").read_text() == first
    M.main(["--out", str(tmp_path / "c"), "--export", str(tmp_path / "x")])
    assert len(M.collect(tmp_path / "x" / "curve")) == 4
