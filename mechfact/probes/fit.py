"""A small full-batch trainer the probes need: train a chosen subset of tensors, optionally with an L2 penalty.

Used by freeze-and-swap (retrain only the subject embeddings, everything else
frozen) and by the training-regime study in ``probes/``. Unlike
:func:`mechfact.facts.train` it supports a COUPLED L2 penalty
``(l2 / 2) * sum ||theta||^2`` added to the loss (Adam sees its gradient), whose
stationary points satisfy ``grad loss = -l2 * theta``: for the subject
embeddings that makes each embedding a sum of back-propagated attribute
vectors, i.e. a superposition (see docs/results_probes.md). Decoupled AdamW
decay (``decoupled_wd``) is available for comparison.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..config import DictConfig
from ..device import flush_denormals
from ..facts.losses import logit_squared_error
from ..facts.train import LOSSES
from ..seeding import generator
from .queries import logits_of

logger = logging.getLogger(__name__)


@dataclass
class FitConfig(DictConfig):
    lr: float = 1e-2  # learning rate
    optimizer: str = "adam"  # adam | sgd (heavy-ball momentum 0.9; updates stay linear in the gradients)
    steps: int = 2000  # optimisation steps (full batch unless batch_size)
    l2: float = 0.0  # coupled L2 penalty on the trained tensors (in the loss)
    decoupled_wd: float = 0.0  # AdamW decoupled weight decay (alternative to l2)
    target_accuracy: float | None = None  # stop once train accuracy >= this; None = all steps
    eval_every: int = 100  # steps between accuracy records
    batch_size: int | None = None  # None = full batch
    seed: int = 0
    loss: str = "ce"  # ce (cross-entropy) | mse (squared error of the logits against target_logit * one-hot)
    target_logit: float = 1.0  # the correct answer's target logit under loss="mse" (every other logit: 0)

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r}: allowed {LOSSES}")
        if self.loss == "mse" and not self.target_logit > 0:
            raise ValueError(f"target_logit={self.target_logit}: must be positive")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"optimizer={self.optimizer!r}: allowed adam, sgd")
        if not self.lr > 0 or self.steps < 0 or self.l2 < 0 or self.decoupled_wd < 0 or self.eval_every < 1:
            raise ValueError(f"bad FitConfig {self.to_dict()}: need lr > 0, steps >= 0, l2 >= 0, "
                             "decoupled_wd >= 0, eval_every >= 1")


def answer_loss(logits: torch.Tensor, answer_pos: torch.Tensor, targets: torch.Tensor, loss: str = "ce",
                target_logit: float = 1.0) -> torch.Tensor:
    """Loss of the logits at the answer positions: mean cross-entropy, or (``loss="mse"``) the squared error
    against ``target_logit`` on the answer and 0 elsewhere, summed over the vocabulary and averaged over queries.
    The squared loss has a finite minimiser (a fixed margin), unlike cross-entropy, whose logits grow forever."""
    z = logits[torch.arange(logits.shape[0], device=logits.device), answer_pos]
    if loss == "mse":
        return logit_squared_error(z, targets, target_logit)
    return F.cross_entropy(z, targets)


def fit(params: list[torch.Tensor], forward, answer_pos, targets, cfg: FitConfig,
        l2_params: list[torch.Tensor] | None = None) -> list[dict]:
    """Minimise cross-entropy at the answer positions over ``params`` only.

    ``forward(idx) -> logits`` (batch, pos, vocab) of the queries ``idx`` (a
    slice or index tensor). Returns the history ``[{"step", "loss",
    "accuracy"}]`` (accuracy on the full training set). ``cfg.l2`` applies to
    ``l2_params`` (default: all of ``params``).
    """
    flush_denormals()
    l2_params = params if l2_params is None else l2_params
    if cfg.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=cfg.lr, momentum=0.9, weight_decay=cfg.decoupled_wd)
    else:
        opt = (torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.decoupled_wd) if cfg.decoupled_wd
               else torch.optim.Adam(params, lr=cfg.lr))
    g = generator(cfg.seed, "probes.fit.batch")
    n = targets.shape[0]
    history: list[dict] = []

    def record(step: int, loss: float) -> float:
        with torch.no_grad():
            logits = logits_of(forward(slice(None)))
            acc = float((logits[torch.arange(n), answer_pos].argmax(-1) == targets).double().mean())
        history.append({"step": step, "loss": loss, "accuracy": acc})
        return acc

    record(0, float("nan"))
    for step in tqdm(range(1, cfg.steps + 1), desc="fit", leave=False):
        idx = slice(None) if cfg.batch_size is None or cfg.batch_size >= n else \
            torch.randint(n, (cfg.batch_size,), generator=g)
        opt.zero_grad(set_to_none=True)
        loss = answer_loss(logits_of(forward(idx)), answer_pos[idx], targets[idx], cfg.loss, cfg.target_logit)
        total = loss + 0.5 * cfg.l2 * sum((p * p).sum() for p in l2_params) if cfg.l2 else loss
        total.backward()
        opt.step()
        if step % cfg.eval_every == 0 or step == cfg.steps:
            acc = record(step, float(loss.detach()))
            if cfg.target_accuracy is not None and acc >= cfg.target_accuracy:
                break
    return history


def train_fact_model(model, world, cfg: FitConfig, device="cpu", freeze: tuple[str, ...] = (),
                     l2_only: tuple[str, ...] = ()) -> list[dict]:
    """Train every trainable tensor of a one-layer FactModel on all single-hop facts of ``world``.

    The forward computes logits at the answer position only (half the work of
    ``model(tokens)``); ``cfg.l2`` is the coupled L2 penalty of the geometric
    regime (docs/results_probes.md); ``freeze`` names parameters kept at their
    current values (e.g. ``("W_U_ent",)``: a fixed random unembedding);
    ``l2_only`` restricts the L2 penalty to the named parameters (default: all trained).
    """
    from torch.nn.functional import embedding

    q = world.single_hop()
    tokens, targets = q.tokens.to(device), q.answers.to(device)
    model.to(device).train()

    def forward(idx):
        tok = tokens[idx]
        x = model.hook_embed(embedding(tok, model.W_E))
        if model.cfg.n_ctx:
            x = x + model.hook_pos_embed(model.W_pos[: tok.shape[1]].expand_as(x))
        x = model.blocks[0](x)
        return model.ln_final(x[:, -1:]) @ model.W_U

    names = {n for n, _ in model.named_parameters()}
    unknown = (set(freeze) | set(l2_only)) - names
    if unknown:
        raise ValueError(f"freeze / l2_only: unknown parameters {sorted(unknown)}; the model has {sorted(names)}")
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad and n not in freeze]
    hist = fit([p for _, p in trained], forward, torch.zeros(len(q), dtype=torch.long, device=device), targets, cfg,
               l2_params=[p for n, p in trained if n in l2_only] if l2_only else None)
    model.eval()
    return hist
