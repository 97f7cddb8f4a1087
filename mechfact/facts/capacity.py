"""``mechfact facts capacity``: the smallest d (or MLP width) that stores every fact, per (N, R, embeddings, seed).

A binary search over a grid (:func:`capacity_search`), memoised in ``result.json`` so that a killed run resumes
without retraining; :func:`summarise_thresholds` fits the medians against R ln N and N R. The run directory follows
:mod:`mechfact.facts.experiments`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..config import DictConfig, check_choice, check_float, check_int, check_int_list, check_type
from ..executor import (Executor, Job, LocalExecutor, clear_spills, memo_job, merge_evaluations, read_spills,
                        spill_file, spills_here)
from ..runs import RunDir
from .model import EMBEDDINGS, FactModelConfig, build_fact_model
from .spec import ModelSpec, _refuse_if_too_big, training_cost
from .train import TrainConfig, train
from .world import FactWorld

logger = logging.getLogger(__name__)

SEARCHES = ("d", "mlp-width")
SCANS = ("bisect", "ascending")  # how the grid is searched: bisection, or every value in order until one reaches


@dataclass
class FactsCapacityConfig(DictConfig):
    subjects: list[int] = field(default_factory=lambda: [256])
    relations: list[int] = field(default_factory=lambda: [2, 4, 8])
    embeddings: list[str] = field(default_factory=lambda: ["trainable"])
    search: str = "d"  # d (at fixed mlp_width) | mlp-width (at fixed d)
    scan: str = "bisect"  # bisect (assumes reaching is monotone in the grid) | ascending (the smallest that reaches)
    grid: list[int] = field(default_factory=lambda: [4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256])
    d: int = 64  # fixed d when searching the MLP width
    mlp_width: int = 64  # fixed width when searching d
    seeds: int = 1
    target_accuracy: float = 0.99
    model: ModelSpec = field(default_factory=ModelSpec)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(steps=4000, target_accuracy=0.99,
                                                                   eval_every=50, patience=1500))
    attributes: list[int] | None = None  # attribute-pool sizes A (each relation maps into 0..A-1); None = bijections

    def __post_init__(self) -> None:
        check_int_list("subjects", self.subjects, 2)
        if self.attributes is not None:
            check_int_list("attributes", self.attributes, 2)
            big = [a for a in self.attributes if a > min(self.subjects)]
            if big:
                raise ValueError(f"--attributes {' '.join(map(str, big))}: a pool is entities 0..A-1, so A must be "
                                 f"<= the smallest --subjects ({min(self.subjects)})")
        check_int_list("relations", self.relations, 1)
        if not self.embeddings:
            raise ValueError("--embeddings: give at least one value")
        for e in self.embeddings:
            check_choice("embeddings", e, EMBEDDINGS)
        check_choice("search", self.search, SEARCHES)
        check_choice("scan", self.scan, SCANS)
        if not self.grid or any(isinstance(g, bool) or not isinstance(g, int) or g < 1 for g in self.grid):
            raise ValueError(f"--grid {self.grid}: must be positive integers")
        check_int("d", self.d, 1)
        check_int("mlp_width", self.mlp_width, 1)
        check_int("seeds", self.seeds, 1)
        check_float("target_accuracy", self.target_accuracy, lo=0, hi=1, lo_open=True)
        check_type("model", self.model, ModelSpec)
        check_type("train", self.train, TrainConfig)
        for e in self.embeddings:  # the model config's own checks of each regime
            FactModelConfig(2, 1, **self.model.config_kwargs(e))

    def check_cost(self) -> None:
        """Refuse (one line) a search whose largest model (largest grid value, N and R) cannot fit in memory."""
        top = max(self.grid)
        d, m = (top, self.mlp_width) if self.search == "d" else (self.d, top)
        rows = []
        for N in self.subjects:
            for R in self.relations:
                for e in self.embeddings:
                    need, what = training_cost(N, R, d, m, self.model, batch_size=self.train.batch_size, embeddings=e,
                                               attributes=min(self.attributes or [N]))
                    rows.append((need, f"--subjects {N} --relations {R} --d {d} --mlp-width {m}", what))
        _refuse_if_too_big(rows)


def _setting(N: int, R: int, emb: str, A: int | None = None) -> str:
    """The start of a setting's evaluation keys (a pool size only for attribute-pool worlds)."""
    return f"N={N} R={R} " + (f"A={A} " if A is not None else "") + f"emb={emb} "


