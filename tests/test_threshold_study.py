"""The threshold study's plumbing on a tiny world: d from d*, both regimes, resume, the table."""

import json
import re

import numpy as np

import pytest

from synthetic import pool_estimates as PE, pool_mechanism as PM, pool_runs as PR, results_pool as P
from synthetic import threshold_study as T


@pytest.mark.slow  # seconds of training: the slow tier keeps the fast one under 5 minutes
def test_threshold_study_trains_at_multiples_of_d_star_resumes_and_tabulates(tmp_path, one_thread, capsys):
    cap = tmp_path / "cap"
    cap.mkdir()
    (cap / "result.json").write_text(json.dumps({"thresholds": [
        {"subjects": 32, "relations": 2, "attributes": 4, "embeddings": "trainable", "threshold": t, "seed": s}
        for s, t in enumerate((3, 4, 6))]}))
    assert T.d_star_from(cap, 32, 2, 4) == 4
    with pytest.raises(ValueError, match="no trainable-embedding threshold for N=32, R=2, A=8"):
        T.d_star_from(cap, 32, 2, 8)
    argv = ["--out", str(tmp_path / "t"), "--subjects", "32", "--relations", "2", "--attributes", "4", "--capacity",
            str(cap), "--factors", "1", "2.5", "--seeds", "0", "--steps", "100", "--mlp-width", "16"]
    T.main(argv)
    rows = T.collect(tmp_path / "t")
    assert sorted((r["regime"], r["d"]) for r in rows) == [("default", 4), ("default", 10), ("geometric", 4),
                                                          ("geometric", 10)]
    for r in rows:
        assert r["swap_new_seed"] not in (0, 1)  # never the world of a trained seed
        assert r["d_star"] == 4 and r["chance"] == 0.25 and 0 <= r["train_accuracy"] <= 1
        assert -1 <= r["control_r2_heldout"] <= 1 and r["zero_shot_control_accuracy"] <= 1
    default = {r["d"]: r for r in rows if r["regime"] == "default"}
    assert default[10]["train_config"]["loss"] == "ce" and default[10]["stopped"] in ("target", "budget")
    assert {r["train_config"]["loss"] for r in rows if r["regime"] == "geometric"} == {"mse"}
    first = (tmp_path / "t" / "N32_R2_A4" / "default_x1_seed0" / "summary.json").read_text()
    T.main(argv)  # finished runs are read back, not retrained
    assert (tmp_path / "t" / "N32_R2_A4" / "default_x1_seed0" / "summary.json").read_text() == first
    text = T.table(rows)
    # a relation without selective units has no ablation (null in the summary): left out of the means, not fatal
    holed = [{**r, "ablation_on_others": [None, *r["ablation_on_others"][1:]]} for r in rows]
    assert T.table(holed).count("\n") == 1 + 4
    assert text.count("\n") == 1 + 4 and "| 32 | 2 | 4 | default | 10 (2.5) | 1 |" in text
    with pytest.raises(SystemExit):
        T.main(["--out", str(tmp_path / "t")])  # neither --capacity nor --d-star
    assert "give one of --capacity" in capsys.readouterr().err
    # the page: thresholds and threshold runs exported, then the page written from the export alone
    caps = tmp_path / "caps" / "pool_N32"
    caps.mkdir(parents=True)
    recs = [{"subjects": 32, "relations": r, "attributes": 4, "embeddings": "trainable", "seed": s, "threshold": t,
             "r_log_n": r * 3.4657, "r_log_a": r * 1.3863, "n_facts": 32 * r,
             **({"at_grid_min": True} if t == 2 else {})}
            for r, ts in ((2, (2, 3, 4)), (4, (6, 7, 8))) for s, t in enumerate(ts)]
    (caps / "result.json").write_text(json.dumps({"thresholds": recs}))
    (caps / "config.json").write_text(json.dumps({"config": {"out": str(caps), "grid": [2, 3]}}))
    assert PR.export(tmp_path / "caps", tmp_path / "t", tmp_path / "x") == 2 + 4
    assert str(tmp_path) not in (tmp_path / "x" / "capacity" / "pool_N32" / "config.json").read_text()
    P.write_doc(tmp_path / "x", tmp_path / "page.md", tmp_path / "img")
    page = (tmp_path / "page.md").read_text()
    assert "| 32 | 2 | 4 | 6.9 | 2.8 | 2, 3, 4 | <= 3 | 1.08 |" in page  # a seed at the grid minimum: a bound
    assert "| 32 | 4 | 4 | 13.9 | 5.5 | 6, 7, 8 | 7 | 1.26 |" in page
    assert "| d* = a R ln A + b | 1.44 [" in page and "With one N (32)" in page
    assert "| 32 | 2 | 4 | default | 10 (2.5) | 1 |" in page and "- geometric: 1 d*: " in page
    assert (tmp_path / "img" / "dstar_pool.png").stat().st_size > 0 and (tmp_path / "img" / "threshold.png").is_file()


