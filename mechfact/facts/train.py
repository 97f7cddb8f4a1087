"""Train a FactModel on the facts of a world (Adam on next-entity cross-entropy, or squared error).

``train`` supports a learning-rate schedule, early stopping at a target
accuracy, giving up after ``patience`` steps without a better accuracy, and
checkpoint / resume: pass ``checkpoint=`` a callable that persists the state
dict it receives (see :func:`train`); pass that state back as ``resume=`` and
training continues bit-for-bit where it stopped (same device).

It is THE trainer of :class:`~mechfact.facts.model.FactModel`: the training
regimes (:mod:`mechfact.facts.regimes`) and the freeze-and-swap retraining
(:mod:`mechfact.probes.swap`) use it too, through ``freeze`` (tensors kept at
their current values), ``l2_only`` (where the coupled L2 applies) and the
squared loss.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..config import DictConfig, bad, check_choice, check_float, check_int
from ..device import flush_denormals, resolve_device
from ..seeding import generator
from .evaluate import EvalResult, check_compatible, evaluate, supervised_logits
from .losses import linear_cross_entropy, linear_squared_error, logit_squared_error
from .model import FactModel
from .world import IGNORE, FactWorld, Queries

logger = logging.getLogger(__name__)

SCHEDULES = ("constant", "cosine", "warmup-cosine")
LOSSES = ("ce", "mse")
MAX_LR = 1e30  # Adam's first step is 10 lr: larger rates overflow float32 (and mean nothing)
MAX_STEPS = 10**9  # a larger step budget is a typo
EXPLODED = 1e6  # a loss this many times its value before the first update (or 1) is a diverged training
EVAL_BATCH = 8192  # queries per batch of :func:`~mechfact.facts.evaluate.evaluate` (its default)


@dataclass
class TrainConfig(DictConfig):
    """Optimisation of a FactModel; the model's own init seed lives in FactModelConfig."""

    lr: float = 1e-2  # Adam learning rate (peak, for the schedules)
    steps: int = 2000  # maximum number of optimisation steps
    batch_size: int | None = None  # queries per step; None = full batch
    target_accuracy: float | None = 1.0  # stop early once train accuracy >= this; None = run all steps
    eval_every: int = 25  # steps between accuracy checks (early stop + history)
    weight_decay: float = 0.0  # AdamW-style decoupled decay when > 0
    seed: int = 0  # minibatch sampling
    schedule: str = "constant"  # constant | cosine (to 0 at `steps`) | warmup-cosine (5% linear warm-up)
    patience: int = 0  # give up after this many steps without a new best accuracy; 0 = never
    loss: str = "ce"  # ce: cross-entropy | mse: squared error of the logits against target_logit * one-hot
    target_logit: float = 1.0  # the answer's target logit under loss="mse" (all others: 0)
    l2: float = 0.0  # coupled L2 penalty (l2 / 2) * sum ||theta||^2 on every trained tensor, added to the loss
    freeze: list[str] = field(default_factory=list)  # parameter names kept at their current values
    l2_only: list[str] = field(default_factory=list)  # the coupled L2 applies to these parameters only ([] = all trained)

    def __post_init__(self) -> None:
        check_float("lr", self.lr, lo=0, lo_open=True, hi=MAX_LR)
        check_int("steps", self.steps, 0, MAX_STEPS)
        if self.batch_size is not None:
            check_int("batch_size", self.batch_size, 1)
        if self.target_accuracy is not None:
            check_float("target_accuracy", self.target_accuracy, lo=0, hi=1, lo_open=True)
        check_int("eval_every", self.eval_every, 1, MAX_STEPS)
        check_float("weight_decay", self.weight_decay, lo=0)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_int("patience", self.patience, 0, MAX_STEPS)
        check_choice("loss", self.loss, LOSSES)
        check_float("target_logit", self.target_logit, lo=0, lo_open=True)
        check_float("l2", self.l2, lo=0)
        self.freeze, self.l2_only = list(self.freeze), list(self.l2_only)
        if set(self.freeze) & set(self.l2_only):
            raise bad("l2_only", self.l2_only, f"names frozen parameters {sorted(set(self.freeze) & set(self.l2_only))}")

    def lr_factor(self, step: int) -> float:
        """Multiplier of ``lr`` at optimisation step ``step`` (1-based)."""
        if self.schedule == "constant" or self.steps <= 1:
            return 1.0
        warm = max(1, self.steps // 20) if self.schedule == "warmup-cosine" else 0
        if step <= warm:
            return step / warm
        t = (step - warm) / max(1, self.steps - warm)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))


