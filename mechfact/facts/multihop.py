"""``mechfact facts multihop``: direct vs chain-of-thought answering of k-hop facts at the same d, width and budget.

One job per (k, mode); points are written to ``result.json`` as they finish, so a killed run resumes. The run
directory follows :mod:`mechfact.facts.experiments`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import DictConfig, check_type
from ..executor import Executor, Job, LocalExecutor, on_this_machine
from ..runs import RunDir
from .model import build_fact_model
from .spec import (ModelSpec, _check_chains, _check_hops, _check_world_and_size, _refuse_if_too_big, training_cost,
                   training_queries)
from .train import TrainConfig, train_resumable
from .world import FactWorld


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


def _multihop_point(cfg: MultihopConfig, k: int, mode: str, device, seed: int, checkpoint: Path | None = None,
                    tag: str = "") -> dict:
    """Train one k-hop model (direct or chain of thought) and measure it: one multihop job. With ``checkpoint``
    the training saves its state there and resumes from it (a stopped run keeps its points in training)."""
    world = FactWorld(cfg.subjects, cfg.relations, seed)
    tcfg = TrainConfig.from_dict({**cfg.train.to_dict(), "seed": seed})
    cot = mode == "cot"
    queries = training_queries(world, k, cot)
    model = build_fact_model(world, cfg.d, cfg.mlp_width, hops=k, cot=cot, seed=seed, **cfg.model.model_kwargs())
    res, _ = train_resumable(model, world, tcfg, checkpoint, device=device, queries=queries, tag=tag)
    return {"hops": k, "mode": mode, "accuracy": res["accuracy"], "token_accuracy": res["token_accuracy"],
            "n_queries": len(queries), "steps": res["steps"], "stopped": res["stopped"], "device": str(device)}


def point_checkpoint(k: int, mode: str) -> str:
    """The file name of the training checkpoint of a multihop point while it trains."""
    return f"checkpoint_hops{k}_{mode}.pt"


def run_multihop(cfg: MultihopConfig, out: str | Path, *, device: torch.device, seed: int = 0,
                 executor: Executor | None = None) -> dict:
    """``mechfact facts multihop``: same d, width and budget; direct vs CoT accuracy per k (all chains),
    one job per (k, mode)."""
    cfg.check_cost()  # before the run directory: a refused run writes nothing
    run = RunDir(out, cfg, kind="facts.multihop", seed=seed, device=str(device))
    result = run.read_result({"points": []})
    done = {(p["hops"], p["mode"]) for p in result["points"]}
    todo = [(k, mode) for k in sorted(set(cfg.hops)) for mode in (("direct", "cot") if k > 1 else ("direct",))
            if (k, mode) not in done]
    # one training checkpoint per point, tagged with the run's config hash (config.json is written with the first
    # result, so a run that fails leaves no config behind), deleted once the point is written; none where a
    # cluster's workers may not see this folder
    ckpt = {key: run.path / point_checkpoint(*key) if on_this_machine(executor) else None for key in todo}
    tag = run.sha256  # a plain string in the jobs' closures (Ray pickles them; the RunDir holds a lock)
    jobs = [Job(key=f"hops={k} {mode}", cost=k * (2 if mode == "cot" else 1),
                fn=lambda k=k, mode=mode: _multihop_point(cfg, k, mode, device, seed, ckpt[k, mode], tag))
            for k, mode in todo]

    def on_result(job: Job, point: dict) -> None:
        result["points"].append(point)
        result["points"].sort(key=lambda p: (p["hops"], p["mode"]))
        run.write_result(result)
        if ckpt[point["hops"], point["mode"]] is not None:
            ckpt[point["hops"], point["mode"]].unlink(missing_ok=True)

    (executor or LocalExecutor(desc="facts multihop")).map(jobs, on_result)
    result.update(subjects=cfg.subjects, relations=cfg.relations, d=cfg.d, mlp_width=cfg.mlp_width)
    from .plots import plot_multihop

    return run.finish(result, plot_multihop, "fig_multihop.png")
