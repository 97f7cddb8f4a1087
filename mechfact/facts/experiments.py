"""Run-directory experiments on synthetic facts: train, construct, capacity, multi-hop.

Each ``run_*`` writes a run directory (``config.json`` first, checked on
resume; ``result.json`` rewritten atomically as work finishes; ``meta.json``;
figures drawn from result.json). ``result.json`` holds only deterministic
numbers, so the same config and seed give the same file on the same device.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..config import DictConfig, bad, check_choice, check_float, check_int, check_int_list, check_type
from ..executor import Executor, Job, LocalExecutor, memo_job, merge_evaluations
from ..limits import check_memory
from ..runs import RunDir, atomic_path
from .construct import block_size_for, construct, construction_width
from .model import EMBEDDINGS, OUTPUTS, FactModel, FactModelConfig, build_fact_model
from .runio import save_fact_run
from .train import TrainConfig, train, train_cost
from .world import MAX_ENUMERATE, FactWorld, Queries

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.pt"
SEARCHES = ("d", "mlp-width")


@dataclass
class ModelSpec(DictConfig):
    """The architecture choices shared by train, capacity and multihop."""

    attention: str = "uniform"  # uniform | learned
    embeddings: str = "trainable"  # trainable | frozen | frozen-input
    tied: bool = False  # entity unembedding tied to the input embedding
    layer_norm: bool = False
    entity_init: str = "normal"  # normal | zero (entity input embeddings start at 0)
    outputs: str = "entities"  # entities | attributes (an attribute-pool world's pool only)

    def __post_init__(self) -> None:
        check_choice("outputs", self.outputs, OUTPUTS)
        FactModelConfig(2, 1, **self.config_kwargs())  # the model config's own checks, once

    def model_kwargs(self, embeddings: str | None = None) -> dict:
        """Keyword arguments of :func:`~mechfact.facts.model.build_fact_model` (``embeddings`` overrides)."""
        return {**self.to_dict(), **({"embeddings": embeddings} if embeddings else {})}

    def config_kwargs(self, embeddings: str | None = None) -> dict:
        """Keyword arguments of :class:`~mechfact.facts.model.FactModelConfig` (the output vocabulary aside: its
        size depends on the world)."""
        return {k: v for k, v in self.model_kwargs(embeddings).items() if k != "outputs"}


def _check_hops(hops: int, attention: str) -> None:
    check_int("hops", hops, 1)
    if hops > 1 and attention == "uniform":
        raise ValueError(f"--hops {hops} with --attention uniform: a uniform average loses the ORDER of the "
                         "relations; use --attention learned (positions are added for k > 1)")


def _check_world_and_size(cfg) -> None:
    check_int("subjects", cfg.subjects, 2)
    check_int("relations", cfg.relations, 1)
    check_int("d", cfg.d, 1)
    check_int("mlp_width", cfg.mlp_width, 1)


def _check_seed(field_: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise bad(field_, value, "must be an integer")


def n_chains(subjects: int, relations: int, hops: int) -> int:
    """Queries of ``hops``-hop facts (every chain enumerated): ``subjects * relations ** hops``."""
    return subjects * relations ** hops


def _check_chains(subjects: int, relations: int, hops: int) -> None:
    """k-hop queries are enumerated: refuse more than MAX_ENUMERATE chains before anything is built or written."""
    if hops == 1:
        return
    huge = relations > 1 and hops > 64  # relations ** hops: not worth computing exactly
    if huge or n_chains(subjects, relations, hops) > MAX_ENUMERATE:
        total = f"about 10^{hops * math.log10(relations):.0f}" if huge else f"{n_chains(subjects, relations, hops)}"
        raise ValueError(f"--hops {hops}: {subjects} subjects x {relations}^{hops} relation chains = {total} queries, "
                         f"over the {MAX_ENUMERATE} that can be enumerated; use fewer --subjects, --relations or --hops")


def _positions(hops: int, cot: bool) -> tuple[int, int]:
    """(tokens per query, supervised positions per query) of k-hop queries."""
    return (2 * hops, hops) if cot else (hops + 1, 1)


def world_bytes(subjects: int, relations: int) -> float:
    """A FactWorld's tables (int64, as built and checked) and its world.json (Python ints while written)."""
    return (3 * 8.0 + 44.0) * subjects * relations


