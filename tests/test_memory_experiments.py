"""Experiment-level tests: resume, determinism, and the paper's claims at small scale."""

import json

import numpy as np
import pytest
import torch

from mechfact.executor import LocalExecutor
from mechfact.memory import experiments as ex
from mechfact.memory import theory
from mechfact.memory.solvers import MemoryTrainConfig

CPU = torch.device("cpu")
REAL_SOLVE = ex.solve


class Killed(Exception):
    """Stands in for the process being killed."""


class _StopAfter(LocalExecutor):
    """Runs n jobs, then simulates a kill."""

    def __init__(self, n):
        super().__init__(progress=False)
        self.n = n

    def map(self, jobs, on_result):
        for i, job in enumerate(jobs):
            if i == self.n:
                raise Killed
            on_result(job, job.fn())


def _count_solves(monkeypatch):
    calls = []
    real = REAL_SOLVE

    def counting(problems, s, device):
        calls.append([(p.d, p.p, p.seed) for p in problems])
        return real(problems, s, device)

    monkeypatch.setattr(ex, "solve", counting)
    return calls


def test_sweep_killed_half_way_resumes_without_recomputing(tmp_path, monkeypatch):
    cfg = ex.SweepConfig(d=[8, 10], alpha_min=0.1, alpha_max=1.0, points=3, seeds=2,
                         solver=ex.SolverConfig(method="trained", train=MemoryTrainConfig(steps=300)))
    out = tmp_path / "sweep"
    with pytest.raises(Killed):
        ex.run_sweep(cfg, out, device=CPU, executor=_StopAfter(2))
    partial = json.loads((out / "result.json").read_text())["points"]
    assert len(partial) == 4  # 2 jobs x 2 seeds were written as they finished
    calls = _count_solves(monkeypatch)
    final = ex.run_sweep(cfg, out, device=CPU, executor=LocalExecutor(progress=False))
    done_before = {(r["d"], r["p"], r["seed"]) for r in partial}
    recomputed = {k for c in calls for k in c}
    assert not (recomputed & done_before)  # nothing already written was recomputed
    assert len(final["points"]) == 12
    # and the resumed file equals an uninterrupted run
    fresh = ex.run_sweep(cfg, tmp_path / "fresh", device=CPU, executor=LocalExecutor(progress=False))
    assert final["points"] == fresh["points"]
    calls.clear()
    ex.run_sweep(cfg, out, device=CPU, executor=LocalExecutor(progress=False))
    assert calls == []  # complete: a rerun computes nothing


def test_sweep_points_schema(tmp_path):
    cfg = ex.SweepConfig(d=[8], alpha_min=0.1, alpha_max=0.6, points=2, seeds=1,
                         solver=ex.SolverConfig(method="hebb", problem="decoupled"))
    res = ex.run_sweep(cfg, tmp_path, device=CPU, executor=LocalExecutor(progress=False))
    assert set(res["points"][0]) == {"d", "p", "alpha", "seed", "method", "problem", "kappa", "accuracy"}
    for f in ("config.json", "meta.json", "result.json", "fig_accuracy.png"):
        assert (tmp_path / f).exists()
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert {"versions", "git_sha", "device", "seed", "wall_time_s"} <= set(meta)


def test_capacity_result_is_deterministic_and_resumes(tmp_path, monkeypatch):
    cfg = ex.CapacityConfig(d=[10], seeds=2, solver=ex.SolverConfig(train=MemoryTrainConfig(steps=800, patience=300)))
    ex.run_capacity(cfg, tmp_path / "a", device=CPU, executor=LocalExecutor(progress=False))
    ex.run_capacity(cfg, tmp_path / "b", device=CPU, executor=LocalExecutor(progress=False))
    a = (tmp_path / "a" / "result.json").read_bytes()
    assert a == (tmp_path / "b" / "result.json").read_bytes()
    res = json.loads(a)
    assert set(res["capacity"][0]) >= {"d", "method", "problem", "kappa", "seed", "p_c", "alpha_c"}
    assert set(res["summary"][0]) >= {"d", "method", "problem", "kappa", "alpha_c_median", "alpha_c_q25", "alpha_c_q75"}
    calls = _count_solves(monkeypatch)
    ex.run_capacity(cfg, tmp_path / "a", device=CPU, executor=LocalExecutor(progress=False))
    assert calls == []


