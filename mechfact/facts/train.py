"""Train a FactModel on the facts of a world (Adam on next-entity cross-entropy)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..config import DictConfig
from ..device import resolve_device
from ..seeding import generator
from .evaluate import check_compatible, evaluate
from .model import FactModel
from .world import IGNORE, FactWorld, Queries

logger = logging.getLogger(__name__)


@dataclass
class TrainConfig(DictConfig):
    """Optimisation of a FactModel; the model's own init seed lives in FactModelConfig."""

    lr: float = 1e-2  # Adam learning rate
    steps: int = 2000  # maximum number of optimisation steps
    batch_size: int | None = None  # queries per step; None = full batch
    target_accuracy: float | None = 1.0  # stop early once train accuracy >= this; None = run all steps
    eval_every: int = 25  # steps between accuracy checks (early stop + history)
    weight_decay: float = 0.0  # AdamW-style decoupled decay when > 0
    seed: int = 0  # minibatch sampling

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr}: must be positive")
        if self.steps < 0:
            raise ValueError(f"steps={self.steps}: must be >= 0")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size}: must be a positive integer or None (full batch)")
        if self.target_accuracy is not None and not 0.0 < self.target_accuracy <= 1.0:
            raise ValueError(f"target_accuracy={self.target_accuracy}: must lie in (0, 1] or be None")
        if self.eval_every < 1:
            raise ValueError(f"eval_every={self.eval_every}: must be a positive integer")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay={self.weight_decay}: must be >= 0")



def loss_fn(model: FactModel, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over supervised positions."""
    logits = model(tokens)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


def train(model: FactModel, world: FactWorld, cfg: TrainConfig, device: str | torch.device = "cpu",
          queries: Queries | None = None) -> dict:
    """Fit ``model`` in place on ``queries`` (default: all single-hop facts).

    Returns ``accuracy``, ``per_relation``, ``token_accuracy`` (final, on the
    training queries), ``loss`` (last step), ``steps`` (taken) and ``history``
    (a list of ``{"step", "loss", "accuracy"}`` every ``eval_every`` steps).
    """
    check_compatible(model, world)
    device = resolve_device(device) if isinstance(device, str) else device
    queries = world.single_hop() if queries is None else queries
    model.to(device).train()
    tokens, targets = queries.tokens.to(device), queries.targets.to(device)
    n = len(queries)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = (torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay) if cfg.weight_decay
           else torch.optim.Adam(params, lr=cfg.lr))
    g = generator(cfg.seed, "facts.train.batch")
    history: list[dict] = []
    step = 0
    bar = tqdm(range(1, cfg.steps + 1), desc="train facts", leave=False)
    for step in bar:
        if cfg.batch_size is None or cfg.batch_size >= n:
            bt, bg = tokens, targets
        else:
            idx = torch.randint(n, (cfg.batch_size,), generator=g).to(device)
            bt, bg = tokens[idx], targets[idx]
        opt.zero_grad(set_to_none=True)
        loss_t = loss_fn(model, bt, bg)
        loss_t.backward()
        opt.step()
        if step % cfg.eval_every == 0 or step == cfg.steps:
            loss = float(loss_t.detach())
            acc = evaluate(model, world, queries)["accuracy"]
            history.append({"step": step, "loss": loss, "accuracy": acc})
            bar.set_postfix(loss=f"{loss:.3g}", acc=f"{acc:.3f}")
            if cfg.target_accuracy is not None and acc >= cfg.target_accuracy:
                logger.info("reached accuracy %.4f at step %d", acc, step)
                break
    bar.close()
    loss = float(loss_t.detach()) if step else float("nan")
    res = evaluate(model, world, queries)
    return {**res, "loss": loss, "steps": step, "history": history}
