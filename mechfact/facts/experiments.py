"""Run-directory experiments on synthetic facts: ``facts train`` and ``facts construct``, and the public names of
``facts capacity`` (:mod:`.capacity`), ``facts multihop`` (:mod:`.multihop`) and the shared model choices and cost
estimates (:mod:`.spec`).

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

import torch

from ..config import DictConfig, check_float, check_int, check_type
from ..runs import RunDir
from .capacity import SCANS, SEARCHES, FactsCapacityConfig, capacity_search, run_facts_capacity, summarise_thresholds
from .construct import block_size_for, construct, construction_width
from .model import FactModel, FactModelConfig, build_fact_model
from .multihop import MultihopConfig, run_multihop
from .runio import save_fact_run
from .spec import (ModelSpec, _check_chains, _check_hops, _check_seed, _check_world_and_size, _positions,
                   _refuse_if_too_big, n_chains, training_cost, training_queries, world_bytes)
from .train import TrainConfig, load_checkpoint, save_checkpoint, train
from .world import FactWorld

__all__ = ["CHECKPOINT_FILE", "FactsTrainConfig", "run_train", "ConstructConfig", "run_construct",
           "ModelSpec", "n_chains", "world_bytes", "training_cost", "training_queries",
           "SCANS", "SEARCHES", "FactsCapacityConfig", "capacity_search", "summarise_thresholds", "run_facts_capacity",
           "MultihopConfig", "run_multihop"]

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.pt"


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
    resume = load_checkpoint(ckpt, model) if ckpt.exists() else None
    if resume is not None:
        logger.info("resuming from %s at step %d", ckpt, resume["step"])

    def save_ckpt(state: dict) -> None:
        save_checkpoint(run.file(CHECKPOINT_FILE), model, state)
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