def training_cost(subjects: int, relations: int, d: int, mlp_width: int, spec: "ModelSpec", hops: int = 1,
                  cot: bool = False, batch_size: int | None = None, embeddings: str | None = None,
                  attributes: int | None = None) -> tuple[float, str]:
    """(estimated peak bytes, what dominates) of training one model on every ``hops``-hop fact of a world (with an
    attribute pool of ``attributes``, scored over that pool when ``spec.outputs`` says so)."""
    n_ctx = 0 if hops == 1 else _positions(hops, cot)[0]
    kw = spec.config_kwargs(embeddings)
    n_out = attributes if spec.outputs == "attributes" and attributes and attributes < subjects else 0
    mcfg = FactModelConfig(subjects, relations, d=d, mlp_width=mlp_width, n_ctx=n_ctx, n_outputs=n_out, **kw)
    need, what = train_cost(mcfg, n_chains(subjects, relations, hops), *_positions(hops, cot), batch_size)
    return need + world_bytes(subjects, relations), what


def _refuse_if_too_big(rows: list[tuple[float, str, str]]) -> None:
    """``rows``: (bytes, flags, what dominates); refuses the largest one over the memory limit."""
    need, flags, what = max(rows, key=lambda r: r[0])
    check_memory(need, f"{flags} (mostly {what})")


def training_queries(world: FactWorld, hops: int, cot: bool) -> Queries:
    return world.single_hop() if hops == 1 else world.k_hop(hops, cot=cot)


# ---- facts train ------------------------------------------------------------------------------------

@dataclass
class FactsTrainConfig(DictConfig):
    subjects: int = 256  # N
    relations: int = 4  # R
    d: int = 32
    mlp_width: int = 64
    hops: int = 1
    cot: bool = False
    attributes: int | None = None  # shared attribute pool size A < N; None = bijections (FactWorld)
    model: ModelSpec = field(default_factory=ModelSpec)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(steps=5000, target_accuracy=0.99, eval_every=50))
    world_seed: int | None = None  # seed of the facts (None: the run's --seed)
    init_seed: int | None = None  # seed of the initialisation (None: the run's --seed); batches use --seed

    def __post_init__(self) -> None:
        _check_world_and_size(self)
        if self.attributes is not None:
            check_int("attributes", self.attributes, 2, self.subjects)
        _check_hops(self.hops, self.model.attention)
        if self.cot and self.hops == 1:
            raise ValueError("--cot needs --hops >= 2 (a single hop has no intermediate entity)")
        _check_chains(self.subjects, self.relations, self.hops)
        check_type("model", self.model, ModelSpec)
        check_type("train", self.train, TrainConfig)
        _check_seed("world_seed", self.world_seed)
        _check_seed("init_seed", self.init_seed)

    def check_cost(self) -> None:
        """Refuse (one line) a model and fact set that cannot fit in memory, before anything is allocated."""
        need, what = training_cost(self.subjects, self.relations, self.d, self.mlp_width, self.model, self.hops,
                                   self.cot, self.train.batch_size, attributes=self.attributes)
        flags = f"--subjects {self.subjects} --relations {self.relations} --d {self.d} --mlp-width {self.mlp_width}"
        _refuse_if_too_big([(need, flags + (f" --hops {self.hops}" if self.hops > 1 else ""), what)])


def _load_checkpoint(path: Path, model: FactModel) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_weights(state.pop("model"), source=str(path))
        if not {"step", "optimizer", "generator", "history", "best", "best_step"} <= set(state):
            raise KeyError(f"missing keys {sorted({'step', 'optimizer', 'generator', 'history'} - set(state))}")
    except Exception as e:  # truncated file, pickle error, wrong shapes, missing keys
        raise ValueError(f"{path}: corrupted checkpoint ({type(e).__name__}: {str(e)[:200]}); "
                         "delete it to restart training from scratch") from e
    return state


