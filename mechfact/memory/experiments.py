"""Linear-memory experiments: accuracy sweeps, capacity, scores, spectra, rank.

Each experiment is a typed config plus ``run_*(cfg, out, ...)`` that writes a
standard run directory (config.json first, result.json as it goes, meta.json,
fig_*.png drawn from result.json). Sweeps are lists of independent jobs run
through an executor; finished work is recorded in result.json and skipped when
the same ``--out`` is used again.

The load searches live here: accuracy sweeps, capacity by bisection and the rank constraint, every batch of
problems solved through :func:`solve`. The experiments on the W of one load (scores, spectra) are in
:mod:`mechfact.memory.mechanism`; the solver config and the checks every config shares, in
:mod:`mechfact.memory.solving`. Every experiment's names are importable from here.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from ..config import DictConfig, bad, check_choice, check_int, check_type
from ..executor import (Executor, Job, LocalExecutor, clear_spills, memo_job, merge_evaluations, read_spill, spill_file,
                        spills_here)
from ..runs import RunDir
from . import theory
from .mechanism import ScoresConfig, SpectrumConfig, run_scores, run_spectrum
from .problems import PROBLEMS, MemoryProblem, load, p_for_alpha
from .solvers import MemoryTrainConfig
from .solving import (MAX_POINTS, MAX_SEED, SEPARABLE_MAX_P, SolverConfig, _check_alpha_range, _check_ds, _check_kappa,
                      _check_memory, _check_rel_tol, _check_seeds, _check_separable_size, _check_top_load, _precheck,
                      _solver_bytes, solve)

logger = logging.getLogger(__name__)

__all__ = ["SolverConfig", "solve", "MAX_POINTS", "SEPARABLE_MAX_P", "MAX_SEED", "SweepConfig", "run_sweep",
           "CapacityConfig", "capacity_search", "summarise_capacity", "fit_extrapolation", "run_capacity",
           "ScoresConfig", "run_scores", "SpectrumConfig", "run_spectrum", "RankConfig", "run_rank"]


# ---- accuracy sweep --------------------------------------------------------------------

@dataclass
class SweepConfig(DictConfig):
    d: list[int] = field(default_factory=lambda: [32, 64])  # dimensions
    alpha_min: float = 0.05  # smallest load p ln p / d^2
    alpha_max: float = 1.2  # largest load
    points: int = 12  # loads per d (evenly spaced)
    seeds: int = 3  # independent instances per point
    solver: SolverConfig = field(default_factory=SolverConfig)

    def __post_init__(self) -> None:
        self.d = _check_alpha_range(self, "alpha_min", "alpha_max")
        check_int("points", self.points, 2, MAX_POINTS)
        _check_separable_size(self.solver, self.d, "alpha_max", self.alpha_max)

    def check_cost(self) -> None:
        """Refuse (one line) a sweep whose largest load cannot fit in memory; the solver's own size limits."""
        _check_top_load(self.solver, self.d, "alpha_max", self.alpha_max, self.seeds)


def run_sweep(cfg: SweepConfig, out: str | Path, *, device: torch.device, seed: int = 0,
              executor: Executor | None = None) -> dict:
    from . import plots

    _precheck(cfg, seed)  # before the run directory: a refused run writes nothing
    run = RunDir(out, cfg, kind="memory.sweep", seed=seed, device=str(device))
    result = run.read_result({"points": []}, shape={"points": [{"d": 0, "p": 0, "seed": 0}]})
    done = {(r["d"], r["p"], r["seed"]) for r in result["points"]}
    s = cfg.solver
    jobs = []
    for d in cfg.d:
        ps = sorted({p_for_alpha(a, d) for a in np.linspace(cfg.alpha_min, cfg.alpha_max, cfg.points)})
        for p in ps:
            todo = [seed + k for k in range(cfg.seeds) if (d, p, seed + k) not in done]
            if not todo:
                continue

            def fn(d=d, p=p, todo=todo):
                probs = [MemoryProblem(s.problem, d, p, sd) for sd in todo]
                recs = solve(probs, s, device)
                return [{"d": d, "p": p, "alpha": load(p, d), "seed": pr.seed, "method": s.method,
                         "problem": s.problem, "kappa": s.kappa, "accuracy": r["accuracy"],
                         **({"separable": r["separable"]} if "separable" in r else {})}
                        for pr, r in zip(probs, recs)]
            jobs.append(Job(key=f"d={d} p={p}", fn=fn, cost=p * p * d / 1e6))

    def on_result(job: Job, recs: list[dict]) -> None:
        result["points"].extend(recs)
        result["points"].sort(key=lambda r: (r["d"], r["p"], r["seed"]))
        run.write_result(result)

    (executor or LocalExecutor(desc="memory sweep")).map(jobs, on_result)
    return run.finish(result, plots.plot_sweep, "fig_accuracy.png", n_jobs_run=len(jobs))


