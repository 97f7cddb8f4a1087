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

from ..config import DictConfig
from ..executor import Executor, Job, LocalExecutor
from ..runs import RunDir, atomic_path, read_json
from .construct import build_cot, build_single_hop, construction_d, cot_construction_d, scan_block_size
from .evaluate import evaluate
from .model import ATTENTION, EMBEDDINGS, ENTITY_INIT, FactModel, FactModelConfig
from .runio import save_fact_run
from .train import TrainConfig, train
from .world import FactWorld, Queries

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.pt"
SEARCHES = ("d", "mlp-width")


def _int_at_least(name: str, value, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"--{name} {value}: must be an integer >= {lo}")


@dataclass
class ModelSpec(DictConfig):
    """The architecture choices shared by train, capacity and multihop."""

    attention: str = "uniform"  # uniform | learned
    embeddings: str = "trainable"  # trainable | frozen | frozen-input
    tied: bool = False  # entity unembedding tied to the input embedding
    layer_norm: bool = False
    entity_init: str = "normal"  # normal | zero (entity input embeddings start at 0)

    def validate(self) -> None:
        if self.entity_init not in ENTITY_INIT:
            raise ValueError(f"--entity-init {self.entity_init}: allowed {', '.join(ENTITY_INIT)}")
        if self.attention not in ATTENTION:
            raise ValueError(f"--attention {self.attention}: allowed {', '.join(ATTENTION)}")
        if self.embeddings not in EMBEDDINGS:
            raise ValueError(f"--embeddings {self.embeddings}: allowed {', '.join(EMBEDDINGS)}")


def _check_hops(hops: int, attention: str) -> None:
    _int_at_least("hops", hops, 1)
    if hops > 1 and attention == "uniform":
        raise ValueError(f"--hops {hops} with --attention uniform: a uniform average loses the ORDER of the "
                         "relations; use --attention learned (positions are added for k > 1)")


def _check_world_and_size(cfg) -> None:
    _int_at_least("subjects", cfg.subjects, 2)
    _int_at_least("relations", cfg.relations, 1)
    _int_at_least("d", cfg.d, 1)
    _int_at_least("mlp-width", cfg.mlp_width, 1)
    cfg.model.validate()


def build_model(world: FactWorld, d: int, mlp_width: int, spec: ModelSpec, hops: int = 1, cot: bool = False,
                seed: int = 0, embeddings: str | None = None) -> FactModel:
    """A fresh FactModel for ``world``; k > 1 hops get learned positions for the query length."""
    n_ctx = 0 if hops == 1 else (2 * hops if cot else hops + 1)
    return FactModel(FactModelConfig(world.n_entities, world.n_relations, d=d, mlp_width=mlp_width,
                                     attention=spec.attention, embeddings=embeddings or spec.embeddings,
                                     tied=spec.tied, layer_norm=spec.layer_norm, entity_init=spec.entity_init,
                                     n_special=world.n_special,
                                     n_ctx=n_ctx, seed=seed))


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

    def validate(self) -> None:
        _check_world_and_size(self)
        if self.attributes is not None and not (isinstance(self.attributes, int) and
                                                2 <= self.attributes <= self.subjects):
            raise ValueError(f"attributes={self.attributes}: must be an integer in 2..subjects={self.subjects}")
        _check_hops(self.hops, self.model.attention)
        if self.cot and self.hops == 1:
            raise ValueError("--cot needs --hops >= 2 (a single hop has no intermediate entity)")


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
              progress: bool = True, checkpoint_every: int = 500, _after_checkpoint=None) -> dict:
    """``mechfact facts train``: train one model, checkpointing to ``out/checkpoint.pt``; resumes from it.

    ``_after_checkpoint(state)`` is a test hook called after each checkpoint is written.
    """
    cfg.validate()
    run = RunDir(out, {"config": cfg, "seed": seed}, kind="facts.train", seed=seed, device=str(device))
    world = FactWorld(cfg.subjects, cfg.relations, seed, attributes=cfg.attributes)
    model = build_model(world, cfg.d, cfg.mlp_width, cfg.model, cfg.hops, cfg.cot, seed=seed)
    queries = training_queries(world, cfg.hops, cfg.cot)
    tcfg = TrainConfig.from_dict({**cfg.train.to_dict(), "seed": seed})
    ckpt = run.file(CHECKPOINT_FILE)
    resume = _load_checkpoint(ckpt, model) if ckpt.exists() else None
    if resume is not None:
        logger.info("resuming from %s at step %d", ckpt, resume["step"])

    def save_ckpt(state: dict) -> None:
        with atomic_path(ckpt) as tmp:
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
    return _finish(run, result, "plot_train", "fig_train.png")


def _finish(run: RunDir, result: dict, plot: str, fig: str, **meta) -> dict:
    from . import plots

    return run.finish(result, getattr(plots, plot), fig, **meta)


# ---- facts construct --------------------------------------------------------------------------------