def _dying_after(n: int, monkeypatch) -> list[int]:
    """The solver killed after ``n`` evaluations; the p of each evaluation that finished."""
    n_evals = []

    def dying(problems, s, device):
        if len(n_evals) == n:
            raise Killed
        n_evals.append(problems[0].p)
        return REAL_SOLVE(problems, s, device)

    monkeypatch.setattr(ex, "solve", dying)
    return n_evals


def test_capacity_mid_search_resume_uses_memo(tmp_path, monkeypatch):
    """Killing a bisection half-way keeps every finished evaluation."""
    cfg = ex.CapacityConfig(d=[10], seeds=1, solver=ex.SolverConfig(method="hebb"))
    n_evals = _dying_after(3, monkeypatch)
    with pytest.raises(Killed):
        ex.run_capacity(cfg, tmp_path, device=CPU, executor=LocalExecutor(progress=False))
    memo = json.loads((tmp_path / "result.json").read_text())["evaluations"]
    assert len(memo) == 3
    calls = _count_solves(monkeypatch)
    ex.run_capacity(cfg, tmp_path, device=CPU, executor=LocalExecutor(progress=False))
    assert not ({p for c in calls for (_, p, _) in c} & set(n_evals))


def test_a_capacity_search_stopped_in_a_ray_task_resumes_from_its_spill_file(tmp_path, monkeypatch):
    """A search running outside the driver (a Ray task) keeps its evaluations in its spill file after every round:
    stopped half-way, the next run of the folder takes them (they are not solved again), gives the result of an
    uninterrupted run byte for byte, and leaves no spill file behind."""
    from mechfact import executor as E

    class Remote:
        in_process = False

    cfg = ex.CapacityConfig(d=[10], seeds=1, solver=ex.SolverConfig(method="hebb"))
    ex.run_capacity(cfg, tmp_path / "whole", device=CPU, executor=LocalExecutor(progress=False))
    n_evals = _dying_after(3, monkeypatch)
    run = tmp_path / "run"
    job = ex._search_job(10, [0], cfg.solver, cfg, CPU, {}, Remote(), spill=E.spill_file(run, "d=10"))
    with pytest.raises(Killed):
        job()
    assert sorted(E.read_spills(run)) == sorted(f"10,0,{p}" for p in n_evals)
    calls = _count_solves(monkeypatch)
    ex.run_capacity(cfg, run, device=CPU, executor=LocalExecutor(progress=False))
    assert calls and not ({p for c in calls for (_, p, _) in c} & set(n_evals))
    assert not (run / E.SPILLS).exists()
    assert (run / "result.json").read_bytes() == (tmp_path / "whole" / "result.json").read_bytes()


# ---- the paper's claims, at small scale ----------------------------------------------------

FAST_TRAIN = MemoryTrainConfig(steps=2000, patience=300)


def _capacity(tmp_path, name, d, seeds, **solver):
    solver.setdefault("train", FAST_TRAIN)
    cfg = ex.CapacityConfig(d=d, seeds=seeds, solver=ex.SolverConfig(**solver), rel_tol=0.03, alpha_lo=0.3)
    return ex.run_capacity(cfg, tmp_path / name, device=CPU, executor=LocalExecutor(progress=False))


def test_claim_trained_capacity_above_half_and_hebb_below_eighth(tmp_path):
    trained = _capacity(tmp_path, "t", [16], 3, method="trained")
    hebb = _capacity(tmp_path, "h", [32], 5, method="hebb")
    # finite size: the optimum's apparent capacity is well above 1/2 (paper: O(1/log p) drift down)
    assert trained["summary"][0]["alpha_c_median"] > 0.6
    # Hebb fails far earlier, below its asymptotic 1/8 at small d
    assert hebb["summary"][0]["alpha_c_median"] < theory.ALPHA_HEBB
    assert trained["summary"][0]["alpha_c_median"] > 4 * hebb["summary"][0]["alpha_c_median"]