def run_train(cfg: FactsTrainConfig, out: str | Path, *, device: torch.device, seed: int = 0,
              progress: bool = False, checkpoint_every: int = 500, _after_checkpoint=None) -> dict:
    """``mechfact facts train``: train one model, checkpointing to ``out/checkpoint.pt``; resumes from it.

    ``_after_checkpoint(state)`` is a test hook called after each checkpoint is written.
    """
    cfg.check_cost()  # before the run directory: a refused run writes nothing
    run = RunDir(out, cfg, kind="facts.train", seed=seed, device=str(device))
    world = FactWorld(cfg.subjects, cfg.relations, seed if cfg.world_seed is None else cfg.world_seed,
                      attributes=cfg.attributes)
    model = build_fact_model(world, cfg.d, cfg.mlp_width, hops=cfg.hops, cot=cfg.cot,
                             seed=seed if cfg.init_seed is None else cfg.init_seed, **cfg.model.model_kwargs())
    queries = training_queries(world, cfg.hops, cfg.cot)
    tcfg = TrainConfig.from_dict({**cfg.train.to_dict(), "seed": seed})
    ckpt = run.path / CHECKPOINT_FILE  # run.file() (which commits config.json) only when it is written
    resume = _load_checkpoint(ckpt, model) if ckpt.exists() else None
    if resume is not None:
        logger.info("resuming from %s at step %d", ckpt, resume["step"])

    def save_ckpt(state: dict) -> None:
        with atomic_path(run.file(CHECKPOINT_FILE)) as tmp:
            torch.save({"model": {k: v.detach().cpu() for k, v in model.state_dict().items()}, **state}, tmp)
        if _after_checkpoint is not None:
            _after_checkpoint(state)

    res = train(model, world, tcfg, device=device, queries=queries, checkpoint=save_ckpt,
                checkpoint_every=checkpoint_every, resume=resume, progress=progress)
    save_fact_run(run.path, model, world)
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    result = {"subjects": cfg.subjects, "relations": cfg.relations, "hops": cfg.hops, "cot": cfg.cot,
              "d": cfg.d, "mlp_width": cfg.mlp_width, "embeddings": cfg.model.embeddings,
              "n_queries": len(queries), "trainable_parameters": n_params,
              **{k: res[k] for k in ("accuracy", "per_relation", "token_accuracy", "loss", "steps", "stopped")},
              "history": res["history"]}
    from .plots import plot_train

    return run.finish(result, plot_train, "fig_train.png")


# ---- facts construct --------------------------------------------------------------------------------

@dataclass
class ConstructConfig(DictConfig):
    subjects: int = 256
    relations: int = 4
    d: int | None = None  # residual width available; None = the smallest reaching target_accuracy
    hops: int = 1
    cot: bool = False
    target_accuracy: float = 0.99
    world_seed: int | None = None  # seed of the facts (None: the run's --seed)

    def __post_init__(self) -> None:
        check_int("subjects", self.subjects, 2)
        check_int("relations", self.relations, 1)
        check_int("hops", self.hops, 1)
        if self.d is not None:
            check_int("d", self.d, 1)
            block_size_for(self.d, self.relations, self.hops, self.cot)
        if self.hops > 1 and not self.cot:
            raise ValueError(f"--hops {self.hops} without --cot: the explicit multi-hop construction is the "
                             "chain-of-thought one (direct k-hop answering has no compact construction)")
        check_float("target_accuracy", self.target_accuracy, lo=0, hi=1, lo_open=True)
        _check_chains(self.subjects, self.relations, self.hops)
        _check_seed("world_seed", self.world_seed)

    def check_cost(self) -> None:
        """Refuse (one line) a construction that cannot fit in memory. Without --d the block size is scanned up
        to about 4 ln N (measured: 3.6-4.2 ln N reaches 99%), two models alive at a time."""
        N, R, k = self.subjects, self.relations, self.hops
        b = block_size_for(self.d, R, k, self.cot) if self.d is not None else min(256, math.ceil(4.5 * math.log(N)) + 2)
        d = construction_width(R, b, k, self.cot)
        P, sup = _positions(k, self.cot)
        mcfg = FactModelConfig(N, R, d=d, mlp_width=2 * R * b, attention="learned" if self.cot else "uniform",
                               n_ctx=P if self.cot else 0)
        n_q = n_chains(N, R, k)
        E = min(8192, n_q)
        terms = {"the model's weights": 4.0 * (mcfg.n_weights()[0] * (2 if self.d is None else 1) + 2 * R * N * b),
                 f"the evaluation's {E} x {N} logits": 4.0 * E * (sup * N * 1.1 + P * (4 * d + 4 * R * b)),
                 "the world and its queries": world_bytes(N, R) + 8.0 * n_q * (3 * P + 4)}
        flags = f"--subjects {N} --relations {R}" + (f" --d {self.d}" if self.d is not None else "") \
            + (f" --hops {k}" if k > 1 else "")
        _refuse_if_too_big([(sum(terms.values()), flags, max(terms, key=terms.get))])