@dataclass
class ConstructConfig(DictConfig):
    subjects: int = 256
    relations: int = 4
    d: int | None = None  # residual width available; None = the smallest reaching target_accuracy
    hops: int = 1
    cot: bool = False
    target_accuracy: float = 0.99

    def validate(self) -> None:
        _int_at_least("subjects", self.subjects, 2)
        _int_at_least("relations", self.relations, 1)
        _int_at_least("hops", self.hops, 1)
        if self.d is not None:
            _int_at_least("d", self.d, 1)
            lo = self._d_of(1)
            if self.d < lo:
                raise ValueError(f"--d {self.d}: the construction needs d >= {lo} for R={self.relations}"
                                 + (f", k={self.hops}" if self.cot else ""))
        if self.hops > 1 and not self.cot:
            raise ValueError(f"--hops {self.hops} without --cot: the explicit multi-hop construction is the "
                             "chain-of-thought one (direct k-hop answering has no compact construction)")

    def _d_of(self, b: int) -> int:
        return cot_construction_d(self.relations, b, self.hops) if self.cot else construction_d(self.relations, b)

    def block_size_for(self, d: int) -> int:
        """The largest block size b whose construction fits in width d."""
        b = 1
        while self._d_of(b + 1) <= d:
            b += 1
        return b


def construct_model(world: FactWorld, cfg: ConstructConfig, b: int, seed: int) -> FactModel:
    return build_cot(world, cfg.hops, b, seed=seed) if cfg.cot else build_single_hop(world, b, seed=seed)


def run_construct(cfg: ConstructConfig, out: str | Path, *, device: torch.device, seed: int = 0) -> dict:
    """``mechfact facts construct``: build the explicit construction, evaluate it, save it as a run directory."""
    cfg.validate()
    run = RunDir(out, {"config": cfg, "seed": seed}, kind="facts.construct", seed=seed, device=str(device))
    world = FactWorld(cfg.subjects, cfg.relations, seed)
    queries = training_queries(world, cfg.hops, cfg.cot)

    def score(b: int):
        model = construct_model(world, cfg, b, seed)
        return model, evaluate(model.to(device), world, queries)

    scanned = []
    if cfg.d is not None:
        b = cfg.block_size_for(cfg.d)
        model, res = score(b)
    else:  # smallest block size reaching the target
        b, model, res, scanned = scan_block_size(score, target=cfg.target_accuracy)
        scanned = [{"block_size": s["block_size"], "d": cfg._d_of(s["block_size"]), "accuracy": s["accuracy"]}
                   for s in scanned]
    save_fact_run(run.path, model.cpu(), world)
    result = {"subjects": cfg.subjects, "relations": cfg.relations, "hops": cfg.hops, "cot": cfg.cot,
              "d": model.cfg.d, "d_requested": cfg.d, "block_size": b, "mlp_width": model.cfg.mlp_width,
              "accuracy": res["accuracy"], "per_relation": res["per_relation"],
              "token_accuracy": res["token_accuracy"], "n_queries": len(queries), "scan": scanned}
    run.write_result(result)
    run.write_meta()
    return result


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

    def validate(self) -> None:
        for n in self.subjects:
            _int_at_least("subjects", n, 2)
        for r in self.relations:
            _int_at_least("relations", r, 1)
        for e in self.embeddings:
            if e not in EMBEDDINGS:
                raise ValueError(f"--embeddings {e}: allowed {', '.join(EMBEDDINGS)}")
        if self.search not in SEARCHES:
            raise ValueError(f"--search {self.search}: allowed {', '.join(SEARCHES)}")
        if not self.grid or any(isinstance(g, bool) or not isinstance(g, int) or g < 1 for g in self.grid):
            raise ValueError(f"--grid {self.grid}: must be positive integers")
        _int_at_least("d", self.d, 1)
        _int_at_least("mlp-width", self.mlp_width, 1)
        _int_at_least("seeds", self.seeds, 1)
        if not 0 < self.target_accuracy <= 1:
            raise ValueError(f"--target-accuracy {self.target_accuracy}: must lie in (0, 1]")
        self.model.validate()


def _eval_key(N: int, R: int, emb: str, d: int, m: int, seed: int) -> str:
    return f"N={N} R={R} emb={emb} d={d} m={m} seed={seed}"


def capacity_search(N: int, R: int, emb: str, seed: int, cfg: FactsCapacityConfig, device, memo: dict,
                    on_eval=None) -> dict:
    """Smallest grid value reaching the target accuracy (binary search, monotone assumption); memoised."""
    grid = sorted(set(cfg.grid))
    world = FactWorld(N, R, seed)
    tcfg = TrainConfig.from_dict({**cfg.train.to_dict(), "seed": seed, "target_accuracy": cfg.target_accuracy})

    def ok(i: int) -> bool:
        d, m = (grid[i], cfg.mlp_width) if cfg.search == "d" else (cfg.d, grid[i])
        key = _eval_key(N, R, emb, d, m, seed)
        if key not in memo:
            model = build_model(world, d, m, cfg.model, seed=seed, embeddings=emb)
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
           "threshold": thr, "n_facts": N * R, "r_log_n": R * math.log(N)}
    if thr is None:
        rec["note"] = f"never reached {cfg.target_accuracy} within the grid (max {grid[-1]})"
    return rec