@dataclass(frozen=True)
class TrainResult(EvalResult):
    """:class:`EvalResult` on the training queries after the last step, with how training went: ``loss`` (last
    evaluated step), ``steps`` (taken), ``stopped`` (``target`` | ``patience`` | ``budget``), ``history``
    (``{"step", "loss", "accuracy"}`` every ``eval_every`` steps)."""

    loss: float = float("nan")
    steps: int = 0
    stopped: str = "budget"
    history: list = field(default_factory=list)


def train_cost(model_cfg, n_queries: int, positions: int, supervised: int = 1, batch_size: int | None = None
               ) -> tuple[float, str]:
    """Estimated peak bytes of :func:`train` for a model of config ``model_cfg`` (a FactModelConfig) on
    ``n_queries`` queries of ``positions`` tokens with ``supervised`` answers each (measured on CPU: within
    ~1.3x), and what dominates them, in words.

    Terms: the weights with their gradients and Adam's two moments; the input-embedding table the forward pass
    concatenates, and its gradient; the activations of one step (about ``pos (10 d + 4 m) + 2 pos^2`` floats per
    query of the batch, more with learned attention and LayerNorm); the query tensors; and the evaluation, whose
    batches of up to 8192 queries score every entity: ``8192 x supervised x N`` logits.
    """
    N, d, m, P = getattr(model_cfg, "outputs", model_cfg.n_entities), model_cfg.d, model_cfg.mlp_width, positions
    total, trainable = model_cfg.n_weights()
    f = 4.0
    terms = {"the weights, their gradients and Adam's moments": f * (total + 3 * trainable + 2 * model_cfg.vocab_size * d),
             "the query tensors": 8.0 * n_queries * (3 * P + 4)}  # tokens, targets, ... (int64) + building them
    per_query = P * (10 * d + 4 * m) + 2 * P * P
    if model_cfg.attention == "learned":
        per_query += 2 * P * d + 3 * P * P
    if model_cfg.layer_norm:
        per_query += 3 * P * d
    B = n_queries if batch_size is None else min(batch_size, n_queries)
    E = min(EVAL_BATCH, n_queries)
    step = f * B * per_query
    evaluation = f * E * (supervised * N * 1.1 + P * (4 * d + 2 * m))
    if step >= evaluation:
        terms[f"the activations of {B} queries per step"] = step
    else:
        terms[f"the evaluation's {E} x {N} logits"] = evaluation
    return sum(terms.values()), max(terms, key=terms.get)


def train_bytes(model_cfg, n_queries: int, positions: int, supervised: int = 1, batch_size: int | None = None
                ) -> float:
    """Estimated peak bytes of :func:`train` (:func:`train_cost` without the words)."""
    return train_cost(model_cfg, n_queries, positions, supervised, batch_size)[0]


def loss_fn(model: FactModel, tokens: torch.Tensor, targets: torch.Tensor, loss: str = "ce",
            target_logit: float = 1.0) -> torch.Tensor:
    """Mean loss over supervised positions (only those are unembedded): cross-entropy, or for ``loss="mse"``
    the squared error of the entity logits against ``target_logit`` on the answer and 0 elsewhere."""
    sup = targets != IGNORE
    if hasattr(model, "supervised_resid"):  # never materialises the (queries, N) logits
        h = model.supervised_resid(tokens, sup)
        if loss == "mse":
            return linear_squared_error(h, model.W_U, targets[sup], target_logit)
        return linear_cross_entropy(h, model.W_U, targets[sup])
    logits = supervised_logits(model, tokens, sup)
    if loss == "mse":
        return logit_squared_error(logits, targets[sup], target_logit)
    return F.cross_entropy(logits, targets[sup])