def run_construct(cfg: ConstructConfig, out: str | Path, *, device: torch.device, seed: int = 0) -> dict:
    """``mechfact facts construct``: build the explicit construction, evaluate it, save it as a run directory."""
    cfg.check_cost()  # before the run directory: a refused run writes nothing
    run = RunDir(out, cfg, kind="facts.construct", seed=seed, device=str(device))
    world = FactWorld(cfg.subjects, cfg.relations, seed if cfg.world_seed is None else cfg.world_seed)
    model, info = construct(world, cfg.d, hops=cfg.hops, cot=cfg.cot, target_accuracy=cfg.target_accuracy,
                            seed=seed, device=device)
    save_fact_run(run.path, model.cpu(), world)
    result = {"subjects": cfg.subjects, "relations": cfg.relations, "hops": cfg.hops, "cot": cfg.cot,
              "d": info["d"], "d_requested": cfg.d, "block_size": info["block_size"], "mlp_width": model.cfg.mlp_width,
              **{k: info[k] for k in ("accuracy", "per_relation", "token_accuracy", "n_queries", "scan")}}
    return run.finish(result)


# ---- facts capacity ---------------------------------------------------------------------------------

@dataclass
class FactsCapacityConfig(DictConfig):
    subjects: list[int] = field(default_factory=lambda: [256])
    relations: list[int] = field(default_factory=lambda: [2, 4, 8])
    embeddings: list[str] = field(default_factory=lambda: ["trainable"])
    search: str = "d"  # d (at fixed mlp_width) | mlp-width (at fixed d)
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


def capacity_search(N: int, R: int, emb: str, seed: int, cfg: FactsCapacityConfig, device, memo: dict,
                    on_eval=None, attributes: int | None = None) -> dict:
    """Smallest grid value reaching the target accuracy (binary search, monotone assumption); memoised. With
    ``attributes``: in the world whose relations map into a pool of that many attributes."""
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

    lo, hi = -1, len(grid)  # grid[lo] fails (virtual), grid[hi] succeeds (virtual: unknown)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    thr = grid[hi] if hi < len(grid) else None
    rec = {"subjects": N, "relations": R, "embeddings": emb, "seed": seed, "searched": cfg.search,
           "d": thr if cfg.search == "d" else cfg.d, "mlp_width": thr if cfg.search == "mlp-width" else cfg.mlp_width,
           "threshold": thr, "n_facts": N * R, "r_log_n": R * math.log(N), "attributes": A or N,
           "r_log_a": R * math.log(A or N)}
    if thr is None:
        rec["note"] = f"never reached {cfg.target_accuracy} within the grid (max {grid[-1]})"
    return rec