@pytest.mark.slow  # seconds of training: the slow tier keeps the fast one under 5 minutes
def test_claim_decoupled_matches_original(tmp_path):
    op = _capacity(tmp_path, "op", [16], 3, method="trained", problem="original")
    dp = _capacity(tmp_path, "dp", [16], 3, method="trained", problem="decoupled")
    a, b = op["summary"][0]["alpha_c_median"], dp["summary"][0]["alpha_c_median"]
    assert abs(a - b) / a < 0.15


def test_claim_scores_mechanism(tmp_path):
    res = ex.run_scores(ex.ScoresConfig(d=32, alpha=0.5), tmp_path, device=CPU)
    h, t = res["summary"]["hebb"], res["summary"]["trained"]
    assert t["accuracy"] == 1.0 and h["accuracy"] < 1.0
    # trained targets: low spread, just above the per-input max competitor (small positive margin)
    assert t["z_target_std"] < 0.5 * h["z_target_std"]
    assert t["z_margin_min"] > 0
    assert 0 < t["z_margin_mean"] < 1.0
    # Hebb's targets straddle the competitors' tail: some fall below the max competitor
    assert h["z_margin_min"] < 0
    assert (tmp_path / "fig_scores.png").exists()


def test_fit_extrapolation_recovers_known_line():
    caps = [{"d": p // 10, "p_c": p, "alpha_c": 0.5 + 2.0 / np.log(p)} for p in (50, 100, 400, 1600)]
    fit = ex.fit_extrapolation(caps)
    assert fit["alpha_inf"] == pytest.approx(0.5, abs=1e-9)
    assert fit["slope"] == pytest.approx(2.0, abs=1e-9)
    one_d = [dict(c, d=32) for c in caps]
    assert ex.fit_extrapolation(one_d)["alpha_inf"] is None  # seed spread at one d is not a size trend


def test_spectrum_op_matches_dp_and_quarter_circle(tmp_path):
    cfg = ex.SpectrumConfig(d=32, alpha=0.7, seeds=3, train=MemoryTrainConfig(early_stop=False, steps=400))
    res = ex.run_spectrum(cfg, tmp_path, device=CPU)
    assert res["accuracy"]["trained_original"] == 1.0 and res["accuracy"]["trained_decoupled"] == 1.0
    n = 3 * 32
    crit = 1.63 / np.sqrt(n)  # KS 1% critical value for one sample of n
    assert res["ks_op_vs_dp"] < 1.63 * np.sqrt(2 / n)  # OP and DP spectra: same law
    assert res["ks_to_theory"]["trained_original"] < crit
    assert res["ks_to_theory"]["trained_decoupled"] < crit
    # a wrong law is rejected by the same test: a rank-1-dominated matrix is far from the quarter circle
    from mechfact.memory.analysis import spectrum_summary
    bad = spectrum_summary({"x": [np.diag(np.r_[10.0, np.ones(31)])]})
    assert bad["ks_to_theory"]["x"] > crit


@pytest.mark.slow  # seconds of training: the slow tier keeps the fast one under 5 minutes
def test_rank_capacity_monotone_in_kappa(tmp_path):
    cfg = ex.RankConfig(d=[16], kappas=[0.25, 0.5, 1.0], seeds=2, train=MemoryTrainConfig(steps=1500, patience=300), rel_tol=0.04)
    res = ex.run_rank(cfg, tmp_path, device=CPU, executor=LocalExecutor(progress=False))
    med = {s["kappa"]: s["alpha_c_median"] for s in res["summary"]}
    assert med[0.25] < med[0.5] < med[1.0]
    assert (tmp_path / "fig_rank.png").exists()


# ---- configs: validated when built from Python, dict round-trip ----------------------------

@pytest.mark.parametrize("build, match", [
    (lambda: ex.SweepConfig(d=[0]), "--d 0"),
    (lambda: ex.SweepConfig(d=[16, -3]), "--d -3"),
    (lambda: ex.SweepConfig(seeds=0), "--seeds 0"),
    (lambda: ex.SweepConfig(alpha_min=1.0, alpha_max=0.5), "--alpha-min 1.0"),
    (lambda: ex.SweepConfig(alpha_max=float("nan")), "--alpha-max nan"),
    (lambda: ex.SweepConfig(points=1), "--points 1"),
    (lambda: ex.CapacityConfig(rel_tol=0.7), "--rel-tol 0.7"),
    (lambda: ex.CapacityConfig(alpha_hi=float("inf")), "--alpha-hi inf"),
    (lambda: ex.SolverConfig(kappa=1.5), "--kappa 1.5"),
    (lambda: ex.SolverConfig(kappa=float("nan")), "--kappa nan"),
    (lambda: ex.SolverConfig(method="separable", kappa=0.5), "--kappa 0.5"),
    (lambda: ex.SolverConfig(method="magic"), "--method magic"),
    (lambda: ex.SolverConfig(problem="shared"), "--problem shared"),
    (lambda: ex.ScoresConfig(d=0), "--d 0"),
    (lambda: ex.ScoresConfig(alpha=float("nan")), "--alpha nan"),
    (lambda: ex.SpectrumConfig(seeds=0), "--seeds 0"),
    (lambda: ex.RankConfig(kappas=[0.5, 0.0]), "--kappas 0.0"),
    (lambda: ex.RankConfig(kappas=[float("inf")]), "--kappas inf"),
    (lambda: MemoryTrainConfig(steps=0), "--steps 0"),
    (lambda: MemoryTrainConfig(lr=float("nan")), "--lr nan"),
    (lambda: MemoryTrainConfig(lr=0.0), "--lr 0.0"),
    (lambda: MemoryTrainConfig(loss="mse"), "--loss mse"),
    (lambda: MemoryTrainConfig(patience=-1), "--patience -1"),
    (lambda: MemoryTrainConfig(active_set=-2), "--active-set -2"),
    (lambda: MemoryTrainConfig(refresh=0), "--refresh 0"),
    (lambda: MemoryTrainConfig(init_scale=0.0), "--init-scale 0.0"),
    (lambda: MemoryTrainConfig(margin=float("inf")), "--margin inf"),
    (lambda: MemoryTrainConfig(dp_memory_gb=0), "--dp-memory-gb 0"),
])
def test_memory_configs_refuse_bad_values_from_python(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_memory_config_needs_a_memory_train_config():
    from mechfact.facts.train import TrainConfig as FactsTrainConfig

    with pytest.raises(ValueError, match="expected a MemoryTrainConfig"):
        ex.SolverConfig(train=FactsTrainConfig())


def test_capacity_config_dict_round_trip():
    cfg = ex.CapacityConfig(d=[12, 16], seeds=2, rel_tol=0.03, alpha_lo=0.3,
                            solver=ex.SolverConfig(method="separable", problem="decoupled",
                                                   train=MemoryTrainConfig(steps=700, loss="hinge2", active_set=8)))
    d = cfg.to_dict()
    assert d["solver"]["train"]["steps"] == 700
    back = ex.CapacityConfig.from_dict(json.loads(json.dumps(d)))
    assert back == cfg
    assert isinstance(back.solver, ex.SolverConfig) and isinstance(back.solver.train, MemoryTrainConfig)
    with pytest.raises(ValueError, match="unknown MemoryTrainConfig keys"):
        ex.CapacityConfig.from_dict({**d, "solver": {**d["solver"], "train": {"max_steps": 10}}})
    with pytest.raises(ValueError, match="--steps 0"):  # a bad nested value is refused too
        ex.CapacityConfig.from_dict({**d, "solver": {**d["solver"], "train": {"steps": 0}}})


def test_run_dir_config_is_the_config_itself(tmp_path):
    cfg = ex.SweepConfig(d=[8], alpha_min=0.1, alpha_max=0.6, points=2, seeds=1, solver=ex.SolverConfig(method="hebb"))
    ex.run_sweep(cfg, tmp_path, device=CPU, seed=3, executor=LocalExecutor(progress=False))
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["kind"] == "memory.sweep" and saved["seed"] == 3
    assert ex.SweepConfig.from_dict(saved["config"]) == cfg