def summarise_thresholds(thresholds: list[dict]) -> dict:
    """Median threshold per (embeddings, N, R) and, per regime, a least-squares line against R ln N and N R."""
    groups: dict[tuple, list] = {}
    for t in thresholds:
        groups.setdefault((t["embeddings"], t["subjects"], t["relations"]), []).append(t["threshold"])
    table = []
    for (emb, N, R), vals in sorted(groups.items()):
        got = [v for v in vals if v is not None]
        table.append({"embeddings": emb, "subjects": N, "relations": R, "n_facts": N * R, "r_log_n": R * math.log(N),
                      "median_threshold": float(np.median(got)) if len(got) == len(vals) else None,
                      "thresholds": vals})
    fits = {}
    for emb in sorted({t["embeddings"] for t in table}):
        rows = [t for t in table if t["embeddings"] == emb and t["median_threshold"] is not None]
        fit = {}
        for xname in ("r_log_n", "n_facts"):
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


def run_facts_capacity(cfg: FactsCapacityConfig, out: str | Path, *, device: torch.device, seed: int = 0,
                       executor: Executor | None = None) -> dict:
    """``mechfact facts capacity``: thresholds per (N, R, embeddings, seed), written as they finish."""
    cfg.validate()
    run = RunDir(out, {"config": cfg, "seed": seed}, kind="facts.capacity", seed=seed, device=str(device))
    res_file = run.file("result.json")
    result = read_json(res_file) if res_file.exists() else {"thresholds": [], "evaluations": {}}
    memo = result.setdefault("evaluations", {})
    done = {(t["subjects"], t["relations"], t["embeddings"], t["seed"]) for t in result["thresholds"]}
    jobs = []
    for emb in cfg.embeddings:
        for N in cfg.subjects:
            for R in cfg.relations:
                for s in range(seed, seed + cfg.seeds):
                    if (N, R, emb, s) in done:
                        continue
                    jobs.append(Job(key=f"{emb} N={N} R={R} seed={s}", cost=N * R / 1e3,
                                    fn=lambda N=N, R=R, emb=emb, s=s: capacity_search(
                                        N, R, emb, s, cfg, device, memo, on_eval=lambda: run.write_result(result))))

    def on_result(job: Job, rec: dict) -> None:
        result["thresholds"].append(rec)
        result["thresholds"].sort(key=lambda t: (t["embeddings"], t["subjects"], t["relations"], t["seed"]))
        result["summary"] = summarise_thresholds(result["thresholds"])
        run.write_result(result)

    (executor or LocalExecutor(desc="facts capacity")).map(jobs, on_result)
    result["summary"] = summarise_thresholds(result["thresholds"])
    return _finish(run, result, "plot_capacity", "fig_capacity.png", n_jobs_run=len(jobs))


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

    def validate(self) -> None:
        _check_world_and_size(self)
        if not self.hops:
            raise ValueError("--hops: give at least one value")
        for k in self.hops:
            _check_hops(k, self.model.attention)


def run_multihop(cfg: MultihopConfig, out: str | Path, *, device: torch.device, seed: int = 0) -> dict:
    """``mechfact facts multihop``: same d, width and budget; direct vs CoT accuracy per k (all chains)."""
    cfg.validate()
    run = RunDir(out, {"config": cfg, "seed": seed}, kind="facts.multihop", seed=seed, device=str(device))
    res_file = run.file("result.json")
    result = read_json(res_file) if res_file.exists() else {"points": []}
    done = {(p["hops"], p["mode"]) for p in result["points"]}
    world = FactWorld(cfg.subjects, cfg.relations, seed)
    tcfg = TrainConfig.from_dict({**cfg.train.to_dict(), "seed": seed})
    for k in sorted(set(cfg.hops)):
        for mode in ("direct", "cot") if k > 1 else ("direct",):
            if (k, mode) in done:
                continue
            cot = mode == "cot"
            queries = training_queries(world, k, cot)
            model = build_model(world, cfg.d, cfg.mlp_width, cfg.model, k, cot, seed=seed)
            res = train(model, world, tcfg, device=device, queries=queries)
            result["points"].append({"hops": k, "mode": mode, "accuracy": res["accuracy"],
                                     "token_accuracy": res["token_accuracy"], "n_queries": len(queries),
                                     "steps": res["steps"], "stopped": res["stopped"]})
            result["points"].sort(key=lambda p: (p["hops"], p["mode"]))
            run.write_result(result)
    result.update(subjects=cfg.subjects, relations=cfg.relations, d=cfg.d, mlp_width=cfg.mlp_width)
    return _finish(run, result, "plot_multihop", "fig_multihop.png")