def test_a_threshold_that_reached_below_the_smaller_budgets_at_the_grid_minimum_has_moved(tmp_path):
    """The budget check: at the larger budget a seed that reached at the grid's smallest value, below its
    threshold at the smaller budget, has not converged (its d* moved, though only a bound is known); one reached
    at the grid minimum not below the smaller budget's threshold is not decided; a ratio of medians over such
    bounds is printed as a bound."""
    rec = {"relations": 8, "attributes": 64, "embeddings": "trainable", "searched": "d"}
    for name, steps, grid, ts in (("pool_N256_8k", 8000, [8, 10, 12], (10, 10, 8)),
                                  ("pool_N256_32k", 32000, [9, 10], (9, 10, 9)),
                                  ("pool_N1024_8k", 8000, [12, 14, 16], (14, 14, 14)),
                                  ("pool_N1024_32k", 32000, [12, 13, 14], (13, 13, 13))):
        (tmp_path / "capacity" / name).mkdir(parents=True)
        (tmp_path / "capacity" / name / "result.json").write_text(json.dumps({"thresholds": [
            {**rec, "subjects": int(name.split("_")[1][1:]), "seed": s, "threshold": t,
             **({"at_grid_min": True} if t == grid[0] else {})} for s, t in enumerate(ts)]}))
        (tmp_path / "capacity" / name / "config.json").write_text(json.dumps({"config": {
            "grid": grid, "scan": "ascending", "train": {"steps": steps}}}))
    text = "\n".join(P._budget_section(tmp_path, []))
    assert "| 256 | 8 | 64 | not run | 10, 10, <= 8 | <= 9, 10, <= 9 | 8000 / 32000: 1 of 3 seeds " \
           "(1 not decided) |" in text
    assert "- N = 256, R = 8, A = 64: not converged: 1 of 3 seeds still move between 8000 and 32000 steps (d* " \
           "<= 9, 10 at 32000)" in text
    # the ratio of medians over bounds is a bound: N = 256's thresholds are at most those shown
    assert "- d*(N = 1024) / d*(N = 256) at R = 8, A = 64, medians: >= 1.40 at 8000, >= 1.44 at 32000 steps (as a " \
           "power of N: >= N^0.24, >= N^0.27); R ln N predicts 1.25" in text


def test_each_settings_bound_at_the_grid_minimum_is_read_on_its_own_parts_grid(tmp_path):
    """Two budget parts at the same N and R but other A, on other grids: a threshold equal to one grid's smallest
    value is a bound there and an exact value on the other grid, whichever part was read last; the scans say
    which settings ran which grid."""
    for name, a, grid, scan in (("pool_N256_A16_R8_8k", 16, [5, 6, 7, 8, 9, 10], "ascending"),
                                ("pool_N256_8k", 64, [8, 10, 12], "bisect")):
        (tmp_path / "capacity" / name).mkdir(parents=True)
        (tmp_path / "capacity" / name / "result.json").write_text(json.dumps({"thresholds": [
            {"subjects": 256, "relations": 8, "attributes": a, "embeddings": "trainable", "searched": "d",
             "seed": s, "threshold": 8} for s in range(2)]}))
        (tmp_path / "capacity" / name / "config.json").write_text(json.dumps({"config": {
            "grid": grid, "scan": scan, "relations": [8], "attributes": [a], "train": {"steps": 8000}}}))
    text = "\n".join(P._budget_section(tmp_path, []))
    assert "| 256 | 8 | 16 | not run | 8, 8 | one budget |" in text
    assert "| 256 | 8 | 64 | not run | <= 8, <= 8 | one budget |" in text
    assert "8000 steps: ascending scan over 5, 6, 7, 8, 9, 10 (N = 256, R = 8, A = 16)" in text
    assert "8000 steps: bisection over 8, 10, 12 (N = 256, R = 8, A = 64)" in text


def test_the_width_budget_check_sets_each_seeds_m_star_beside_the_same_seed_at_more_steps(tmp_path):
    """m* and the step budget: per (N, R, A, embeddings) each seed's 2000-step m* beside its m* at 8000 steps; a
    setting has converged where every seed's m* is the same at the two budgets; a seed that reached at the grid's
    smallest width, below its 2000-step m*, has moved (as in the d* check); without a budget part the page says
    that convergence is not measured."""
    assert "not measured yet" in "\n".join(P._width_budget_section(tmp_path))
    rec = {"relations": 2, "attributes": 16, "subjects": 256, "searched": "mlp-width"}
    for name, steps, rows in (
            ("pool_N256_width", 2000, [("frozen", 0, 32), ("frozen", 1, 32), ("frozen-input", 0, 32),
                                       ("frozen-input", 1, 64)]),
            ("pool_N256_R2-4_8k_width", 8000, [("frozen", 0, 32), ("frozen", 1, 32), ("frozen-input", 0, 2),
                                               ("frozen-input", 1, 32)])):
        (tmp_path / "capacity" / name).mkdir(parents=True)
        (tmp_path / "capacity" / name / "result.json").write_text(json.dumps({"thresholds": [
            {**rec, "embeddings": e, "seed": s, "threshold": t, **({"at_grid_min": True} if t == 2 else {})}
            for e, s, t in rows]}))
        (tmp_path / "capacity" / name / "config.json").write_text(json.dumps({"config": {
            "grid": [2, 4, 8, 16, 32, 64], "subjects": [256], "relations": [2], "train": {"steps": steps}}}))
    text = "\n".join(P._width_budget_section(tmp_path))
    assert "| 256 | 2 | 16 | frozen | 32, 32 | 32, 32 | 2 of 2 seeds |" in text
    assert "| 256 | 2 | 16 | frozen-input | 32, 64 | <= 2, 32 | 0 of 2 seeds |" in text
    assert "1 of 2 settings have converged (every seed's m* the same at the two largest budgets); 2 seed " \
           "thresholds moved." in text
    assert "--part pool_N256_R2-4_8k_width`" in text