def summarise_thresholds(thresholds: list[dict]) -> dict:
    """Median threshold per (embeddings, A, N, R) and, per regime, a least-squares line against R ln N, N R, and
    (attribute pools) R ln A and R."""
    groups: dict[tuple, list] = {}
    for t in thresholds:
        key = (t["embeddings"], t.get("attributes", t["subjects"]), t["subjects"], t["relations"])
        groups.setdefault(key, []).append(t["threshold"])
    table = []
    for (emb, A, N, R), vals in sorted(groups.items()):
        got = [v for v in vals if v is not None]
        table.append({"embeddings": emb, "subjects": N, "relations": R, "n_facts": N * R, "r_log_n": R * math.log(N),
                      "attributes": A, "r_log_a": R * math.log(A),
                      "median_threshold": float(np.median(got)) if len(got) == len(vals) else None,
                      "thresholds": vals})
    pools = any(t["attributes"] != t["subjects"] for t in table)
    fits = {}
    for emb in sorted({t["embeddings"] for t in table}):
        rows = [t for t in table if t["embeddings"] == emb and t["median_threshold"] is not None]
        fit = {}
        for xname in ("r_log_n", "n_facts") + (("r_log_a", "relations") if pools else ()):
            x = np.array([t[xname] for t in rows], dtype=float)
            y = np.array([t["median_threshold"] for t in rows], dtype=float)
            if len(np.unique(x)) >= 2:
                slope, intercept = np.polyfit(x, y, 1)
                pred = slope * x + intercept
                ss = float(np.sum((y - y.mean()) ** 2))
                fit[xname] = {"slope": float(slope), "intercept": float(intercept),
                              "r2": float(1 - np.sum((y - pred) ** 2) / ss) if ss > 0 else None,
                              "slope_through_origin": float(x @ y / (x @ x)), "n_points": int(len(x))}
        fits[emb] = fit
    return {"table": table, "fits": fits}


def _search_job(N: int, R: int, emb: str, seed: int, cfg: FactsCapacityConfig, device, memo: dict,
                executor: Executor, on_eval=None, attributes: int | None = None):
    """One threshold search as a job (:func:`mechfact.executor.memo_job`; the memo saved after every training)."""
    return memo_job(executor, lambda m, ev: capacity_search(N, R, emb, seed, cfg, device, m, on_eval=ev,
                                                            attributes=attributes), memo,
                    lambda k: k.startswith(_setting(N, R, emb, attributes)) and k.endswith(f" seed={seed}"),
                    "record", on_eval)


def run_facts_capacity(cfg: FactsCapacityConfig, out: str | Path, *, device: torch.device, seed: int = 0,
                       executor: Executor | None = None) -> dict:
    """``mechfact facts capacity``: thresholds per (N, R, embeddings, seed), written as they finish."""
    cfg.check_cost()  # before the run directory: a refused run writes nothing
    run = RunDir(out, cfg, kind="facts.capacity", seed=seed, device=str(device))
    result = run.read_result({"thresholds": [], "evaluations": {}})
    memo = result.setdefault("evaluations", {})
    done = {(t["subjects"], t["relations"], t["embeddings"], t["seed"], t.get("attributes", t["subjects"]))
            for t in result["thresholds"]}
    executor = executor or LocalExecutor(desc="facts capacity")
    jobs = []
    for emb in cfg.embeddings:
        for A in cfg.attributes or [None]:
            for N in cfg.subjects:
                for R in cfg.relations:
                    for s in range(seed, seed + cfg.seeds):
                        if (N, R, emb, s, A or N) in done:
                            continue
                        pool = f" A={A}" if A is not None else ""
                        jobs.append(Job(key=f"{emb}{pool} N={N} R={R} seed={s}", cost=N * R / 1e3, fn=_search_job(
                            N, R, emb, s, cfg, device, memo, executor, on_eval=lambda: run.write_result(result),
                            attributes=A)))

    def on_result(job: Job, out: dict) -> None:
        merge_evaluations(memo, out["evaluations"])
        rec = out["record"]
        result["thresholds"].append(rec)
        result["thresholds"].sort(key=lambda t: (t["embeddings"], t.get("attributes", t["subjects"]), t["subjects"],
                                                 t["relations"], t["seed"]))
        result["summary"] = summarise_thresholds(result["thresholds"])
        run.write_result(result)

    executor.map(jobs, on_result)
    result["summary"] = summarise_thresholds(result["thresholds"])
    from .plots import plot_capacity

    return run.finish(result, plot_capacity, "fig_capacity.png", n_jobs_run=len(jobs))