def _eval_key(N: int, R: int, emb: str, d: int, m: int, seed: int, A: int | None = None) -> str:
    return _setting(N, R, emb, A) + f"d={d} m={m} seed={seed}"


def parse_eval_key(key: str) -> dict:
    """The fields of an evaluation key (:func:`_eval_key`): ``N``, ``R``, ``d``, ``m``, ``seed`` (and ``A`` in a
    pool world) as ints, ``emb`` as written."""
    try:
        fields = dict(f.split("=", 1) for f in key.split())
        return {k: v if k == "emb" else int(v) for k, v in fields.items()}
    except ValueError as e:
        raise ValueError(f"evaluation key {key!r}: expected 'N=.. R=.. [A=..] emb=.. d=.. m=.. seed=..'") from e


def search_units(cfg: FactsCapacityConfig, seed: int = 0):
    """Every threshold search a capacity run makes, in its order: (embeddings, pool size or None, N, R, seed),
    the seeds ``seed`` .. ``seed + cfg.seeds - 1``."""
    for emb in cfg.embeddings:
        for A in cfg.attributes or [None]:
            for N in cfg.subjects:
                for R in cfg.relations:
                    for s in range(seed, seed + cfg.seeds):
                        yield emb, A, N, R, s


def scan_grid(n: int, scan: str, ok) -> int:
    """The index of the smallest of ``n`` grid values that ``ok(index)`` accepts, ``n`` when none does, found as
    ``scan`` says: ``ascending`` tries 0, 1, ... and stops at the first accepted; ``bisect`` halves the range,
    assuming that every value above an accepted one is accepted."""
    if scan == "ascending":
        return next((i for i in range(n) if ok(i)), n)
    lo, hi = -1, n  # grid[lo] fails (virtual), grid[hi] succeeds (virtual: unknown)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def capacity_search(N: int, R: int, emb: str, seed: int, cfg: FactsCapacityConfig, device, memo: dict,
                    on_eval=None, attributes: int | None = None) -> dict:
    """Smallest grid value reaching the target accuracy; memoised. ``cfg.scan`` ``bisect``: binary search, which
    assumes that reaching is monotone in the grid; ``ascending``: every value in order until one reaches, the
    smallest that does whatever larger ones do (at a fixed learning rate a wider MLP can fail where a narrower one
    reaches; a bisection that tries the wider one first puts the threshold above it). With ``attributes``: in the
    world whose relations map into a pool of that many attributes."""
    grid = sorted(set(cfg.grid))
    A = attributes
    world = FactWorld(N, R, seed, attributes=A)
    tcfg = TrainConfig.from_dict({**cfg.train.to_dict(), "seed": seed, "target_accuracy": cfg.target_accuracy})

    def ok(i: int) -> bool:
        d, m = (grid[i], cfg.mlp_width) if cfg.search == "d" else (cfg.d, grid[i])
        key = _eval_key(N, R, emb, d, m, seed, A)
        if key not in memo:
            model = build_fact_model(world, d, m, seed=seed, **cfg.model.model_kwargs(emb))
            res = train(model, world, tcfg, device=device, progress=False)
            memo[key] = {"accuracy": res["accuracy"], "steps": res["steps"], "stopped": res["stopped"]}
            logger.info("%s: accuracy %.4f after %d steps", key, res["accuracy"], res["steps"])
            if on_eval:
                on_eval()
        return memo[key]["accuracy"] >= cfg.target_accuracy

    hi = scan_grid(len(grid), cfg.scan, ok)
    thr = grid[hi] if hi < len(grid) else None
    rec = {"subjects": N, "relations": R, "embeddings": emb, "seed": seed, "searched": cfg.search,
           "d": thr if cfg.search == "d" else cfg.d, "mlp_width": thr if cfg.search == "mlp-width" else cfg.mlp_width,
           "threshold": thr, "n_facts": N * R, "r_log_n": R * math.log(N), "attributes": A or N,
           "r_log_a": R * math.log(A or N), "scan": cfg.scan, "device": str(device)}  # device: where it finished
    if thr is None:
        rec["note"] = f"never reached {cfg.target_accuracy} within the grid (max {grid[-1]})"
    elif hi == 0 and len(grid) > 1:  # censored: the true threshold may be lower
        rec["at_grid_min"] = True
        rec["note"] = f"reached {cfg.target_accuracy} at the grid's smallest value {grid[0]}: the threshold is <= it"
    return rec