@pytest.mark.slow  # seconds: the slow tier keeps the fast one under 5 minutes
def test_the_pool_page_is_what_its_command_writes_from_the_shipped_runs(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if not (root / "docs/runs/pool").is_dir():
        pytest.skip("docs/runs/pool is not in this checkout")
    P.write_doc(root / "docs/runs/pool", tmp_path / "page.md")
    assert (tmp_path / "page.md").read_text() == (root / "docs/results_pool.md").read_text()


@pytest.mark.slow  # seconds of training: the slow tier keeps the fast one under 5 minutes
def test_at_the_threshold_the_default_regime_memorises_without_the_geometry_and_the_geometric_does_not_memorise(
        tmp_path, one_thread):
    """The trend the pool page reports, at small scale (N = 64, R = 2, A = 8, d = 3, where the default regime just
    stores every fact): the default regime memorises but transfers little zero-shot; the geometric regime (MSE,
    L2, zero-init embeddings) at the same width stores few facts, while its embeddings already pass the
    superposition test."""
    default = T.run_one(tmp_path / "d", "default", 64, 2, 8, 3, 32, 0, 2000)
    geo = T.run_one(tmp_path / "g", "geometric", 64, 2, 8, 3, 32, 0, 2000)
    assert default["train_accuracy"] >= 0.99
    assert default["zero_shot_control_accuracy"] < default["zero_shot_accuracy"] < 0.5
    assert default["r2_heldout"] < 0.6
    assert geo["train_accuracy"] < 0.6
    assert geo["r2_heldout"] > 0.9


def test_the_pool_page_tabulates_m_star_per_embedding_regime_and_estimates_what_is_missing(tmp_path):
    """The width part's records (searched: mlp-width) go to their own table, never into the d* fits; a setting
    never reached is "> grid max" and has no median; the frozen / trainable ratio is of the medians; an unfinished
    part is named with its count and a missing one gets a cost scaled from the finished part of its kind."""
    from synthetic.facts_study import PARTS

    src = tmp_path / "src"
    d_part, w_part = src / "capacity" / "pool_N256", src / "capacity" / "pool_N256_width"
    d_recs = [{"subjects": 256, "relations": r, "attributes": 16, "embeddings": "trainable", "seed": s,
               "threshold": t, "searched": "d", "r_log_n": r * 5.545, "r_log_a": r * 2.773, "n_facts": 256 * r}
              for r, ts in ((2, (3, 3)), (4, (5, 6))) for s, t in enumerate(ts)]
    w = {("trainable", 2): (2, 2), ("frozen", 2): (64, 128), ("frozen-input", 2): (64, 64),
         ("trainable", 4): (4, 4), ("frozen", 4): (256, None), ("frozen-input", 4): (128, 256)}
    w_recs = [{"subjects": 256, "relations": r, "attributes": 16, "embeddings": e, "seed": s, "threshold": t,
               "searched": "mlp-width", "mlp_width": t, "d": 16, "r_log_n": r * 5.545, "r_log_a": r * 2.773,
               "n_facts": 256 * r} for (e, r), ts in w.items() for s, t in enumerate(ts)]
    for folder, recs, cfg in ((d_part, d_recs, {"grid": [1, 2, 3, 4, 5, 6], "d": 64}),
                              (w_part, w_recs, {"grid": [2, 4, 2048], "d": 16, "subjects": [256]})):
        folder.mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps({"thresholds": recs}))
        (folder / "config.json").write_text(json.dumps({"config": cfg}))
        (folder / "meta.json").write_text(json.dumps({"wall_time_s": 1800.0}))
    b_part = src / "capacity" / "pool_N256_8k"  # the budget check: 4x the steps on a grid below the thresholds
    b_part.mkdir()
    (b_part / "result.json").write_text(json.dumps({"thresholds": [
        {**d_recs[2], "threshold": 4, "at_grid_min": True}, {**d_recs[3], "threshold": 5}]}))
    (b_part / "config.json").write_text(json.dumps({"config": {"grid": [4, 5], "d": 64, "train": {"steps": 8000}}}))
    c_part = src / "capacity" / "pool_N256_32k"  # 16x the steps: seed 1 agrees with 8000 steps, seed 0 undecided
    c_part.mkdir()
    (c_part / "result.json").write_text(json.dumps({"thresholds": [
        {**d_recs[2], "threshold": 4}, {**d_recs[3], "threshold": 5}]}))
    (c_part / "config.json").write_text(json.dumps({"config": {"grid": [3, 4, 5], "d": 64, "scan": "ascending",
                                                               "train": {"steps": 32000}}}))
    (src / "capacity" / "pool_N1024").mkdir()
    (src / "capacity" / "pool_N1024" / "result.json").write_text(json.dumps({"thresholds": [
        {**t, "subjects": 1024, "r_log_n": t["relations"] * 6.931, "n_facts": 1024 * t["relations"]}
        for t in d_recs[:3]]}))
    recs, parts = PR.pool_thresholds(src)
    assert parts == ["pool_N1024", "pool_N256"] and all(t["searched"] == "d" for t in recs)
    P.write_doc(src, tmp_path / "page.md")
    page = (tmp_path / "page.md").read_text()
    assert "| N | R | A | N R | m* trainable (median) | m* frozen-input (median) | m* frozen (median) | " \
           "frozen / trainable |" in page
    assert "| 256 | 2 | 16 | 512 | 2, 2 (2) | 64, 64 (64) | 64, 128 (96) | 48x |" in page
    assert "| 256 | 4 | 16 | 1024 | 4, 4 (4) | 128, 256 (192) | 256, > 2048 (—) | — |" in page
    # m* never enters the d* table: the d* rows are the d part's (and the unfinished N = 1024 part's) only
    assert "| 256 | 4 | 16 | 22.2 | 11.1 | 5, 6 | 5.5 | 0.50 |" in page and "| 1024 | 4 | 16 | 27.7 | 11.1 | 5 | 5 |" in page
    assert "11.1 | 4, 4" not in page
    assert "- `pool_N1024`: unfinished, 3 thresholds so far" in page
    assert ("| N | R | A | d* per seed, 2000 steps | d* per seed, 8000 steps | d* per seed, 32000 steps | the two "
            "largest budgets run agree |") in page
    assert "| 256 | 4 | 16 | 5, 6 | <= 4, 5 | 4, 5 | 8000 / 32000: 1 of 2 seeds (1 not decided) |" in page
    assert "- N = 256, R = 4, A = 16: not converged" not in page
    assert ("- N = 256, R = 4, A = 16: not decided: 1 of 2 seeds agree between 8000 and 32000 steps (d* 5 at 32000), 1 "
            "not decided") in page
    assert ("8000 steps: bisection over 4, 5 (N = 256, R = 4, A = 16); 32000 steps: ascending scan over 3, 4, 5 (N = 256, "
            "R = 4, A = 16)") in page
    s256, s4096 = (int(PARTS[p][PARTS[p].index("--seeds") + 1]) for p in ("pool_N256", "pool_N4096"))
    assert f"- `pool_N4096`: about {1800 * 16 * s4096 / s256 / 3600:.1f} CPU hours" in page
    # a part of other relations, pools and seeds scales by each: N = 16384 at R = 2, 4, A = 16, 64 (3 seeds) from
    # pool_N256's R = 2-16, A = 16, 64, 256: 64x the subjects, 6 / 30 of the relations, 2 / 3 of the pools
    assert f"- `pool_N16384_R2-4`: about {1800 * 64 * (6 / 30) * (2 / 3) * (3 / s256) / 3600:.1f} CPU hours" in page
    assert "`pool_N256_width`" not in page.split("## Not run here")[1]
    # an A = N part scales from a finished A = N part by N^2 (its A-way output layer grows with N as well), never
    # from a part of small pools: pool_N4096_AN (3 seeds) from pool_N1024_AN (2 seeds, the same relations)
    assert "- `pool_N4096_AN`: `python -m" in page
    (src / "capacity" / "pool_N1024_AN").mkdir()
    (src / "capacity" / "pool_N1024_AN" / "meta.json").write_text(json.dumps({"wall_time_s": 600.0}))
    assert (f"- `pool_N4096_AN`: about {600 * 16 * 3 / 2 / 3600:.1f} CPU hours on one thread in all (pool_N1024_AN "
            "took 10 CPU-min, scaled by N^2 (A = N)") in PE._estimate(src)
    # a part that ran two jobs at once took twice its wall time in CPU time
    (src / "capacity" / "pool_N1024_AN" / "meta.json").write_text(json.dumps({"wall_time_s": 600.0, "workers": 2}))
    assert (f"- `pool_N4096_AN`: about {1200 * 16 * 3 / 2 / 3600:.1f} CPU hours on one thread in all (pool_N1024_AN "
            "took 20 CPU-min") in PE._estimate(src)