def train(model: FactModel, world: FactWorld, cfg: TrainConfig, device: str | torch.device = "cpu",
          queries: Queries | None = None, *, checkpoint: Callable[[dict], None] | None = None,
          checkpoint_every: int = 500, resume: dict | None = None, progress: bool = False) -> TrainResult:
    """Fit ``model`` in place on ``queries`` (default: all single-hop facts).

    Returns a :class:`TrainResult` (also read as a dict): ``accuracy``, ``per_relation``,
    ``token_accuracy`` (final, on the training queries), ``loss`` (last step), ``steps`` (taken),
    ``stopped`` (``target`` | ``patience`` | ``budget``) and ``history`` (a list of
    ``{"step", "loss", "accuracy"}`` every ``eval_every`` steps).

    ``checkpoint(state)`` is called every ``checkpoint_every`` steps (rounded to
    an evaluation step) with ``{"step", "optimizer", "generator", "history",
    "best", "best_step"}``; the caller saves it together with the model weights.
    ``resume=state`` (with the model already holding the saved weights)
    continues from there. ``cfg.freeze`` names parameters left untouched;
    ``cfg.l2_only`` restricts the coupled L2 to the named parameters. Gradient
    flags of the model are left as they were. ``progress`` shows a bar.
    """
    check_compatible(model, world)
    device = resolve_device(device) if isinstance(device, str) else device
    queries = world.single_hop() if queries is None else queries
    flush_denormals()
    model.to(device).train()
    tokens, targets = queries.tokens.to(device), queries.targets.to(device)
    n = len(queries)
    names = dict(model.named_parameters())
    unknown = sorted((set(cfg.freeze) | set(cfg.l2_only)) - set(names))
    if unknown:
        raise ValueError(f"freeze / l2_only: unknown parameters {unknown}; the model has {sorted(names)}")
    trained = [(n, p) for n, p in names.items() if p.requires_grad and n not in cfg.freeze]
    params = [p for _, p in trained]
    l2_params = [p for n, p in trained if n in cfg.l2_only] if cfg.l2_only else params
    if not params:
        raise ValueError("nothing to train: every parameter is frozen or has requires_grad=False")
    opt = (torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay) if cfg.weight_decay
           else torch.optim.Adam(params, lr=cfg.lr))
    g = generator(cfg.seed, "facts.train.batch")
    history: list[dict] = []
    start, best, best_step = 0, -1.0, 0
    if resume is not None:
        opt.load_state_dict(resume["optimizer"])
        g.set_state(resume["generator"])
        history = list(resume["history"])
        start, best, best_step = int(resume["step"]), float(resume["best"]), int(resume["best_step"])
    step, stopped, loss, first = start, "budget", float("nan"), None
    if history and cfg.target_accuracy is not None and history[-1]["accuracy"] >= cfg.target_accuracy:
        stopped = "target"  # resumed after the stop was already reached
    last_ckpt = start
    bar = tqdm(range(start + 1, cfg.steps + 1), desc="train facts", leave=False,
               **({} if progress else {"disable": True}))
    frozen = [p for n, p in names.items() if n in cfg.freeze and p.requires_grad]
    for p in frozen:  # no gradients for frozen tensors; the flags are restored below
        p.requires_grad_(False)
    try:
        for step in bar if stopped == "budget" else ():
            if cfg.batch_size is None or cfg.batch_size >= n:
                bt, bg = tokens, targets
            else:
                idx = torch.randint(n, (cfg.batch_size,), generator=g).to(device)
                bt, bg = tokens[idx], targets[idx]
            for group in opt.param_groups:
                group["lr"] = cfg.lr * cfg.lr_factor(step)
            opt.zero_grad(set_to_none=True)
            loss_t = loss_fn(model, bt, bg, cfg.loss, cfg.target_logit)
            total = loss_t + 0.5 * cfg.l2 * sum((p * p).sum() for p in l2_params) if cfg.l2 else loss_t
            if first is None:  # the loss before any update of this call (one sync): the scale divergence is judged by
                first = float(loss_t.detach())
            total.backward()
            opt.step()
            if step % cfg.eval_every == 0 or step == cfg.steps:
                loss = float(loss_t.detach())
                # NaN / inf, or a finite loss grown a million-fold (some torch builds saturate at ~1e37 instead of NaN)
                if not math.isfinite(loss) or loss > EXPLODED * max(1.0, first if math.isfinite(first) else 1.0):
                    raise ValueError(f"training diverged: the loss is {loss:g} at step {step} "
                                     f"(--lr {cfg.lr:g} too high?)")
                acc = evaluate(model, world, queries)["accuracy"]
                history.append({"step": step, "loss": loss, "accuracy": acc})
                bar.set_postfix(loss=f"{loss:.3g}", acc=f"{acc:.3f}")
                if acc > best:
                    best, best_step = acc, step
                if cfg.target_accuracy is not None and acc >= cfg.target_accuracy:
                    logger.info("reached accuracy %.4f at step %d", acc, step)
                    stopped = "target"
                elif cfg.patience and step - best_step >= cfg.patience:
                    logger.info("no better accuracy than %.4f for %d steps; stopping at step %d", best, cfg.patience, step)
                    stopped = "patience"
                if checkpoint is not None and (stopped != "budget" or step - last_ckpt >= checkpoint_every
                                               or step == cfg.steps):
                    checkpoint({"step": step, "optimizer": opt.state_dict(), "generator": g.get_state(),
                                "history": history, "best": best, "best_step": best_step})
                    last_ckpt = step
                if stopped != "budget":
                    break
    finally:
        for p in frozen:
            p.requires_grad_(True)
    bar.close()
    if history:
        loss = history[-1]["loss"]
    res = evaluate(model, world, queries)
    return TrainResult(**res, loss=loss, steps=step, stopped=stopped, history=history)


