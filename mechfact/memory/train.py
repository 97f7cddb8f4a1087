"""Gradient training of linear memories: :class:`MemoryTrainConfig`, :func:`train` and its memory estimate.

``trained``: full-batch Adam on cross-entropy over all p outputs, many runs
of one shape trained together as one batched computation (instances of
different p are padded). With kappa < 1, W = Q R^T. The step is fused: each
input's loss over all its competitors, the recall check and the gradient with
respect to v_mu = W e_mu are formed in one pass over cache-sized chunks of
rows (see :class:`mechfact.memory.fused._FusedRows`), without padding masks or concatenations.
Training stops for a run as soon as it recalls every association (capacity
is about perfect recall); the W with the best accuracy seen is returned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..config import DictConfig, check_choice, check_float, check_int
from .fused import CHUNK_BYTES, _FusedRows
from .hebb import rank_of
from .problems import MemoryProblem, scores


LOSSES = ("ce", "ce-margin", "hinge2")
MAX_LR = 1e30  # Adam's first step is 10 lr: larger rates overflow float32 (and mean nothing)
MAX_STEPS = 10**9  # a larger step budget is a typo (and overflows the int64 step counters)
DIVERGENCE_CHECK_EVERY = 20  # steps between checks that the loss is finite (one host sync each)


def diverged(loss: float, step: int, flag_value: str) -> ValueError:
    """The one-line error of a training whose loss became NaN / inf: ``flag_value`` is the lr flag, e.g. ``--lr 1``."""
    return ValueError(f"training diverged: the loss is {loss:g} at step {step} ({flag_value} too high?)")


@dataclass
class MemoryTrainConfig(DictConfig):
    """Gradient training of a linear memory (:func:`train`); validated on construction."""

    lr: float = 1.0  # Adam learning rate (full batch); measured: 1.0 reaches perfect recall fastest near capacity
    steps: int = 5000  # step budget per run
    init_scale: float = 1.0  # W0 entries ~ N(0, init_scale^2 / d) (Gaussian, quarter-circle spectrum)
    lr_decay: bool = False  # cosine decay of the lr over `steps` (measured: hurts near capacity)
    loss: str = "ce"  # "ce": cross-entropy over all p outputs; "ce-margin": CE on logits with the
    #                   target lowered by `margin` (forces a margin at a fixed scale); "hinge2": squared
    #                   multiclass hinge sum_rho relu(margin - (s_target - s_rho))^2 (convex, zero iff separable)
    margin: float = 1.0  # margin used by "ce-margin" and "hinge2"
    early_stop: bool = True  # stop a run at its first perfect recall (capacity); False trains the full budget
    patience: int = 1500  # give up on a run whose error count has not reached a new minimum for this many steps
    #                       (0: never)
    active_set: int = 0  # if > 0: CE over each input's K strongest competitors, refreshed (with an exact
    #                      perfect-recall check on all competitors) every `refresh` steps; 0 = all competitors
    refresh: int = 20  # steps between active-set refreshes
    dp_memory_gb: float = 4.0  # max GB of dense DP competitors held per batch

    def __post_init__(self) -> None:
        check_float("lr", self.lr, lo=0, lo_open=True, hi=MAX_LR)
        check_int("steps", self.steps, 1, MAX_STEPS)
        check_float("init_scale", self.init_scale, lo=0, lo_open=True)
        check_choice("loss", self.loss, LOSSES)
        check_float("margin", self.margin)
        check_int("patience", self.patience, 0, MAX_STEPS)
        check_int("active_set", self.active_set, 0)
        check_int("refresh", self.refresh, 1, MAX_STEPS)
        check_float("dp_memory_gb", self.dp_memory_gb, lo=0, lo_open=True)


def train_bytes(kind: str, d: int, p: int, n_problems: int = 1, kappa: float = 1.0, active_set: int = 0,
                device: str = "cpu") -> float:
    """Estimated peak bytes of :func:`train` on ``n_problems`` problems of size up to ``p``. Dominant terms: the
    (B, p, p) float32 scores and their copies in the loss and its backward (about 6.5 of them; 3 with an active
    set) -- on CPU without an active set the fused pass holds one cache-sized chunk of them at a time, and what
    remains grows as ~1 byte per (B, p, p) entry (measured: 21 MB at p = 3000, B = 2; 116 MB at p = 8000;
    36 MB at p = 3000, B = 4, d = 64, but the same run can peak anywhere in 19-71 MB) -- the dense (B, p, p-1, d)
    decoupled competitors (generated once on CPU: 71 MB measured at p = 1000, d = 16; held twice on a GPU while
    they are re-packed), and about 13 (d, d) matrices per problem (W, its gradient, Adam's moments, the best
    and initial W)."""
    B, P, f = int(n_problems), int(p), 4.0
    m = max(1, int(round(kappa * d)))
    K = active_set if active_set and active_set < P - 1 else 0
    sq = f * B * P * P
    need = f * B * (13 * d * d + (6 * d * m if m < d else 0))  # W, grads, Adam state, best / initial W
    need += f * B * P * d * 8  # E, T (padded and as generated), V and its gradient
    if device == "cpu" and not K and kind == "original":
        need += 0.25 * sq + 4 * CHUNK_BYTES  # the fused pass: chunks of scores; ~1 byte per (B, p, p) entry left
    else:
        need += (3 if K else 6.5) * sq  # scores, their masked copies, the loss's concatenation and backward
    if K:
        need += f * B * P * K * d * 3  # gathered active candidates and their gradient
    if kind == "decoupled":  # dense competitors (GPU: + one problem's copy / a re-packed subset)
        need += (1 if device == "cpu" else 2) * f * B * P * (P - 1) * d
    return need + 4096.0 * B  # per-problem Python objects



@dataclass(frozen=True)
class TrainOutput:
    """What :func:`train` returns for a batch of problems; ``records``: one row per problem."""

    W: list[Tensor]  # one (d, d) matrix per problem
    accuracy: list[float]  # accuracy of the returned W
    steps: list[int]  # steps taken until perfect recall (or the budget)
    W_init: list[Tensor] = field(default_factory=list)

    @property
    def records(self) -> list[dict]:
        return [{"problem": i, "accuracy": a, "steps": s} for i, (a, s) in enumerate(zip(self.accuracy, self.steps))]

    def to_dict(self) -> dict:
        """The numbers (the matrices stay in ``W`` / ``W_init``)."""
        return {"accuracy": list(self.accuracy), "steps": list(self.steps)}


def _pad(rows: list[Tensor], P: int) -> Tensor:
    out = torch.zeros(len(rows), P, *rows[0].shape[1:], dtype=rows[0].dtype)
    for b, r in enumerate(rows):
        out[b, : r.shape[0]] = r
    return out



def train(problems: list[MemoryProblem], kappa: float = 1.0, cfg: MemoryTrainConfig | None = None,
          device: str | torch.device = "cpu", seed: int = 0) -> TrainOutput:
    """Train W for every problem in one batched computation.

    All problems must share kind and d; p may differ (padding). A run's numbers do not depend on the other
    runs of its batch beyond float32 rounding (tests/test_memory_solvers.py).
    """
    cfg = MemoryTrainConfig() if cfg is None else cfg
    if not isinstance(cfg, MemoryTrainConfig):
        raise TypeError(f"train() needs a MemoryTrainConfig, got {type(cfg).__name__}")
    if not problems:
        raise ValueError("train() needs at least one problem")
    kind, d = problems[0].kind, problems[0].d
    if any(pr.kind != kind or pr.d != d for pr in problems):
        raise ValueError("batched training needs problems of one kind and one d")
    m = rank_of(d, kappa)
    B, P = len(problems), max(pr.p for pr in problems)
    dev = torch.device(device)
    ps = torch.tensor([pr.p for pr in problems], device=dev)
    E = _pad([pr.inputs() for pr in problems], P).to(dev)
    T = _pad([pr.outputs() for pr in problems], P).to(dev)
    row_valid = torch.arange(P, device=dev)[None, :] < ps[:, None]  # (B, P)
    C_cpu = None  # decoupled: the dense competitors, generated once (training and the float64 re-check)
    if kind == "original":
        col_valid = row_valid
        C = None
    else:
        need = 4 * B * P * (P - 1) * d / 1e9
        if need > cfg.dp_memory_gb:
            raise ValueError(f"decoupled batch needs {need:.1f} GB of competitors (> dp_memory_gb={cfg.dp_memory_gb}); "
                             "use fewer runs per batch or raise dp_memory_gb")
        C_cpu = torch.empty(B, P, P - 1, d)
        for b, pr in enumerate(problems):
            pr.competitors(0, pr.p, out=C_cpu[b, : pr.p, : pr.p - 1])  # generated straight into the batch
            if pr.p < P:
                C_cpu[b, pr.p :].zero_()
                C_cpu[b, : pr.p, pr.p - 1 :].zero_()
        C = C_cpu.to(dev)
        col_valid = torch.arange(P - 1, device=dev)[None, :] < (ps[:, None] - 1)  # (B, P-1)

    # initialisation (seeded per problem so batching does not change a run)
    inits = []
    for pr in problems:
        g = torch.Generator().manual_seed(pr.seed * 7919 + pr.p * 31 + d + seed)
        if m == d:
            inits.append((cfg.init_scale * torch.randn(d, d, generator=g) / math.sqrt(d),))
        else:
            s = (cfg.init_scale**2 / (d * m)) ** 0.25
            inits.append((s * torch.randn(d, m, generator=g), s * torch.randn(d, m, generator=g)))
    if m == d:
        params = [torch.stack([i[0] for i in inits]).to(dev).requires_grad_()]
    else:
        params = [torch.stack([i[0] for i in inits]).to(dev).requires_grad_(),
                  torch.stack([i[1] for i in inits]).to(dev).requires_grad_()]

    def weight() -> Tensor:
        return params[0] if m == d else params[0] @ params[1].transpose(1, 2)

    W_init = [w.detach().cpu().clone() for w in weight()]
    opt = torch.optim.Adam(params, lr=cfg.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.steps) if cfg.lr_decay else None
    best_acc = torch.full((B,), -1.0, device=dev)
    best_W = weight().detach().clone()
    steps = torch.full((B,), cfg.steps, dtype=torch.long)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    best_err = torch.full((B,), P + 1, dtype=torch.long, device=dev)
    last_gain = torch.zeros(B, dtype=torch.long, device=dev)
    idx = torch.arange(B, device=dev)  # runs still training; tensors are re-packed when it shrinks
    act = idx.tolist()
    E_a, rv_a, ps_a = E, row_valid, ps
    K = cfg.active_set if cfg.active_set and cfg.active_set < P - 1 else 0
    fused = _FusedRows(kind, T, C, [pr.p for pr in problems], cfg.loss, cfg.margin) if K == 0 else None
    # active-set mode only: the full (b, P, P-1) competitor scores at each refresh, the loss on a gathered subset
    T_a, C_a, cv_a = T, C, col_valid
    neg = torch.finfo(torch.float32).min / 4
    eye = torch.eye(P, dtype=torch.bool, device=dev)[None] if K else None
    top = None  # (b, P, K) indices of each input's strongest competitors (active-set mode)

    def full_scores(V):
        if kind == "original":
            S = torch.bmm(V, T_a.transpose(1, 2))  # (b, P, P): S[b, mu, rho] = u_rho . v_mu
            S = S.masked_fill(~cv_a[:, None, :], neg)
            return torch.diagonal(S, dim1=1, dim2=2), S.masked_fill(eye, neg)
        b_, P_, K_ = C_a.shape[:3]  # (b, P, P-1, d) @ (b, P, d) as one bmm
        comp = torch.bmm(C_a.reshape(b_ * P_, K_, d), V.reshape(b_ * P_, d, 1)).view(b_, P_, K_)
        return (T_a * V).sum(-1), comp.masked_fill(~cv_a[:, None, :], neg)

    def active_scores(V):
        b_ = V.shape[0]
        rows = torch.arange(P, device=dev)[None, :, None]
        if kind == "original":
            cand = T_a[torch.arange(b_, device=dev)[:, None, None], top]  # (b, P, K, d)
        else:
            cand = C_a[torch.arange(b_, device=dev)[:, None, None], rows, top]  # (b, P, K, d)
        comp = torch.einsum("bpkd,bpd->bpk", cand, V)
        valid = torch.gather(cv_a[:, None, :].expand(-1, P, -1), 2, top)
        if kind == "original":
            valid &= top != rows  # an input's own output is its target, not a competitor
        return (T_a * V).sum(-1), comp.masked_fill(~valid, neg)

    for step in range(cfg.steps + 1):
        last = step == cfg.steps
        if K == 0:  # loss, check and d loss / d V in one fused pass; the gradient of W by hand (no autograd)
            with torch.no_grad():
                W = weight() if len(act) == B else weight()[idx]
                V = torch.bmm(E_a, W.transpose(1, 2))  # (b, P, d): v_mu = W e_mu
                per_input, ok, G = fused(V, act, not last)
            check = True
        else:
            W = weight()[idx]
            V = torch.bmm(E_a, W.transpose(1, 2))
            check = step % cfg.refresh == 0 or last
            if check:  # exact check on all competitors, then refresh the active set
                with torch.no_grad():
                    tgt, comp_all = full_scores(V)
                    top = comp_all.topk(K, dim=-1).indices
                    ok = (tgt > comp_all.amax(-1)) & rv_a
        if not check:
            finished = torch.zeros(len(idx), dtype=torch.bool, device=dev)
        else:
            with torch.no_grad():
                acc = ok.sum(1).float() / ps_a
                improved = (acc >= best_acc[idx]) if not cfg.early_stop else (acc > best_acc[idx])
                if improved.any():
                    best_acc[idx[improved]] = acc[improved]
                    best_W[idx[improved]] = W.detach()[improved]
                finished = (acc >= 1.0) if cfg.early_stop else torch.zeros_like(improved)
                if cfg.patience and cfg.early_stop:
                    err = (rv_a & ~ok).sum(1)
                    gained = err < best_err[idx]
                    best_err[idx[gained]] = err[gained]
                    last_gain[idx[gained]] = step
                    finished = finished | (step - last_gain[idx] >= cfg.patience)
                any_finished = bool(finished.any())
                if any_finished:
                    for b in idx[finished].tolist():
                        steps[b] = step
                    done[idx[finished]] = True
        if last or (check and any_finished and bool(done.all())):
            break
        opt.zero_grad(set_to_none=True)
        if K == 0:
            with torch.no_grad():
                w_run = (~finished).float() / ps_a  # d loss / d per_input: each run's mean over its p inputs
                if step % DIVERGENCE_CHECK_EVERY == 0:  # one host sync per check
                    loss = (per_input.sum(1) * w_run).sum()
                    if not bool(torch.isfinite(loss)):
                        raise diverged(float(loss), step, f"--lr {cfg.lr:g}")
                dW = torch.bmm(G.mul_(w_run[:, None, None]).transpose(1, 2), E_a)  # V = E W^T
                if len(act) < B:
                    dW = torch.zeros(B, d, d, device=dev).index_copy_(0, idx, dW)
                if m == d:
                    params[0].grad = dW
                else:  # W = Q R^T
                    params[0].grad = torch.bmm(dW, params[1])
                    params[1].grad = torch.bmm(dW.transpose(1, 2), params[0])
        else:  # loss on the active set only (the full set is checked at each refresh)
            tgt, comp_all = active_scores(V)
            if cfg.loss == "hinge2":
                per_input = torch.relu(cfg.margin - (tgt[..., None] - comp_all)).pow(2).sum(-1)
            else:
                shift = cfg.margin if cfg.loss == "ce-margin" else 0.0
                t_eff = tgt - shift
                per_input = torch.logsumexp(torch.cat([t_eff[..., None], comp_all], -1), -1) - t_eff
            loss_rows = (per_input * rv_a).sum(1) / ps_a  # mean loss per run
            loss = (loss_rows * (~finished)).sum()
            if step % DIVERGENCE_CHECK_EVERY == 0 and not bool(torch.isfinite(loss)):  # one host sync per check
                raise diverged(float(loss.detach()), step, f"--lr {cfg.lr:g}")
            loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        if check and any_finished:  # re-pack the still-active runs
            keep = ~finished
            idx = idx[keep]
            act = idx.tolist()
            E_a, rv_a, ps_a = E_a[keep], rv_a[keep], ps_a[keep]
            if K:
                T_a, cv_a, top = T_a[keep], cv_a[keep], top[keep]
                C_a = C_a[keep] if C_a is not None else None
    Ws = [w.cpu() for w in best_W]
    accs = [scores(pr, w, competitors=None if C_cpu is None else C_cpu[b, : pr.p, : pr.p - 1]).accuracy
            for b, (pr, w) in enumerate(zip(problems, Ws))]  # exact float64 re-check (the same competitors)
    return TrainOutput(W=Ws, accuracy=accs, steps=steps.tolist(), W_init=W_init)