def test_a_budget_part_is_costed_by_the_evaluations_its_scan_will_train(tmp_path):
    """A budget part not run: an ascending scan trains each grid value up to the seed's threshold at the largest
    smaller budget run (the whole grid where none is known), each N R facts for the part's steps, at the measured
    CPU-seconds per fact-step of the finished parts - not the cost of another N's part scaled by N, which missed an
    R = 16 scan by 4x. pool_N256_R2_32k: R = 2, A = 16, 64, 256, 5 seeds, ascending over 1, 2, 3, 4."""
    base = {"subjects": 256, "relations": 2, "embeddings": "trainable", "searched": "d"}
    for name, steps, t in (("pool_N256_R2", 2000, 4), ("pool_N256_R2_8k", 8000, 3)):
        part = tmp_path / "capacity" / name
        part.mkdir(parents=True)
        recs = [{**base, "attributes": a, "seed": s, "threshold": t} for a in (16, 64, 256) for s in range(5)
                if (a, s) != (256, 4) or steps == 2000]  # A = 256, seed 4: no 8000-step threshold
        recs[0]["threshold"] = None if steps == 8000 else t  # never reached at 8000 steps: the whole grid
        evs = {f"N=256 R=2 A=16 emb=trainable d={d} m=64 seed=0": {"accuracy": 0.5, "steps": steps} for d in (1, 2)}
        (part / "result.json").write_text(json.dumps({"thresholds": recs, "evaluations": evs}))
        (part / "config.json").write_text(json.dumps({"config": {"train": {"steps": steps}}}))
        (part / "meta.json").write_text(json.dumps({"wall_time_s": 1000.0 if steps == 8000 else 250.0}))
    done = {q: json.loads((tmp_path / "capacity" / q / "meta.json").read_text())
            for q in ("pool_N256_R2", "pool_N256_R2_8k")}
    # seed 4 at A = 256 falls back to its 2000-step threshold 4 (4 values), seed 0 at A = 16 to the whole grid (4),
    # the other 13 units to 8000 steps' 3 (values 1 and 2, then 3): 13 x 3 + 4 + 4 = 47 evaluations
    rate = 1000 / (256 * 2 * 8000 * 2)  # both parts: 1000 s and 250 s over 2 x 256 x 2 x steps -> the same rate
    text = PE._budget_cost("pool_N256_R2_32k", tmp_path, done)
    assert text.startswith(f"about {47 * 256 * 2 * 32000 * rate / 3600:.1f} CPU hours on one thread in all (47 "
                           "evaluations of 32000 steps, each grid value up to the seed's threshold at the largest "
                           "smaller budget run (1 without one: the whole grid); at ")
    assert f"at {rate * 1e9:.0f} s per 10^9 facts x steps trained, the median of 2 finished CPU parts:" in text
    assert PE._budget_cost("pool_N256_R2_32k", tmp_path, {}) == ""  # nothing timed: no estimate