# ---- capacity by bisection ----------------------------------------------------------------

@dataclass
class CapacityConfig(DictConfig):
    d: list[int] = field(default_factory=lambda: [24, 32, 48, 64])
    seeds: int = 5
    solver: SolverConfig = field(default_factory=SolverConfig)
    alpha_lo: float = 0.02  # starting lower bracket (must recall perfectly)
    alpha_hi: float = 1.5  # starting upper bracket (doubled while it still recalls)
    rel_tol: float = 0.01  # stop bisecting when hi - lo <= max(1, rel_tol * lo): p_c resolved to ~1%

    def __post_init__(self) -> None:
        self.d = _check_alpha_range(self, "alpha_lo", "alpha_hi")
        _check_rel_tol(self.rel_tol)
        _check_separable_size(self.solver, self.d, "alpha_hi", self.alpha_hi)

    def check_cost(self) -> None:
        """Refuse (one line) a search whose upper bracket cannot fit in memory (every seed of a d is trained at
        once)."""
        _check_top_load(self.solver, self.d, "alpha_hi", self.alpha_hi, self.seeds)


def _bisect_round(states: list[dict], rel_tol: float = 0.0) -> list[tuple[int, int]]:
    """Next (state index, p) to evaluate for every unfinished bisection."""
    todo = []
    for i, st in enumerate(states):
        if st["lo"] is None:
            todo.append((i, st["p_lo0"]))
        elif st["hi"] is None:
            todo.append((i, st["p_hi0"]))
        elif st["hi"] - st["lo"] > max(1, int(rel_tol * st["lo"])):
            todo.append((i, (st["lo"] + st["hi"]) // 2))
    return todo


def capacity_search(d: int, seeds: list[int], s: SolverConfig, cfg: CapacityConfig, device: torch.device,
                    memo: dict[str, bool], on_eval=None) -> list[dict]:
    """Largest p with perfect recall per seed, by lockstep bisection over nested instances.

    ``memo`` maps "d,seed,p" -> recalled-all, so an interrupted search resumes
    without recomputing; ``on_eval`` is called after each round to persist it.
    """
    states = [{"seed": sd, "lo": None, "hi": None, "p_lo0": max(2, p_for_alpha(cfg.alpha_lo, d)),
               "p_hi0": p_for_alpha(cfg.alpha_hi, d)} for sd in seeds]
    while True:
        todo = _bisect_round(states, cfg.rel_tol)
        if not todo:
            break
        need = [(i, p) for i, p in todo if f"{d},{states[i]['seed']},{p}" not in memo]
        if need:
            probs = [MemoryProblem(s.problem, d, p, states[i]["seed"]) for i, p in need]
            # batch problems of similar size together (padding waste stays small)
            for rec, (i, p) in zip(solve(probs, s, device), need):
                memo[f"{d},{states[i]['seed']},{p}"] = bool(rec["accuracy"] >= 1.0)
            if on_eval:
                on_eval()
        for i, p in todo:
            ok = memo[f"{d},{states[i]['seed']},{p}"]
            st = states[i]
            if st["lo"] is None:
                if ok:
                    st["lo"] = p
                else:  # even the low bracket fails: shrink it
                    st["p_hi0"], st["hi"] = p, p
                    st["p_lo0"] = max(2, p // 2)
                    if p <= 2:
                        st["lo"] = 1
            elif st["hi"] is None:
                if ok:
                    st["lo"], st["p_hi0"] = p, 2 * p
                else:
                    st["hi"] = p
            else:
                st["lo" if ok else "hi"] = p
    out = []
    for st in states:
        p_c = st["lo"]
        out.append({"d": d, "method": s.method, "problem": s.problem, "kappa": s.kappa, "seed": st["seed"],
                    "p_c": p_c, "alpha_c": load(p_c, d) if p_c >= 2 else 0.0})
    return out


def summarise_capacity(caps: list[dict]) -> tuple[list[dict], dict]:
    """Per-d quartiles and a fit alpha_c = a + b / ln p_c extrapolated to infinite size."""
    summary = []
    for key in sorted({(c["d"], c["method"], c["problem"], c["kappa"]) for c in caps}):
        a = np.array([c["alpha_c"] for c in caps if (c["d"], c["method"], c["problem"], c["kappa"]) == key])
        summary.append({"d": key[0], "method": key[1], "problem": key[2], "kappa": key[3],
                        "alpha_c_median": float(np.median(a)), "alpha_c_q25": float(np.quantile(a, 0.25)),
                        "alpha_c_q75": float(np.quantile(a, 0.75)), "n_seeds": int(len(a))})
    fit = fit_extrapolation(caps)
    return summary, fit


def fit_extrapolation(caps: list[dict]) -> dict:
    """Least squares alpha_c = a + b x with x = 1 / ln p_c; a is the infinite-size value.

    Needs at least two distinct d: within one d, the spread of p_c is seed noise, not size.
    """
    pts = [(1 / math.log(c["p_c"]), c["alpha_c"]) for c in caps if c["p_c"] >= 3]
    if len({c.get("d") for c in caps}) < 2 or len({round(x, 12) for x, _ in pts}) < 2:
        return {"alpha_inf": None, "alpha_inf_se": None, "slope": None, "n": len(pts)}
    x, y = np.array(pts).T
    r = stats.linregress(x, y)
    return {"alpha_inf": float(r.intercept), "alpha_inf_se": float(r.intercept_stderr),
            "slope": float(r.slope), "slope_se": float(r.stderr), "n": len(pts),
            "ci95": [float(r.intercept - 1.96 * r.intercept_stderr), float(r.intercept + 1.96 * r.intercept_stderr)]}


def _search_job(d: int, seeds: list[int], s: SolverConfig, cfg: CapacityConfig, device: torch.device,
                memo: dict[str, bool], executor: Executor, on_eval=None, spill=None):
    """One capacity search as a job (:func:`mechfact.executor.memo_job`; the memo saved after every round: in the
    run's result.json in this process, in ``spill`` from a Ray task)."""
    prefixes = tuple(f"{d},{sd}," for sd in seeds)
    return memo_job(executor, lambda m, ev: capacity_search(d, seeds, s, cfg, device, m, on_eval=ev), memo,
                    lambda k: k.startswith(prefixes), "records", on_eval, spill)


def _spilled_job(run, key: str, memo: dict, spills: bool) -> Path | None:
    """A search job's spill file where its tasks write one (:func:`mechfact.executor.spills_here`), after folding
    into ``memo`` what an earlier, stopped task of the same job kept there."""
    for k, v in read_spill(run.path, key).items():
        memo.setdefault(k, v)
    return spill_file(run.path, key) if spills else None


def _merge_evaluations(memo: dict, out: dict) -> list[dict]:
    """Fold a search job's evaluations into the memo (key order, whatever the completion order); its records."""
    merge_evaluations(memo, out["evaluations"])
    return out["records"]


def run_capacity(cfg: CapacityConfig, out: str | Path, *, device: torch.device, seed: int = 0,
                 executor: Executor | None = None) -> dict:
    from . import plots

    _precheck(cfg, seed)  # before the run directory: a refused run writes nothing
    run = RunDir(out, cfg, kind="memory.capacity", seed=seed, device=str(device))
    result = run.read_result({"capacity": [], "summary": [], "evaluations": {}})
    memo: dict[str, bool] = result.setdefault("evaluations", {})
    done = {(c["d"], c["seed"]) for c in result["capacity"]}
    s = cfg.solver
    executor = executor or LocalExecutor(desc="memory capacity")
    spills = spills_here(executor)
    jobs = []
    for d in cfg.d:
        todo = [seed + k for k in range(cfg.seeds) if (d, seed + k) not in done]
        if todo:
            spill = _spilled_job(run, f"d={d}", memo, spills)
            jobs.append(Job(key=f"d={d}", cost=d**3 / 1e3, fn=_search_job(
                d, todo, s, cfg, device, memo, executor, on_eval=lambda: run.write_result(result), spill=spill)))

    def on_result(job: Job, out: dict) -> None:
        recs = _merge_evaluations(memo, out)
        result["capacity"].extend(recs)
        result["capacity"].sort(key=lambda r: (r["d"], r["seed"]))
        result["summary"], result["extrapolation"] = summarise_capacity(result["capacity"])
        run.write_result(result)
        spill_file(run.path, job.key).unlink(missing_ok=True)  # its evaluations are in result.json now

    executor.map(jobs, on_result)
    clear_spills(run.path)
    if result["capacity"]:
        result["summary"], result["extrapolation"] = summarise_capacity(result["capacity"])
    return run.finish(result, plots.plot_capacity, "fig_capacity.png", n_jobs_run=len(jobs))



# ---- rank constraint --------------------------------------------------------------------------

@dataclass
class RankConfig(DictConfig):
    d: list[int] = field(default_factory=lambda: [24, 32])
    kappas: list[float] = field(default_factory=lambda: [0.25, 0.5, 0.75, 1.0])
    seeds: int = 3
    problem: str = "original"
    train: MemoryTrainConfig = field(default_factory=MemoryTrainConfig)
    rel_tol: float = 0.01  # bisection resolution on p_c (see CapacityConfig)

    def __post_init__(self) -> None:
        self.d = _check_ds(self.d)
        if isinstance(self.kappas, (str, bytes)) or not isinstance(self.kappas, (list, tuple)) or not self.kappas:
            raise bad("kappas", self.kappas, "must be a non-empty list of rank fractions in (0, 1]")
        self.kappas = list(self.kappas)
        for k in self.kappas:
            _check_kappa("kappas", k)
        _check_seeds(self.seeds)
        check_choice("problem", self.problem, PROBLEMS)
        check_type("train", self.train, MemoryTrainConfig)
        _check_rel_tol(self.rel_tol)

    def check_cost(self) -> None:
        """Each (kappa, d) is a capacity search from the default upper bracket, all seeds trained at once."""
        hi = CapacityConfig.alpha_hi
        rows = []
        for kappa in self.kappas:
            s = SolverConfig(problem=self.problem, kappa=kappa, train=self.train)
            rows += [(_solver_bytes(s, d, p_for_alpha(hi, d), self.seeds), f"--d {d} --seeds {self.seeds}", d,
                      p_for_alpha(hi, d), self.seeds) for d in self.d]
        _check_memory(rows, SolverConfig(problem=self.problem, train=self.train))


def run_rank(cfg: RankConfig, out: str | Path, *, device: torch.device, seed: int = 0,
             executor: Executor | None = None) -> dict:
    from . import plots

    _precheck(cfg, seed)  # before the run directory: a refused run writes nothing
    run = RunDir(out, cfg, kind="memory.rank", seed=seed, device=str(device))
    result = run.read_result({"capacity": [], "summary": [], "evaluations": {}})
    done = {(c["d"], c["kappa"], c["seed"]) for c in result["capacity"]}
    executor = executor or LocalExecutor(desc="memory rank")
    spills = spills_here(executor)
    jobs, memos = [], {}
    for kappa in cfg.kappas:
        s = SolverConfig(method="trained", problem=cfg.problem, kappa=kappa, train=cfg.train)
        ccfg = CapacityConfig(d=cfg.d, seeds=cfg.seeds, solver=s, rel_tol=cfg.rel_tol)
        memo = result["evaluations"].setdefault(str(kappa), {})
        for d in cfg.d:
            todo = [seed + k for k in range(cfg.seeds) if (d, kappa, seed + k) not in done]
            if todo:
                key = f"kappa={kappa} d={d}"
                memos[key] = memo
                spill = _spilled_job(run, key, memo, spills)
                jobs.append(Job(key=key, cost=kappa * d**3 / 1e3, fn=_search_job(
                    d, todo, s, ccfg, device, memo, executor, on_eval=lambda: run.write_result(result),
                    spill=spill)))

    def on_result(job: Job, out: dict) -> None:
        recs = _merge_evaluations(memos[job.key], out) if out else []
        result["capacity"].extend(recs)
        result["capacity"].sort(key=lambda r: (r["kappa"], r["d"], r["seed"]))
        result["summary"], _ = summarise_capacity(result["capacity"])
        result["theory"] = [{"kappa": k, "alpha_c_dof": theory.alpha_c_rank_dof(k),
                             "alpha_c_energy": theory.alpha_c_rank_energy(k)} for k in cfg.kappas]
        run.write_result(result)
        if out:
            spill_file(run.path, job.key).unlink(missing_ok=True)

    executor.map(jobs, on_result)
    clear_spills(run.path)
    if result["capacity"]:
        on_result(Job("final", lambda: None), {})
    return run.finish(result, plots.plot_rank, "fig_rank.png", n_jobs_run=len(jobs))
