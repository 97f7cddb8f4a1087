"""Linear-memory experiments: accuracy sweeps, capacity, scores, spectra, rank.

Each experiment is a typed config plus ``run_*(cfg, out, ...)`` that writes a
standard run directory (config.json first, result.json as it goes, meta.json,
fig_*.png drawn from result.json). Sweeps are lists of independent jobs run
through an executor; finished work is recorded in result.json and skipped when
the same ``--out`` is used again.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from ..config import DictConfig, bad, check_choice, check_float, check_int, check_type, flag
from ..executor import Executor, Job, LocalExecutor, memo_job, merge_evaluations
from ..limits import check_memory
from ..runs import RunDir
from . import analysis, solvers, theory
from .problems import PROBLEMS, MemoryProblem, load, p_for_alpha
from .solvers import METHODS, MemoryTrainConfig, hebb_bytes, train_bytes

logger = logging.getLogger(__name__)


# ---- validation (run by every config's __post_init__) ------------------------------

def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_d(d) -> None:
    if not _is_int(d) or d <= 0:
        raise bad("d", d, "must be a positive integer")


def _check_ds(ds) -> list[int]:
    if isinstance(ds, (str, bytes)) or not isinstance(ds, (list, tuple)) or not ds:
        raise bad("d", ds, "must be a non-empty list of positive integers")
    for d in ds:
        _check_d(d)
    return list(ds)


def _check_seeds(seeds) -> None:
    if not _is_int(seeds) or seeds < 1:
        raise bad("seeds", seeds, "must be at least 1")


def _check_num(field_: str, value) -> None:
    """A finite real number (not a string or bool); NaN and inf are refused, naming the flag."""
    if isinstance(value, (str, bytes, bool)):
        raise bad(field_, repr(value), "must be a number")
    check_float(field_, value)


def _check_kappa(field_: str, kappa) -> None:
    _check_num(field_, kappa)
    check_float(field_, kappa, lo=0, hi=1, lo_open=True)


def _check_positive(field_: str, value) -> None:
    _check_num(field_, value)
    if value <= 0:
        raise bad(field_, value, "must be positive")


def _check_rel_tol(rel_tol) -> None:
    _check_num("rel_tol", rel_tol)
    if not (0 <= rel_tol < 0.5):
        raise bad("rel_tol", rel_tol, "must lie in [0, 0.5)")


def _check_alpha_range(cfg, lo: str, hi: str) -> list[int]:
    """The checks of a search over loads (sweep, capacity): d values, seeds, solver, 0 < lo < hi. Returns d."""
    ds = _check_ds(cfg.d)
    _check_seeds(cfg.seeds)
    check_type("solver", cfg.solver, SolverConfig)
    a, b = getattr(cfg, lo), getattr(cfg, hi)
    _check_num(lo, a)
    _check_num(hi, b)
    if not (0 < a < b):
        raise ValueError(f"{flag(lo)} {a} / {flag(hi)} {b}: need 0 < {flag(lo)[2:]} < {flag(hi)[2:]}")
    return ds


MAX_POINTS = 10_000  # loads per d of a sweep
SEPARABLE_MAX_P = 5000  # the exact LP's limit (solvers.separable)


def _check_separable_size(s, ds: list[int], field_: str, alpha: float) -> None:
    """The exact LP of ``--method separable`` handles at most SEPARABLE_MAX_P associations: refuse up front."""
    if s.method != "separable":
        return
    for d in ds:
        p = p_for_alpha(alpha, d)
        if p > SEPARABLE_MAX_P:
            raise ValueError(f"--method separable with --d {d} {flag(field_)} {alpha:g}: p = {p} associations, over the "
                             f"exact LP's limit of {SEPARABLE_MAX_P}; use a smaller --d or {flag(field_)}")


MAX_SEED = 2**40  # seeds seed, seed + 1, ... also seed each W's initialisation: an int64 (seed * 7919 + ...)


def _precheck(cfg, seed: int) -> None:
    """What a run refuses before its run directory exists: a --seed the initialisations cannot use, and a size
    over the memory limit (``cfg.check_cost()``)."""
    check_int("seed", seed, -MAX_SEED, MAX_SEED)
    cfg.check_cost()


def _solver_bytes(s: "SolverConfig", d: int, p: int, seeds: int) -> float:
    """Estimated peak bytes of :func:`solve` on ``seeds`` problems of size ``p`` in dimension ``d``."""
    if s.method == "hebb":
        return hebb_bytes(d, p, s.kappa) + 4.0 * seeds * d * d  # one problem at a time; every W is kept
    need = train_bytes(s.problem, d, p, seeds, s.kappa, s.train.active_set)
    if s.method == "separable":  # then one LP at a time: >= 8 constraints per input, d^2 + 1 variables, 3 copies
        need = max(need, 3 * 8.0 * 8 * p * (d * d + 1))
    return need


def _check_memory(rows: list[tuple], s: "SolverConfig") -> None:
    """``rows``: (bytes, flags, d, p, seeds) per shape; refuses the largest one over the memory limit, and a
    decoupled batch whose dense competitors exceed ``dp_memory_gb``."""
    need, what, d, p, seeds = max(rows, key=lambda r: r[0])
    kind = "decoupled" if s.problem == "decoupled" else "original"
    dense = " with dense decoupled competitors" if kind == "decoupled" and s.method != "hebb" else ""
    check_memory(need, f"{what} (p = {p} associations in dimension {d}, {seeds} seed{'s' if seeds != 1 else ''} trained at once{dense})"
                 if s.method != "hebb" else f"{what} (p = {p} associations in dimension {d})")
    if dense:
        for _, what, d, p, seeds in rows:
            gb = 4 * seeds * p * (p - 1) * d / 1e9
            if gb > s.train.dp_memory_gb:
                raise ValueError(f"{what} --problem decoupled: {seeds} x p = {p} inputs with p - 1 dense competitors "
                                 f"of dimension {d} need {gb:.1f} GB, over dp_memory_gb = {s.train.dp_memory_gb:g}; "
                                 "use a smaller --d, load or --seeds")


def _check_top_load(s: "SolverConfig", ds: list[int], field: str, alpha: float, seeds: int) -> None:
    """:func:`_check_memory` at the largest load ``alpha`` (flag ``field``) of every d, all seeds at once."""
    rows = []
    for d in ds:
        p = p_for_alpha(alpha, d)
        rows.append((_solver_bytes(s, d, p, seeds), f"--d {d} {flag(field)} {alpha:g} --seeds {seeds}", d, p, seeds))
    _check_memory(rows, s)


@dataclass
class SolverConfig(DictConfig):
    """How W is found; shared by every experiment."""

    method: str = "trained"  # hebb | trained | separable
    problem: str = "original"  # original | decoupled
    kappa: float = 1.0  # rank fraction: W = Q R^T with m = kappa * d
    train: MemoryTrainConfig = field(default_factory=MemoryTrainConfig)  # gradient training ("trained", hint for "separable")

    def __post_init__(self) -> None:
        check_choice("method", self.method, METHODS)
        check_choice("problem", self.problem, PROBLEMS)
        _check_kappa("kappa", self.kappa)
        if self.method == "separable" and self.kappa != 1.0:
            raise bad("kappa", self.kappa, "method separable is exact only for full rank (kappa 1); "
                      "the rank-constrained problem is not a linear program")
        check_type("train", self.train, MemoryTrainConfig)


def solve(problems: list[MemoryProblem], s: SolverConfig, device: torch.device) -> list[dict]:
    """Solve a batch of same-shape problems; one record per problem (with W)."""
    if s.method == "hebb":
        Ws = [solvers.hebb(pr, s.kappa) for pr in problems]
        return [{"W": W, "accuracy": analysis.accuracy(pr, W)} for pr, W in zip(problems, Ws)]
    out = solvers.train(problems, s.kappa, s.train, device=device)
    recs = [{"W": W, "accuracy": a, "steps": st} for W, a, st in zip(out.W, out.accuracy, out.steps)]
    if s.method == "separable":
        for pr, rec in zip(problems, recs):
            sep = solvers.separable(pr, rec["W"])
            rec["separable"] = sep.separable
            rec["trained_accuracy"] = rec["accuracy"]
            if sep.W is not None:
                rec["W"] = sep.W
            rec["accuracy"] = 1.0 if sep.separable else analysis.accuracy(pr, rec["W"])
            rec["lp_t_star"] = sep.t_star
    return recs


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
        """Refuse (one line) a search whose upper bracket cannot fit in memory (every seed of a d is trained at once)."""
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
                memo: dict[str, bool], executor: Executor, on_eval=None):
    """One capacity search as a job (:func:`mechfact.executor.memo_job`; the memo saved after every round)."""
    prefixes = tuple(f"{d},{sd}," for sd in seeds)
    return memo_job(executor, lambda m, ev: capacity_search(d, seeds, s, cfg, device, m, on_eval=ev), memo,
                    lambda k: k.startswith(prefixes), "records", on_eval)


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
    jobs = []
    for d in cfg.d:
        todo = [seed + k for k in range(cfg.seeds) if (d, seed + k) not in done]
        if todo:
            jobs.append(Job(key=f"d={d}", cost=d**3 / 1e3, fn=_search_job(
                d, todo, s, cfg, device, memo, executor, on_eval=lambda: run.write_result(result))))

    def on_result(job: Job, out: dict) -> None:
        recs = _merge_evaluations(memo, out)
        result["capacity"].extend(recs)
        result["capacity"].sort(key=lambda r: (r["d"], r["seed"]))
        result["summary"], result["extrapolation"] = summarise_capacity(result["capacity"])
        run.write_result(result)

    executor.map(jobs, on_result)
    if result["capacity"]:
        result["summary"], result["extrapolation"] = summarise_capacity(result["capacity"])
    return run.finish(result, plots.plot_capacity, "fig_capacity.png", n_jobs_run=len(jobs))


# ---- score distributions (mechanism) ------------------------------------------------------

@dataclass
class ScoresConfig(DictConfig):
    d: int = 64  # dimension
    alpha: float = 0.5  # load at which Hebb and trained W are compared (same instance)
    problem: str = "original"
    kappa: float = 1.0
    train: MemoryTrainConfig = field(default_factory=MemoryTrainConfig)

    def __post_init__(self) -> None:
        _check_d(self.d)
        check_choice("problem", self.problem, PROBLEMS)
        _check_kappa("kappa", self.kappa)
        _check_positive("alpha", self.alpha)
        check_type("train", self.train, MemoryTrainConfig)

    def check_cost(self) -> None:
        p = p_for_alpha(self.alpha, self.d)
        s = SolverConfig(problem=self.problem, kappa=self.kappa, train=self.train)
        _check_memory([(max(_solver_bytes(s, self.d, p, 1), hebb_bytes(self.d, p, self.kappa)),
                        f"--d {self.d} --alpha {self.alpha:g}", self.d, p, 1)], s)


def run_scores(cfg: ScoresConfig, out: str | Path, *, device: torch.device, seed: int = 0) -> dict:
    from . import plots

    _precheck(cfg, seed)  # before the run directory: a refused run writes nothing
    run = RunDir(out, cfg, kind="memory.scores", seed=seed, device=str(device))
    p = p_for_alpha(cfg.alpha, cfg.d)
    pr = MemoryProblem(cfg.problem, cfg.d, p, seed)
    Ws = {"hebb": solvers.hebb(pr, cfg.kappa), "trained": solvers.train([pr], cfg.kappa, cfg.train, device=device).W[0]}
    summary, per_input = {}, {}
    for name, W in Ws.items():
        summary[name], arr = analysis.score_summary(pr, W)
        per_input[name] = {k: np.round(v, 6).tolist() for k, v in arr.items() if k in ("z_target", "z_max")}
    result = {"d": cfg.d, "p": p, "alpha": load(p, cfg.d), "problem": cfg.problem, "kappa": cfg.kappa,
              "summary": summary, "per_input": per_input}
    return run.finish(result, plots.plot_scores, "fig_scores.png")


# ---- singular-value spectra -----------------------------------------------------------------

@dataclass
class SpectrumConfig(DictConfig):
    d: int = 64
    alpha: float = 0.8  # load of the instances (the optimum is studied near capacity)
    kappa: float = 1.0
    seeds: int = 3  # singular values are pooled over this many instances
    train: MemoryTrainConfig = field(default_factory=lambda: MemoryTrainConfig(early_stop=False, steps=3000))

    def __post_init__(self) -> None:
        _check_d(self.d)
        _check_positive("alpha", self.alpha)
        _check_kappa("kappa", self.kappa)
        _check_seeds(self.seeds)
        check_type("train", self.train, MemoryTrainConfig)

    def check_cost(self) -> None:
        """Both problems are trained (one after the other): the decoupled one, with its dense competitors, dominates."""
        p = p_for_alpha(self.alpha, self.d)
        s = SolverConfig(problem="decoupled", kappa=self.kappa, train=self.train)
        need = max(_solver_bytes(s, self.d, p, self.seeds),
                   _solver_bytes(SolverConfig(kappa=self.kappa, train=self.train), self.d, p, self.seeds))
        need += 8.0 * 4 * self.seeds * self.d * self.d  # the W kept per family (float32 and numpy copies)
        _check_memory([(need, f"--d {self.d} --alpha {self.alpha:g} --seeds {self.seeds}", self.d, p, self.seeds)], s)


def run_spectrum(cfg: SpectrumConfig, out: str | Path, *, device: torch.device, seed: int = 0) -> dict:
    from . import plots

    _precheck(cfg, seed)  # before the run directory: a refused run writes nothing
    run = RunDir(out, cfg, kind="memory.spectrum", seed=seed, device=str(device))
    p = p_for_alpha(cfg.alpha, cfg.d)
    ops = [MemoryProblem("original", cfg.d, p, seed + k) for k in range(cfg.seeds)]
    dps = [MemoryProblem("decoupled", cfg.d, p, seed + k) for k in range(cfg.seeds)]
    t_op = solvers.train(ops, cfg.kappa, cfg.train, device=device)
    t_dp = solvers.train(dps, cfg.kappa, cfg.train, device=device)
    hebbs = [solvers.hebb(op, cfg.kappa) for op in ops]
    Ws = {"trained_original": [w.numpy() for w in t_op.W], "trained_decoupled": [w.numpy() for w in t_dp.W],
          "hebb": [w.numpy() for w in hebbs], "init": [w.numpy() for w in t_op.W_init]}
    spec = analysis.spectrum_summary(Ws, cfg.kappa)
    result = {"d": cfg.d, "p": p, "alpha": load(p, cfg.d), "kappa": cfg.kappa, "seeds": cfg.seeds,
              "accuracy": {"trained_original": float(np.mean(t_op.accuracy)), "trained_decoupled": float(np.mean(t_dp.accuracy)),
                           "hebb": float(np.mean([analysis.accuracy(op, w) for op, w in zip(ops, hebbs)]))},
              "ks_op_vs_dp": spec["ks_pairs"]["trained_original|trained_decoupled"],
              "ks_to_theory": spec["ks_to_theory"], "ks_pairs": spec["ks_pairs"],
              "singular_values": {k: np.round(v, 6).tolist() for k, v in spec["singular_values"].items()}}
    return run.finish(result, plots.plot_spectrum, "fig_spectrum.png")


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
                jobs.append(Job(key=key, cost=kappa * d**3 / 1e3, fn=_search_job(
                    d, todo, s, ccfg, device, memo, executor, on_eval=lambda: run.write_result(result))))

    def on_result(job: Job, out: dict) -> None:
        recs = _merge_evaluations(memos[job.key], out) if out else []
        result["capacity"].extend(recs)
        result["capacity"].sort(key=lambda r: (r["kappa"], r["d"], r["seed"]))
        result["summary"], _ = summarise_capacity(result["capacity"])
        result["theory"] = [{"kappa": k, "alpha_c_dof": theory.alpha_c_rank_dof(k),
                             "alpha_c_energy": theory.alpha_c_rank_energy(k)} for k in cfg.kappas]
        run.write_result(result)

    executor.map(jobs, on_result)
    if result["capacity"]:
        on_result(Job("final", lambda: None), {})
    return run.finish(result, plots.plot_rank, "fig_rank.png", n_jobs_run=len(jobs))