def test_an_m_star_part_borrows_the_2000_step_m_star_of_settings_its_own_budget_has_not_measured(tmp_path):
    """pool_N256_R8-16_8k_width (R = 8, 16; A = 16, 64, 256; frozen-input and frozen; widths 2..2048 ascending;
    3 seeds) costed from the finished 8000-step m* part, which holds R = 2 only: the 12 settings it lacks take the
    2000-step m* (an upper bound: m* falls with the budget) instead of the grid's top, and the line says so."""
    for name, steps, r in (("pool_N256_R2-4_8k_width", 8000, 2), ("pool_N256_width", 2000, None)):
        part = tmp_path / "capacity" / name
        part.mkdir(parents=True)
        recs = [{"subjects": 256, "relations": rr, "attributes": a, "embeddings": e, "searched": "mlp-width",
                 "seed": 0, "threshold": 32} for rr in ((r,) if r else (8, 16)) for a in (16, 64, 256)
                for e in ("frozen-input", "frozen")]
        (part / "result.json").write_text(json.dumps({"thresholds": recs, "evaluations": {
            "N=256 R=2 A=16 emb=frozen d=16 m=4 seed=0": {"accuracy": 0.5, "steps": steps}}}))
        (part / "meta.json").write_text(json.dumps({"wall_time_s": 256 * 2 * 4 * steps * 1e-6}))  # 1e-6 s a unit
    widths = (2, 4, 8, 16, 32)  # the ascending scan's evaluations up to m* = 32
    hours = sum(256 * r * g * 8000 * 3 * 1e-6 for r in (8, 16) for g in widths) * 3 * 2 / 3600
    text = PE._width_cost("pool_N256_R8-16_8k_width", tmp_path, ["pool_N256_R2-4_8k_width"], ["pool_N256_width"])
    assert text.startswith(f"about {hours:.2g} CPU hours on one thread in all (")
    assert "; 12 settings' m* from pool_N256_width, at fewer steps)" in text and "grid's top" not in text
    alone = PE._width_cost("pool_N256_R8-16_8k_width", tmp_path, ["pool_N256_R2-4_8k_width"])
    assert "; 12 settings with no measured m*, at the grid's top)" in alone and "fewer steps" not in alone
    top = sum(256 * r * 2**i * 8000 * 3 * 1e-6 for r in (8, 16) for i in range(1, 12)) * 3 * 2 / 3600
    assert alone.startswith(f"about {top:.0f} CPU hours")


def test_a_setting_in_two_pool_parts_is_read_once_preferring_the_one_that_reached(tmp_path):
    """pool_N4096 and pool_N4096_A64 share the A = 64 settings: the page takes each (N, R, A, seed) once, the record
    with a threshold over one that never reached within its (smaller) grid; parts of other names are not read."""
    base = {"subjects": 4096, "attributes": 64, "embeddings": "trainable", "searched": "d", "mlp_width": 64}
    parts = {"pool_N4096": [{**base, "relations": 16, "seed": 0, "threshold": None, "d": None},
                            {**base, "relations": 2, "seed": 0, "threshold": 3, "d": 3},
                            {**base, "relations": 2, "seed": 0, "attributes": 16, "threshold": 2, "d": 2}],
             "pool_N4096_A64": [{**base, "relations": 16, "seed": 0, "threshold": 80, "d": 80},
                                {**base, "relations": 2, "seed": 0, "threshold": 3, "d": 3}],
             "pool_N4096_A64_8k": [{**base, "relations": 16, "seed": 0, "threshold": 64, "d": 64}],
             "pool_N4096_old": [{**base, "relations": 4, "seed": 0, "threshold": 9, "d": 9}],
             "pool_N1024_AN": [{**base, "subjects": 1024, "attributes": 1024, "relations": 2, "seed": 0,
                                "threshold": 4, "d": 4}]}
    for name, recs in parts.items():
        (tmp_path / "capacity" / name).mkdir(parents=True)
        (tmp_path / "capacity" / name / "result.json").write_text(json.dumps({"thresholds": recs}))
    recs, names = PR.pool_thresholds(tmp_path)
    assert names == ["pool_N1024_AN", "pool_N4096", "pool_N4096_A64"]
    got = sorted((t["relations"], t["attributes"], t["threshold"]) for t in recs)
    assert got == [(2, 16, 2), (2, 64, 3), (2, 1024, 4), (16, 64, 80)]
    assert [t["threshold"] for t in PR.pool_thresholds(tmp_path, "d", "_8k")[0]] == [64]


@pytest.mark.slow
def test_threshold_runs_as_ray_tasks_equal_the_local_runs(tmp_path, one_thread):
    """--executor ray: every (regime, factor, seed) run a Ray task, written by the driver as it returns; the
    summaries and probes are the local runs' (wall times aside), and bad executor flags are refused by name."""
    argv = ["--subjects", "32", "--relations", "2", "--attributes", "4", "--d-star", "3", "--factors", "1", "2",
            "--seeds", "0", "--steps", "100", "--mlp-width", "16"]
    T.main(["--out", str(tmp_path / "local"), *argv])
    T.main(["--out", str(tmp_path / "ray"), *argv, "--executor", "ray", "--workers", "2"])

    def runs(root):
        out = {}
        for f in sorted((root / "N32_R2_A4").glob("*/summary.json")):
            summ = json.loads(f.read_text())
            summ.pop("wall_time_s")
            out[f.parent.name] = (summ, json.loads((f.parent / "probes.json").read_text()))
        return out

    local = runs(tmp_path / "local")
    assert sorted(local) == ["default_x1_seed0", "default_x2_seed0", "geometric_x1_seed0", "geometric_x2_seed0"]
    assert runs(tmp_path / "ray") == local
    with pytest.raises(SystemExit):
        T.main(["--out", str(tmp_path / "x"), *argv, "--workers", "2"])