# ---- multi-hop: direct vs chain of thought ----------------------------------------------------------

@dataclass
class MultihopConfig(DictConfig):
    subjects: int = 32
    relations: int = 4
    hops: list[int] = field(default_factory=lambda: [1, 2, 3])
    d: int = 16
    mlp_width: int = 32
    model: ModelSpec = field(default_factory=lambda: ModelSpec(attention="learned"))
    train: TrainConfig = field(default_factory=lambda: TrainConfig(lr=3e-2, schedule="warmup-cosine", steps=3000,
                                                                   target_accuracy=0.99, eval_every=50))

    def __post_init__(self) -> None:
        _check_world_and_size(self)
        if not self.hops:
            raise ValueError("--hops: give at least one value")
        for k in self.hops:
            _check_hops(k, self.model.attention)
            _check_chains(self.subjects, self.relations, k)
        check_type("model", self.model, ModelSpec)
        check_type("train", self.train, TrainConfig)

    def check_cost(self) -> None:
        """Refuse (one line) the largest k-hop training (direct or chain of thought) that cannot fit in memory."""
        rows = []
        for k in sorted(set(self.hops)):
            for cot in (False, True) if k > 1 else (False,):
                need, what = training_cost(self.subjects, self.relations, self.d, self.mlp_width, self.model, k, cot,
                                           self.train.batch_size)
                rows.append((need, f"--subjects {self.subjects} --relations {self.relations} --d {self.d} "
                                   f"--mlp-width {self.mlp_width} --hops {k}", what))
        _refuse_if_too_big(rows)


def _multihop_point(cfg: MultihopConfig, k: int, mode: str, device, seed: int) -> dict:
    """Train one k-hop model (direct or chain of thought) and measure it: one multihop job."""
    world = FactWorld(cfg.subjects, cfg.relations, seed)
    tcfg = TrainConfig.from_dict({**cfg.train.to_dict(), "seed": seed})
    cot = mode == "cot"
    queries = training_queries(world, k, cot)
    model = build_fact_model(world, cfg.d, cfg.mlp_width, hops=k, cot=cot, seed=seed, **cfg.model.model_kwargs())
    res = train(model, world, tcfg, device=device, queries=queries, progress=False)
    return {"hops": k, "mode": mode, "accuracy": res["accuracy"], "token_accuracy": res["token_accuracy"],
            "n_queries": len(queries), "steps": res["steps"], "stopped": res["stopped"]}


def run_multihop(cfg: MultihopConfig, out: str | Path, *, device: torch.device, seed: int = 0,
                 executor: Executor | None = None) -> dict:
    """``mechfact facts multihop``: same d, width and budget; direct vs CoT accuracy per k (all chains),
    one job per (k, mode)."""
    cfg.check_cost()  # before the run directory: a refused run writes nothing
    run = RunDir(out, cfg, kind="facts.multihop", seed=seed, device=str(device))
    result = run.read_result({"points": []})
    done = {(p["hops"], p["mode"]) for p in result["points"]}
    jobs = [Job(key=f"hops={k} {mode}", cost=k * (2 if mode == "cot" else 1),
                fn=lambda k=k, mode=mode: _multihop_point(cfg, k, mode, device, seed))
            for k in sorted(set(cfg.hops)) for mode in (("direct", "cot") if k > 1 else ("direct",))
            if (k, mode) not in done]

    def on_result(job: Job, point: dict) -> None:
        result["points"].append(point)
        result["points"].sort(key=lambda p: (p["hops"], p["mode"]))
        run.write_result(result)

    (executor or LocalExecutor(desc="facts multihop")).map(jobs, on_result)
    result.update(subjects=cfg.subjects, relations=cfg.relations, d=cfg.d, mlp_width=cfg.mlp_width)
    from .plots import plot_multihop

    return run.finish(result, plot_multihop, "fig_multihop.png")