def line_fit(x, y) -> tuple[float, float, float | None]:
    """The least-squares line ``y = slope x + intercept`` through the points and its R^2 (None when ``y`` is
    constant): the line every threshold law on the pages is fitted with."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    ss = float(np.sum((y - y.mean()) ** 2))
    r2 = float(1 - np.sum((y - (slope * x + intercept)) ** 2) / ss) if ss > 0 else None
    return float(slope), float(intercept), r2


def summarise_thresholds(thresholds: list[dict]) -> dict:
    """Median threshold per (embeddings, A, N, R) and, per regime, a least-squares line against R ln N, N R, and
    (attribute pools) R ln A and R, each slope with a 95% bootstrap interval over seeds (all of a seed's
    thresholds resampled together) when there are at least two. A setting whose threshold sits at the grid's
    smallest value in any seed is marked ``at_grid_min`` (its median is an upper bound)."""
    groups: dict[tuple, list] = {}
    for t in thresholds:
        key = (t["embeddings"], t.get("attributes", t["subjects"]), t["subjects"], t["relations"])
        groups.setdefault(key, []).append(t)
    table = []
    for (emb, A, N, R), ts in sorted(groups.items()):
        vals = [t["threshold"] for t in sorted(ts, key=lambda t: t.get("seed", 0))]  # in seed order
        got = [v for v in vals if v is not None]
        table.append({"embeddings": emb, "subjects": N, "relations": R, "n_facts": N * R, "r_log_n": R * math.log(N),
                      "attributes": A, "r_log_a": R * math.log(A),
                      "median_threshold": float(np.median(got)) if len(got) == len(vals) else None,
                      "thresholds": vals, "at_grid_min": any(t.get("at_grid_min", False) for t in ts)})
    pools = any(t["attributes"] != t["subjects"] for t in table)
    fits = {}
    for emb in sorted({t["embeddings"] for t in table}):
        rows = [t for t in table if t["embeddings"] == emb and t["median_threshold"] is not None]
        mine = [t for t in thresholds if t["embeddings"] == emb]
        fit = {}
        for xname in ("r_log_n", "n_facts") + (("r_log_a", "relations") if pools else ()):
            x = np.array([t[xname] for t in rows], dtype=float)
            y = np.array([t["median_threshold"] for t in rows], dtype=float)
            if len(np.unique(x)) >= 2:
                slope, intercept, r2 = line_fit(x, y)
                ci, distinct = slope_interval(mine, xname)
                fit[xname] = {"slope": slope, "intercept": intercept, "r2": r2,
                              "slope_through_origin": float(x @ y / (x @ x)), "n_points": int(len(x)),
                              "slope_ci": ci.to_dict()["ci"], "n_seeds": len({t["seed"] for t in mine}),
                              "resamples_distinct": distinct}
        fits[emb] = fit
    return {"table": table, "fits": fits}


POWER_FACTORS = (("relations", "R"), ("subjects", "N"), ("attributes", "A"))


def power_law_fit(thresholds: list[dict]) -> dict:
    """d* = C R^a N^b A^c: least squares of ln(median threshold) on ln R, ln N, ln A over the settings whose every
    seed reached above the grid's smallest value (a bound is not a value), each exponent with a 95% bootstrap
    interval that resamples the seeds of each setting independently (:func:`mechfact.stats.stratified_bootstrap`;
    ``resamples_distinct`` counts that scheme's distinct resamples; too few: no interval). A factor that takes one
    value is left out.
    Theta(R ln N) predicts a = 1, c = 0 and b = the local slope of ln ln N (about 1 / ln N); N R predicts b = 1.
    Returns ``{"exponents": {"R": {"value", "ci"}, ...}, "r2", "n_points"}`` (empty without two settings)."""
    from ..stats import stratified_bootstrap

    rows = [t for t in thresholds if t["embeddings"] == "trainable"]
    bad = {_key(t) for t in rows if t["threshold"] is None or t.get("at_grid_min")}
    rows = [t for t in rows if _key(t) not in bad]
    names = [(k, n) for k, n in POWER_FACTORS if len({t.get(k, t["subjects"]) for t in rows}) >= 2]
    if len({_key(t) for t in rows}) < len(names) + 1 or not names:
        return {}

    def fit(idx: np.ndarray) -> tuple[np.ndarray, float, int]:
        med: dict[tuple, list] = {}
        for i in idx.astype(int):
            med.setdefault(_key(rows[i]), []).append(rows[i]["threshold"])
        keys = sorted(med)
        cols = {"relations": 1, "subjects": 0, "attributes": 2}
        X = np.array([[1.0] + [math.log(k[cols[c]]) for c, _ in names] for k in keys])
        y = np.log([float(np.median(med[k])) for k in keys])
        if np.linalg.matrix_rank(X) < X.shape[1]:
            return np.full(len(names), np.nan), float("nan"), len(keys)
        beta = np.linalg.lstsq(X, y, rcond=None)[0]
        resid = y - X @ beta
        ss = float(np.sum((y - y.mean()) ** 2))
        return beta[1:], (1 - float(resid @ resid) / ss) if ss > 0 else float("nan"), len(keys)

    idx = np.arange(len(rows))
    beta, r2, n_points = fit(idx)
    out = {"exponents": {}, "r2": r2, "n_points": n_points}
    for j, (_, name) in enumerate(names):
        est, distinct = stratified_bootstrap(idx, lambda ix, j=j: float(fit(ix)[0][j]),
                                             strata=[_key(t) for t in rows], n_boot=500)
        out["exponents"][name] = {"value": float(beta[j]), "ci": est.to_dict()["ci"]}
        out["resamples_distinct"] = distinct
    return out


def _key(t: dict) -> tuple[int, int, int]:
    return t["subjects"], t["relations"], t.get("attributes", t["subjects"])


def slope_interval(thresholds: list[dict], xname: str):
    """(Estimate, distinct resamples): the least-squares slope of the per-setting median thresholds against
    ``xname``, with a bootstrap that resamples the seeds of each setting independently
    (:func:`mechfact.stats.stratified_bootstrap`: too few distinct resamples, no interval)."""
    from ..stats import stratified_bootstrap

    rows = [t for t in thresholds if t["threshold"] is not None]

    def slope(idx: np.ndarray) -> float:
        med: dict[tuple, list] = {}
        for i in idx.astype(int):
            t = rows[i]
            med.setdefault((t.get("attributes", t["subjects"]), t["subjects"], t["relations"]), []).append(
                (t[xname], t["threshold"]))
        pts = np.array([(v[0][0], np.median([b for _, b in v])) for v in med.values()], dtype=float)
        if len(pts) < 2 or len(np.unique(pts[:, 0])) < 2:
            return float("nan")
        return float(np.polyfit(pts[:, 0], pts[:, 1], 1)[0])

    return stratified_bootstrap(np.arange(len(rows)), slope, n_boot=500,
                                strata=[(t.get("attributes", t["subjects"]), t["subjects"], t["relations"])
                                        for t in rows])


def _search_job(N: int, R: int, emb: str, seed: int, cfg: FactsCapacityConfig, device, memo: dict,
                executor: Executor, on_eval=None, attributes: int | None = None, spill=None):
    """One threshold search as a job (:func:`mechfact.executor.memo_job`; the memo saved after every training:
    in the run's result.json in this process, in ``spill`` from a Ray task)."""
    return memo_job(executor, lambda m, ev: capacity_search(N, R, emb, seed, cfg, device, m, on_eval=ev,
                                                            attributes=attributes), memo,
                    lambda k: k.startswith(_setting(N, R, emb, attributes)) and k.endswith(f" seed={seed}"),
                    "record", on_eval, spill)


def reusable_evaluations(cfg: FactsCapacityConfig, folders, device: str = "cpu") -> dict[str, dict]:
    """The memoised evaluations of other ``facts capacity`` run folders that mean what this run's would: the same
    training, model and target accuracy, on the same kind of device (an evaluation is keyed by N, R, A, embeddings,
    d, MLP width and seed, so the scan, grid and settings may differ: an ascending scan retrains only the grid
    values a bisection skipped). A folder that is not such a run, or that differs in one of those, is refused
    with what differs."""
    from ..runs import read_json

    got: dict[str, dict] = {}
    for folder in map(Path, folders):
        if not (folder / "config.json").is_file() or not (folder / "result.json").is_file():
            raise ValueError(f"--reuse-evaluations {folder}: no facts capacity run there (config.json and "
                             "result.json)")
        old = read_json(folder / "config.json")
        if old.get("kind") != "facts.capacity":
            raise ValueError(f"--reuse-evaluations {folder}: a {old.get('kind')!r} run, not facts.capacity")
        theirs = FactsCapacityConfig.from_dict(old["config"])
        differ = [k for k in ("train", "model", "target_accuracy") if getattr(theirs, k) != getattr(cfg, k)]
        meta = read_json(folder / "meta.json") if (folder / "meta.json").is_file() else {}
        where = str(meta.get("device", "cpu"))  # an unfinished run (no meta.json yet) or an old one: made on a CPU
        if where.split(":")[0] != str(device).split(":")[0]:
            differ.append(f"device ({where}, this run {device})")
        if differ:
            raise ValueError(f"--reuse-evaluations {folder}: its {', '.join(differ)} differ from this run's, so its "
                             "evaluations measure something else; allowed: runs that differ only in scan, grid, "
                             "settings and seeds")
        for key, ev in read_json(folder / "result.json").get("evaluations", {}).items():
            got.setdefault(key, ev)
    return got


def run_facts_capacity(cfg: FactsCapacityConfig, out: str | Path, *, device: torch.device, seed: int = 0,
                       executor: Executor | None = None, reuse: list | None = None) -> dict:
    """``mechfact facts capacity``: thresholds per (N, R, embeddings, seed), written as they finish. ``reuse``:
    run folders whose evaluations (:func:`reusable_evaluations`) are taken as this run's where it has none."""
    cfg.check_cost()  # before the run directory: a refused run writes nothing
    borrowed = reusable_evaluations(cfg, reuse or [], str(device))
    run = RunDir(out, cfg, kind="facts.capacity", seed=seed, device=str(device))
    result = run.read_result({"thresholds": [], "evaluations": {}})
    memo = result.setdefault("evaluations", {})
    mine = tuple({_setting(N, R, emb, A) for emb, A, N, R, _ in search_units(cfg, seed)})
    # what Ray searches of an earlier, stopped process of this run trained, then what other runs lend
    for key, ev in [*read_spills(run.path).items(), *borrowed.items()]:  # of this run's settings only
        if key.startswith(mine):
            memo.setdefault(key, ev)
    # a threshold found by another scan is searched again (from the memoised evaluations): a record without one
    # is a bisection's, from before the option
    result["thresholds"] = [t for t in result["thresholds"] if t.get("scan", "bisect") == cfg.scan]
    done = {(t["subjects"], t["relations"], t["embeddings"], t["seed"], t.get("attributes", t["subjects"]))
            for t in result["thresholds"]}
    executor = executor or LocalExecutor(desc="facts capacity")
    jobs = []
    spills = spills_here(executor)  # a Ray task here writes as it goes
    for emb, A, N, R, s in search_units(cfg, seed):
        if (N, R, emb, s, A or N) in done:
            continue
        pool = f" A={A}" if A is not None else ""
        key = f"{emb}{pool} N={N} R={R} seed={s}"
        jobs.append(Job(key=key, cost=N * R / 1e3, fn=_search_job(
            N, R, emb, s, cfg, device, memo, executor, on_eval=lambda: run.write_result(result), attributes=A,
            spill=spill_file(run.path, key) if spills else None)))

    def on_result(job: Job, out: dict) -> None:
        merge_evaluations(memo, out["evaluations"])
        rec = out["record"]
        result["thresholds"].append(rec)
        result["thresholds"].sort(key=lambda t: (t["embeddings"], t.get("attributes", t["subjects"]), t["subjects"],
                                                 t["relations"], t["seed"]))
        result["summary"] = summarise_thresholds(result["thresholds"])
        run.write_result(result)
        spill_file(run.path, job.key).unlink(missing_ok=True)  # its evaluations are in result.json now

    if spills and jobs:
        run.write_result(result)  # the folder is a run before the tasks' first evaluation: an export finds them
    executor.map(jobs, on_result)
    clear_spills(run.path)  # every search finished: what the stopped ones kept is in result.json
    result["summary"] = summarise_thresholds(result["thresholds"])
    from .plots import plot_capacity

    return run.finish(result, plot_capacity, "fig_capacity.png", n_jobs_run=len(jobs),
                      workers=executor.workers_used)