def test_the_unfinished_regime_map_at_n4096_lists_its_missing_models_and_their_measured_cost():
    """Before any N = 4096 model: the largest map's time scaled by the facts; once some ran, the missing (variant,
    seed) pairs, each costed at its variant's measured time (else a same-shape variant's, else the median model's);
    nothing once all ran."""
    from synthetic import regime_map

    small = [{"subjects": 256, "relations": 8, "world_attributes": 64, "variant": v, "seed": s, "wall_time_s": 60.0}
             for v in ("default", "geometric") for s in (0, 1)]
    text = PE._map_estimate(small)
    assert f"about {240 * 16 / 3600:.1f} CPU hours" in text and "--capacity runs/facts/pool_N4096_A64" in text
    big = [{"subjects": 4096, "relations": 8, "world_attributes": 64, "variant": v, "seed": 0, "wall_time_s": t}
           for v, t in (("default", 360.0), ("geometric", 3600.0), ("A-16", 720.0), ("geo-no-l2", 1800.0))]
    # a model made on a GPU counts as run, but its time is no CPU time: loss-mse seed 1 is costed as if none ran
    gpu = [{"subjects": 4096, "relations": 8, "world_attributes": 64, "variant": "loss-mse", "seed": 0,
            "wall_time_s": 1.0, "device": "cuda"}]
    text = PE._map_estimate(small + big + gpu)
    n_all = len(regime_map.VARIANTS) * 2
    missing = n_all - 5
    own = {"default": 360.0, "geometric": 3600.0, "A-16": 720.0, "geo-no-l2": 1800.0}

    def expected(v: str) -> float:  # a missing model: its variant's time, else a same-shape variant's, else the median
        var = regime_map.VARIANTS[v]
        if v in own:
            return own[v]
        if var.regime == "geometric" and var.factor == 0.0:  # d = 128, MLP 256: geo-no-l2's shape
            return 1800.0
        if var.factor == 3.0 and var.mlp_width is None and v != "A-N":
            return 3600.0 if var.regime == "geometric" else 540.0  # median of default and A-16
        return 1260.0  # median of the four CPU-timed models (A-N: no measured model has its pool A = N)

    hours = sum(expected(v) for v in regime_map.VARIANTS) / 3600 + sum(
        expected(v) for v in regime_map.VARIANTS if v not in own and v != "loss-mse") / 3600
    assert f"5 of {n_all} models in section 3; the other {missing} (" in text
    assert "default seed 1, loss-mse seed 1, l2-1e-4 seed 0" in text and "geometric seed 0" not in text
    assert f"about {hours:.1f} CPU hours" in text and "a lower bound for A-N, whose pool is larger" in text
    full = [{"subjects": 4096, "relations": 8, "world_attributes": 64, "variant": v, "seed": s, "wall_time_s": 1.0}
            for v in regime_map.VARIANTS for s in (0, 1)]
    assert PE._map_estimate(small + full) == ""


def test_the_pool_page_names_what_a_gpu_made_and_nothing_when_all_ran_on_the_cpu(tmp_path):
    """Thresholds and models with a non-CPU ``device`` are counted and named on the page; records from before the
    field (no ``device``) are CPU ones."""
    from mechfact.runs import write_json_atomic

    def rec(seed, **kw):
        return {"subjects": 256, "relations": 2, "embeddings": "trainable", "seed": seed, "searched": "d", "d": 4,
                "mlp_width": 64, "threshold": 4, "n_facts": 512, "r_log_n": 11.1, "attributes": 16,
                "r_log_a": 5.5, **kw}

    write_json_atomic(tmp_path / "capacity" / "pool_N256" / "result.json",
                      {"thresholds": [rec(0), rec(1, device="cpu")], "evaluations": {}})
    assert PE._device_line(tmp_path, PR.pool_thresholds(tmp_path)[0], []) == []
    write_json_atomic(tmp_path / "capacity" / "pool_N256" / "result.json",
                      {"thresholds": [rec(0), rec(1, device="cuda")], "evaluations": {}})
    summ = {"regime": "geometric", "subjects": 256, "relations": 2, "attributes": 16, "factor": 3.0, "seed": 1,
            "device": "cuda"}
    write_json_atomic(tmp_path / "threshold" / "N256_R2_A16" / "geometric_x3_seed1" / "summary.json", summ)
    write_json_atomic(tmp_path / "threshold" / "N256_R2_A16" / "geometric_x3_seed0" / "summary.json",
                      {**summ, "seed": 0, "device": "cpu"})
    line = PE._device_line(tmp_path, PR.pool_thresholds(tmp_path)[0], T.collect(tmp_path / "threshold"))[0]
    assert "1 of the thresholds in section 1" in line and "1 of the trained models" in line
    assert "geometric x3 seed 1" in line and "seed 0" not in line


def test_a_setting_searched_in_two_parts_takes_the_pools_own_part_and_the_page_says_where_they_differ(tmp_path):
    from mechfact.runs import write_json_atomic

    def rec(R, seed, thr, **kw):
        return {"subjects": 4096, "relations": R, "embeddings": "trainable", "seed": seed, "searched": "d", "d": thr,
                "mlp_width": 64, "threshold": thr, "n_facts": 4096 * R, "r_log_n": R * 8.3, "attributes": 64,
                "r_log_a": R * 4.2, **kw}

    write_json_atomic(tmp_path / "capacity" / "pool_N4096" / "result.json",
                      {"thresholds": [rec(2, 0, 6, device="cuda"), rec(4, 1, 14, device="cuda")], "evaluations": {}})
    write_json_atomic(tmp_path / "capacity" / "pool_N4096_A64" / "result.json",
                      {"thresholds": [rec(2, 0, 6), rec(4, 1, 12)], "evaluations": {}})
    recs, _ = PR.pool_thresholds(tmp_path)
    assert sorted((t["relations"], t["threshold"]) for t in recs) == [(2, 6), (4, 12)]
    line = PE._twice_line(tmp_path)[0]
    assert "1 of 2 give the same d*" in line
    assert "N = 4096, R = 4, A = 64, seed 1: 14 (pool_N4096, cuda) vs 12 (pool_N4096_A64, cpu)" in line