# ---- checkpointed training ---------------------------------------------------------------------------

CHECKPOINT_KEYS = ("step", "optimizer", "generator", "history", "best", "best_step")


def load_checkpoint(path: Path, model: FactModel) -> dict:
    """The training state saved at ``path`` by :func:`save_checkpoint`, its weights loaded into ``model``; a clear
    error (naming the file and what to do) for a truncated or foreign file."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_weights(state.pop("model"), source=str(path))
        if not set(CHECKPOINT_KEYS) <= set(state):
            raise KeyError(f"missing keys {sorted(set(CHECKPOINT_KEYS) - set(state))}")
    except Exception as e:  # truncated file, pickle error, wrong shapes, missing keys
        raise ValueError(f"{path}: corrupted checkpoint ({type(e).__name__}: {str(e)[:200]}); "
                         "delete it to restart training from scratch") from e
    return state


def save_checkpoint(path: Path, model: FactModel, state: dict) -> None:
    """``model``'s weights (on the CPU) with :func:`train`'s checkpoint ``state``, written atomically."""
    from ..runs import atomic_path

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        torch.save({"model": {k: v.detach().cpu() for k, v in model.state_dict().items()}, **state}, tmp)


def train_resumable(model: FactModel, world: FactWorld, cfg: TrainConfig, path: Path | None,
                    device: str | torch.device = "cpu", queries: Queries | None = None, *,
                    checkpoint_every: int = 500, after_checkpoint: Callable[[dict], None] | None = None,
                    tag: str = "") -> tuple[TrainResult, float]:
    """:func:`train` that saves its state to ``path`` every ``checkpoint_every`` steps (and when it stops) and,
    when ``path`` exists, resumes from it: a run killed mid-training loses at most ``checkpoint_every`` steps,
    and a resumed run ends with the numbers of an uninterrupted one (full-batch training; minibatches resume
    their generator). Returns the result and the training seconds already spent by earlier processes (up to
    their last checkpoint), which the caller adds to its own time. The caller deletes ``path`` once its results
    are written. ``tag`` (e.g. the hash of what is trained) is saved with the state, and a checkpoint saved under
    another tag is refused, naming the file: a folder reused for other work never resumes the wrong model. A
    training that fails (diverges) deletes its checkpoint: resuming it would fail again.
    ``after_checkpoint(state)`` is called after each save (a test hook). ``path`` None: plain :func:`train`
    (where no checkpoint can be kept), ``(result, 0.0)``."""
    import time

    if path is None:
        return train(model, world, cfg, device=device, queries=queries), 0.0
    path = Path(path)
    resume = load_checkpoint(path, model) if path.exists() else None
    if resume is not None and resume.pop("tag", "") != tag:
        raise ValueError(f"{path}: a checkpoint of other work (another config); delete it to train from scratch")
    before = float(resume.pop("elapsed_s", 0.0)) if resume is not None else 0.0
    if resume is not None:
        logger.info("resuming from %s at step %d", path, resume["step"])
    t0 = time.time()

    def save(state: dict) -> None:
        save_checkpoint(path, model, {**state, "elapsed_s": before + time.time() - t0, "tag": tag})
        if after_checkpoint is not None:
            after_checkpoint(state)

    try:
        res = train(model, world, cfg, device=device, queries=queries, checkpoint=save,
                    checkpoint_every=checkpoint_every, resume=resume)
    except ValueError:
        path.unlink(missing_ok=True)
        raise
    return res, before