def test_a_stopped_regime_run_resumes_its_training_and_ends_with_the_same_summary(tmp_path, train_spy, one_thread):
    """A map / threshold model trains with a checkpoint in its folder: stopped mid-training, the rerun resumes
    at the checkpoint's step and ends with the uninterrupted run's numbers (its time counting the first
    process's training); the checkpoint is deleted once summary.json is written."""
    import importlib

    train_spy(importlib.import_module("mechfact.facts.train"), 50)  # the module (mechfact.facts.train: a function)
    args, over = ("default", 32, 2, 8, 3, 16, 0, 150), {"target_accuracy": None}
    full = T.run_one(tmp_path / "full", *args, train_overrides=over)
    train_spy.stop_at = 100
    with pytest.raises(train_spy.Stop):
        T.run_one(tmp_path / "cut", *args, train_overrides=over)
    assert (tmp_path / "cut" / T.CHECKPOINT).is_file() and not (tmp_path / "cut" / "summary.json").exists()
    train_spy.stop_at = None
    resumed = T.run_one(tmp_path / "cut", *args, train_overrides=over)
    assert train_spy.starts == [0, 0, 100]
    drop = {"wall_time_s"}
    assert {k: v for k, v in resumed.items() if k not in drop} == {k: v for k, v in full.items() if k not in drop}
    assert resumed["steps"] == 150 and not (tmp_path / "cut" / T.CHECKPOINT).exists()


def test_the_width_threshold_fit_carries_a_bootstrap_interval_over_seeds():
    """m* fitted against N R on per-setting medians, its slope's interval from resampling the seeds of each
    setting: seed 1 needs twice seed 0's width everywhere, so the slope is 0.375 (the medians); three settings of
    two seeds have 3^3 = 27 distinct resamples, too few for an interval (the page says so); five settings have
    3^5 = 243 and get an interval around it (wider than the seeds' own slopes 0.25 and 0.5: a resample can take
    seed 0 at small N R and seed 1 at large)."""
    from synthetic.results_pool import width_table

    def recs(rs):
        return [{"subjects": 64, "attributes": 16, "relations": r, "embeddings": "frozen", "seed": s,
                 "threshold": 16 * r * (s + 1)} for r in rs for s in (0, 1)]
    fit = next(line for line in width_table(recs((2, 4, 8)), 2048).splitlines() if "m* = a N R + b" in line)
    assert fit.split("|")[3].strip() == "0.375 (no interval: 27 resamples)", fit
    assert "| 64 | 4 | 16 | 256 | 64, 128 (96) |" in width_table(recs((2, 4, 8)), 2048)
    fit = next(line for line in width_table(recs((2, 3, 4, 6, 8)), 2048).splitlines() if "m* = a N R + b" in line)
    lo, hi = (float(x) for x in fit.split("|")[3].strip().split("[")[1].rstrip("]").split(","))
    assert fit.split("|")[3].strip().startswith("0.375 [") and 0 < lo < 0.25 and 0.5 < hi < 1, fit


def test_a_part_whose_missing_pools_finished_in_their_own_parts_is_not_listed_as_unfinished(tmp_path):
    """pool_N4096 holds its A = 16 settings and part of A = 64; A = 64 and A = 256 ran alone (pool_N4096_A64,
    pool_N4096_A256): once both have finished, nothing of pool_N4096 is left to run; while one is unfinished, or
    while pool_N4096 lacks one of its own A = 16 settings, it is listed with its count."""
    cap = tmp_path / "capacity"

    def part(name, recs, finished):
        (cap / name).mkdir(parents=True, exist_ok=True)
        (cap / name / "result.json").write_text(json.dumps({"thresholds": recs}))
        if finished:
            (cap / name / "meta.json").write_text(json.dumps({"wall_time_s": 60.0}))

    def recs(a, rs=(2, 4, 8, 16), seeds=(0, 1)):
        return [{"subjects": 4096, "relations": r, "attributes": a, "embeddings": "trainable", "seed": s,
                 "threshold": 8} for r in rs for s in seeds]

    part("pool_N4096", recs(16) + recs(64, rs=(2, 4)), False)
    part("pool_N4096_A64", recs(64), True)
    part("pool_N4096_A256", recs(256, rs=(2, 4)), False)
    assert "- `pool_N4096`: unfinished, 12 thresholds so far" in PE._estimate(tmp_path)
    part("pool_N4096_A256", recs(256), True)
    assert "`pool_N4096`" not in PE._estimate(tmp_path)
    part("pool_N4096", recs(16, seeds=(0,)) + recs(64, rs=(2, 4)), False)  # an A = 16 setting of its own missing
    assert "- `pool_N4096`: unfinished, 8 thresholds so far" in PE._estimate(tmp_path)


def test_an_unrun_width_part_is_costed_by_its_bisection_at_the_measured_rate(tmp_path, monkeypatch):
    """A width part not run: each setting's bisection over its grid to the finished part's median m* (same R, A,
    embeddings) scaled by N, every evaluation at the full budget and at the measured seconds per fact x unit x
    step. Finished: 100 s over one evaluation of 16 x 2 facts x 8 units x 1000 steps; m* 8 at N = 16 -> 32 at
    N = 64; the bisection of 2 .. 64 visits 8, 32, 16: 100 / 256,000 x 64 x 2 x 56 x 100 steps x 2 seeds = 560 s;
    the ascending scan 2 .. 32."""
    from synthetic import facts_study as F

    cap = tmp_path / "capacity" / "pool_N16_width"
    cap.mkdir(parents=True)
    (cap / "meta.json").write_text(json.dumps({"wall_time_s": 100.0}))
    (cap / "result.json").write_text(json.dumps({
        "evaluations": {"N=16 R=2 A=4 emb=frozen d=16 m=8 seed=0": {"accuracy": 1.0, "steps": 1000}},
        "thresholds": [{"subjects": 16, "relations": 2, "attributes": 4, "embeddings": "frozen", "seed": s,
                        "threshold": 8} for s in (0, 1)]}))
    monkeypatch.setattr(F, "PARTS", {
        "pool_N16_width": [], "pool_N64_width": [
            "capacity", "--subjects", "64", "--relations", "2", "--attributes", "4", "--outputs", "attributes",
            "--embeddings", "frozen", "--search", "mlp-width", "--grid", "2", "4", "8", "16", "32", "64", "--steps",
            "100", "--seeds", "2"]})
    text = PE._estimate(tmp_path)
    assert "- `pool_N64_width`: about 0.16 CPU hours on one thread in all (each setting's bisection" in text
    assert "`pool_N16_width`" not in text
    F.PARTS["pool_N64_width"] += ["--scan", "ascending"]  # 2, 4, 8, 16, 32: 62 units, 620 s
    assert "- `pool_N64_width`: about 0.17 CPU hours on one thread in all (each setting's scan" in PE._estimate(
        tmp_path)


def test_the_width_table_sets_the_same_number_of_facts_side_by_side_across_n():
    """Settings with equal N R and A at different N get a row per regime with each N's median m* (a pool A = N is
    left out: it changes with N); a setting never reached shows its own N's grid top."""
    def rec(n, r, a, e, s, t):
        return {"subjects": n, "relations": r, "attributes": a, "embeddings": e, "seed": s, "threshold": t}

    recs = [rec(256, 8, 16, "frozen", s, t) for s, t in ((0, 256), (1, 512))]
    recs += [rec(1024, 2, 16, "frozen", s, 256) for s in (0, 1)]
    recs += [rec(1024, 4, 16, "frozen", 0, None), rec(256, 16, 16, "frozen", 0, 1024)]
    recs += [rec(n, r, n, "frozen", 0, 64) for n, r in ((256, 8), (1024, 2))]  # A = N: no row
    text = P.width_table(recs, {256: 2048, 1024: 8192})
    assert "| 2048 | 16 | frozen | N = 256, R = 8: 384; N = 1024, R = 2: 256 |" in text
    assert "| 4096 | 16 | frozen | N = 256, R = 16: 1024; N = 1024, R = 4: — |" in text
    assert "| 1024 | 4 | 16 | 4096 | > 8192 (—) |" in text and "| 2048 | 256 |" not in text
    assert "resamples the 1-2 seeds of each setting independently" in text  # the scheme, its range of seeds
    assert "below 100 distinct resamples no interval is given" in text


def test_the_mechanism_is_a_curve_over_width_not_a_cutoff():
    """Zero-shot planted to rise with d / (R A) under squared error and to stay flat under cross-entropy: the
    bands carry the means with intervals, and the per-loss Spearman test finds the rise only where it is."""
    rng = np.random.default_rng(0)
    pts = []
    for loss in ("ce", "mse"):
        for ratio in np.exp(rng.uniform(np.log(0.01), np.log(3.0), 60)):
            z = min(1.0, 0.3 * ratio) if loss == "mse" else 0.2 + 0.02 * rng.standard_normal()
            pts.append({"loss": loss, "ratio": float(ratio), "train_accuracy": 1.0, "r2_heldout": 0.5,
                        "zero_shot_accuracy": float(z)})
    text = "\n".join(PM.mechanism_section(pts))
    assert "| squared error | >= 1 |" in text and "| cross-entropy | 0-0.05 |" in text
    mse = re.search(r"squared error, zero-shot: rho \+([\d.]+) .*?Holm ([\d.e-]+)\)", text)
    assert float(mse.group(1)) > 0.95 and float(mse.group(2)) < 0.01
    ce = re.search(r"cross-entropy, zero-shot: rho ([+-][\d.]+) .*?Holm ([\d.e-]+)\)", text)
    assert abs(float(ce.group(1))) < 0.4 and float(ce.group(2)) > 0.05
    assert PM.mechanism_section([]) == []


def test_the_ascending_rescan_is_compared_threshold_by_threshold_and_costed_from_what_it_must_train(tmp_path):
    """The pool page sets each bisection threshold beside the ascending scan's of the same world and seed (k of n
    agree, per N, and a row for each that does not); before the re-scan runs, its cost counts the grid values
    below each first reaching one that the reused runs lack, at the bisection part's time per relation-evaluation."""
    from mechfact.commands.facts import capacity_config
    from mechfact.facts.capacity import _eval_key
    from synthetic.facts_study import part_command

    src = tmp_path / "src"
    a = part_command("pool_N256")
    base = src / "capacity" / "pool_N256"
    base.mkdir(parents=True)
    (base / "config.json").write_text(json.dumps({"kind": "facts.capacity", "config": capacity_config(a).to_dict(),
                                                  "seed": 0}))
    evs = {_eval_key(256, r, "trainable", 3, 64, s, A): {"accuracy": 1.0, "steps": 500, "stopped": "target"}
           for A in (16, 64, 256) for r in (2, 4, 8, 16) for s in range(5)}
    (base / "result.json").write_text(json.dumps({"thresholds": [], "evaluations": evs}))
    (base / "meta.json").write_text(json.dumps({"wall_time_s": 1800.0, "device": "cpu"}))
    # d = 1 and 2 untried in every (A, R, seed): 2 x (2 + 4 + 8 + 16) x 3 pools x 5 seeds = 900 relation-evaluations,
    # at 1800 s over the 450 relation-evaluations of pool_N256 = 4 s each
    assert "- `pool_N256_asc`: at most 1.0 CPU hours on one thread (900 relation-evaluations to train, at the 4.0 s " \
           "each of pool_N256)" in PE._estimate(src)
    rec = {"subjects": 256, "attributes": 16, "embeddings": "trainable", "searched": "d", "mlp_width": 64}
    bis = [{**rec, "relations": r, "seed": s, "threshold": t} for r, s, t in ((2, 0, 3), (2, 1, 3), (4, 0, 8))]
    asc = src / "capacity" / "pool_N256_asc"
    asc.mkdir()
    (asc / "result.json").write_text(json.dumps({"thresholds": [{**bis[0]}, {**bis[1]}, {**bis[2], "threshold": 5},
                                                               {**rec, "relations": 8, "seed": 0, "threshold": 9}]}))
    text = "\n".join(P._scan_section(src, bis))
    assert "2 of 3 thresholds agree (N = 256: 2 of 3)." in text
    assert "| 256 | 4 | 16 | 0 | 8 | 5 |" in text and "| 256 | 2 | 16 |" not in text
    assert P._scan_section(tmp_path / "empty", bis) == []
