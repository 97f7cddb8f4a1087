"""Solvers for the linear-memory problem: Hebb, gradient training, exact LP.

* ``hebb``: W = sum_mu u_mu e_mu^T (DP: the private targets t_mu); with
  kappa < 1 its best rank-m approximation (truncated SVD).
* ``trained``: full-batch Adam on cross-entropy over all p outputs, many runs
  of one shape trained together as one batched computation (instances of
  different p are padded). With kappa < 1, W = Q R^T. The step is fused: each
  input's loss over all its competitors, the recall check and the gradient with
  respect to v_mu = W e_mu are formed in one pass over cache-sized chunks of
  rows (see :class:`_FusedRows`), without padding masks or concatenations.
  Training stops for a run as soon as it recalls every association (capacity
  is about perfect recall); the W with the best accuracy seen is returned.
* ``separable``: an exact finite-size decision. Perfect recall is a homogeneous
  linear feasibility problem in vec(W): (u_mu - u_rho)^T W e_mu > 0 for all
  rho != mu. We solve max t s.t. a_k . w >= t, |w_i| <= 1 with HiGHS on a
  working set of constraints, adding violated ones until W recalls everything
  (a certificate of separability) or the working set alone is infeasible
  (t* <= tol: a certificate that the full set is infeasible too).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..config import DictConfig, check_choice, check_float, check_int
from .problems import ROW_BLOCK, MemoryProblem, scores

logger = logging.getLogger(__name__)

METHODS = ("hebb", "trained", "separable")


def check_kappa(kappa: float) -> float:
    if not (0.0 < kappa <= 1.0):
        raise ValueError(f"kappa={kappa}: must lie in (0, 1]")
    return kappa


def rank_of(d: int, kappa: float) -> int:
    """m = round(kappa * d), at least 1."""
    return max(1, int(round(check_kappa(kappa) * d)))


# ---- Hebb -----------------------------------------------------------------------

def hebb(problem: MemoryProblem, kappa: float = 1.0) -> Tensor:
    """Hebbian W = sum_mu u_mu e_mu^T (truncated to rank kappa*d if kappa < 1)."""
    E, U = problem.inputs().double(), problem.outputs().double()
    W = U.T @ E
    m = rank_of(problem.d, kappa)
    if m < problem.d:
        Uw, S, Vh = torch.linalg.svd(W)
        W = (Uw[:, :m] * S[:m]) @ Vh[:m]
    return W.float()


# ---- gradient training -------------------------------------------------------------

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
    patience: int = 1500  # give up on a run whose error count has not reached a new minimum for this many steps (0: never)
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


def hebb_bytes(d: int, p: int, kappa: float = 1.0) -> float:
    """Estimated peak bytes of :func:`hebb` plus the float64 accuracy check of its W (E, U, V in float64, W and
    its SVD)."""
    return 8.0 * (4 * p * d + (5 if kappa < 1 else 2) * d * d)


@dataclass
class TrainOutput:
    W: list[Tensor]  # one (d, d) matrix per problem
    accuracy: list[float]  # accuracy of the returned W
    steps: list[int]  # steps taken until perfect recall (or the budget)
    W_init: list[Tensor] = field(default_factory=list)


def _pad(rows: list[Tensor], P: int) -> Tensor:
    out = torch.zeros(len(rows), P, *rows[0].shape[1:], dtype=rows[0].dtype)
    for b, r in enumerate(rows):
        out[b, : r.shape[0]] = r
    return out


CHUNK_BYTES = 1 << 20  # CPU: one chunk's scores (original) stay in L2 between the forward and the gradient
DP_CHUNK_BYTES = 1 << 22  # CPU: one chunk's decoupled competitors (read twice: scores, then the gradient; L3-resident)


def _chunks(act: list[int], ps: list[int], P: int, row_bytes: int, budget: float) -> list[tuple[int, int, int, int]]:
    """Chunks (j0, j1, r0, r1) of the active runs ``act`` (global ids, in packed order): whole runs j0..j1-1 of
    consecutive ids (all P rows, padded) when two or more fit ``budget``, else rows r0..r1-1 of one run."""
    out = []
    n_max = len(act) if math.isinf(budget) else int(budget // (P * row_bytes))
    if n_max >= 2:
        j = 0
        while j < len(act):
            j1 = j + 1
            while j1 < len(act) and j1 - j < n_max and act[j1] == act[j1 - 1] + 1:
                j1 += 1
            out.append((j, j1, 0, P if j1 - j > 1 else ps[act[j]]))
            j = j1
        return out
    rows = P if math.isinf(budget) else max(1, int(budget // row_bytes))
    for j, g in enumerate(act):
        out.extend((j, j + 1, r0, min(ps[g], r0 + rows)) for r0 in range(0, ps[g], rows))
    return out


class _FusedRows:
    """The per-input loss, recall check and gradient of every active run, one chunk of rows at a time.

    Row mu's loss depends on v_mu = W e_mu only: OP, cross-entropy of the logits s[mu, :] = U v_mu with the
    target on the diagonal (``hinge2``: sum over rho != mu of relu(margin - s_mu,mu + s_mu,rho)^2); DP, the same
    over [t_mu . v_mu, c^(mu)_k . v_mu]. So d(loss_mu)/d(v_mu) is formed with the loss, while the chunk's
    scores (OP) or competitors (DP) are still in cache; training scales it per run. One run's chunk is sliced
    to its own p (no padding); several small runs share a chunk padded to P, the padded outputs / competitors
    taking an additive -inf (the padded inputs have e_mu = 0 and are dropped).
    """

    def __init__(self, kind: str, T: Tensor, C: Tensor | None, ps: list[int], loss: str, margin: float):
        self.kind, self.T, self.C, self.ps, self.loss, self.margin = kind, T, C, ps, loss, margin
        self.shift = margin if loss == "ce-margin" else 0.0
        P, d = T.shape[1], T.shape[2]
        self.P = P
        cpu = T.device.type == "cpu"
        if kind == "original":
            self.row_bytes, budget = 4 * P, CHUNK_BYTES
        else:
            self.row_bytes, budget = 4 * (P - 1) * d, DP_CHUNK_BYTES
        self.budget = budget if cpu else float("inf")  # on a GPU: one chunk per contiguous group of runs
        self.inplace_log_softmax = cpu  # aten's CPU kernel is row-local: safe in place (saves a pass)
        # DP scores c_k . v_mu: a batched (1, d) x (d, K) product; on CPU from d ~ 96 linalg.vecdot (product and
        # sum over the cache-resident chunk) streams the competitors ~2x faster than MKL's batched gemv
        # (measured at d = 96 and 128; at d = 64 it is slower)
        self.dp_vecdot = cpu and d >= 96

    def _col_bias(self, gs: list[int], n_cols: int, offset: int, device) -> Tensor | None:
        """(n, 1, n_cols) additive bias: -inf at the padded columns (col >= p - offset) of each run, else None."""
        lim = torch.tensor([self.ps[g] - offset for g in gs], device=device)
        if int(lim.min()) >= n_cols:
            return None
        cols = torch.arange(n_cols, device=device)
        return torch.zeros(len(gs), 1, n_cols, device=device).masked_fill_(cols[None, None, :] >= lim[:, None, None],
                                                                           float("-inf"))

    def __call__(self, V: Tensor, act: list[int], need_grad: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """V (b, P, d) of the active runs ``act``: per-input loss (b, P), recall (b, P), d loss / d V (b, P, d)."""
        b, P, d = V.shape
        loss = V.new_zeros(b, P)
        ok = torch.zeros(b, P, dtype=torch.bool, device=V.device)
        G = V.new_zeros(b, P, d) if need_grad else None
        for j0, j1, r0, r1 in _chunks(act, self.ps, P, self.row_bytes, self.budget):
            gs = act[j0:j1]
            g0, n = gs[0], j1 - j0
            pc = self.ps[g0] if n == 1 else P  # one run: sliced to its p; several: padded to P
            Vc = V[j0:j1, r0:r1]
            if self.kind == "original":
                bias = self._col_bias(gs, pc, 0, V.device) if n > 1 else None
                l, o, g = self._original(Vc, self.T[g0 : g0 + n, :pc], r0, bias, need_grad)
            else:
                bias = self._col_bias(gs, pc - 1, 1, V.device) if n > 1 else None
                l, o, g = self._decoupled(Vc, self.T[g0 : g0 + n, r0:r1], self.C[g0 : g0 + n, r0:r1, : pc - 1],
                                          bias, need_grad)
            if n > 1 and any(self.ps[x] < P for x in gs):  # padded inputs: no loss, no recall, no gradient
                pad = torch.arange(r0, r1, device=V.device)[None, :] >= torch.tensor([self.ps[x] for x in gs],
                                                                                     device=V.device)[:, None]
                l = l.masked_fill(pad, 0.0)
                o = o & ~pad
                if g is not None:
                    g = g.masked_fill(pad[..., None], 0.0)
            loss[j0:j1, r0:r1] = l
            ok[j0:j1, r0:r1] = o
            if G is not None:
                G[j0:j1, r0:r1] = g
        return loss, ok, G

    def _original(self, Vc, Tc, r0, bias, need_grad):
        S = torch.bmm(Vc, Tc.transpose(1, 2))  # (n, rows, p): s[mu, rho] = u_rho . v_mu
        if bias is not None:
            S.add_(bias)
        dg = S.diagonal(r0, 1, 2)  # the targets s[mu, mu]
        tgt = dg.clone()
        dg.fill_(float("-inf"))
        ok = tgt > S.amax(-1)  # strictly above every competitor
        if self.loss == "hinge2":
            H = S.sub_((tgt - self.margin)[..., None]).relu_()  # the diagonal (-inf) drops out
            loss = (H * H).sum(-1)
            if not need_grad:
                return loss, ok, None
            H.mul_(2.0)
            H.diagonal(r0, 1, 2).copy_(-H.sum(-1))
            return loss, ok, torch.bmm(H, Tc)
        dg.copy_(tgt - self.shift)
        if self.inplace_log_softmax and S.is_contiguous():
            torch.ops.aten._log_softmax.out(S, -1, False, out=S)
        else:
            S = torch.log_softmax(S, -1)
        loss = -S.diagonal(r0, 1, 2)
        if not need_grad:
            return loss, ok, None
        G = torch.zeros_like(S)
        G.diagonal(r0, 1, 2).fill_(-1.0)
        return loss, ok, torch.bmm(self._softmax_minus_onehot(G, S), Tc)

    def _softmax_minus_onehot(self, G: Tensor, log_probs: Tensor) -> Tensor:
        """softmax - onehot from the log-softmax, given G = -onehot: log_softmax's own backward kernel
        (G - exp(log_probs) * G.sum(-1)), whose vectorised exp is ~3x faster than torch.exp on CPU (and does
        not slow down on very negative log-probabilities, where torch.exp takes ~20x longer)."""
        if self.inplace_log_softmax:
            return torch.ops.aten._log_softmax_backward_data.out(G, log_probs, -1, log_probs.dtype, out=G)
        return torch._log_softmax_backward_data(G, log_probs, -1, log_probs.dtype)

    def _decoupled(self, Vc, Tc, Cc, bias, need_grad):
        n, R, K, d = Cc.shape
        Cf = Cc.reshape(n * R, K, d)  # a view: one run's rows, or whole contiguous runs
        if self.dp_vecdot:
            comp = torch.linalg.vecdot(Cf, Vc.reshape(n * R, 1, d)).view(n, R, K)  # c_k . v_mu
        else:
            comp = torch.bmm(Vc.reshape(n * R, 1, d), Cf.transpose(1, 2)).view(n, R, K)
        if bias is not None:
            comp.add_(bias)
        tgt = torch.linalg.vecdot(Tc, Vc)
        ok = tgt > comp.amax(-1)
        if self.loss == "hinge2":
            H = comp.sub_((tgt - self.margin)[..., None]).relu_()
            loss = (H * H).sum(-1)
            if not need_grad:
                return loss, ok, None
            dcomp = H.mul_(2.0)
            dt = -dcomp.sum(-1)
        else:  # cross-entropy over the logits [t_mu - shift, comp]
            logits = torch.cat([(tgt - self.shift)[..., None] if self.shift else tgt[..., None], comp], -1)
            if self.inplace_log_softmax:
                torch.ops.aten._log_softmax.out(logits, -1, False, out=logits)
            else:
                logits = torch.log_softmax(logits, -1)
            loss = -logits[..., 0]
            if not need_grad:
                return loss, ok, None
            G = torch.zeros_like(logits)
            G[..., 0] = -1.0
            G = self._softmax_minus_onehot(G, logits)
            dt, dcomp = G[..., 0], G[..., 1:]
        g = torch.bmm(dcomp.reshape(n * R, 1, K), Cf).view(n, R, d)
        return loss, ok, g.addcmul_(dt[..., None], Tc)


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


# ---- exact decision by linear programming --------------------------------------------

@dataclass
class SeparableOutput:
    separable: bool
    W: Tensor | None  # a perfect-recall W when separable
    t_star: float  # LP optimum of the last working set (max-min margin, box-normalised)
    n_constraints: int
    iterations: int


def _constraint_rows(problem: MemoryProblem, E: Tensor, T: Tensor, pairs: np.ndarray) -> np.ndarray:
    """Rows a_k = vec((target_mu - competitor) e_mu^T) * d for (mu, j) pairs."""
    mu, j = pairs[:, 0], pairs[:, 1]
    if problem.kind == "original":
        diff = T[mu] - T[j]
    else:
        diff = np.empty((len(pairs), problem.d))
        for blk in np.unique(mu // ROW_BLOCK):  # regenerate each needed input block once
            r0 = int(blk) * ROW_BLOCK
            c = problem.competitors(r0, min(problem.p, r0 + ROW_BLOCK)).double().numpy()
            sel = mu // ROW_BLOCK == blk
            diff[sel] = T[mu[sel]] - c[mu[sel] - r0, j[sel]]
    return np.einsum("ki,kj->kij", diff, E[mu]).reshape(len(pairs), -1) * problem.d


def _violators(problem: MemoryProblem, W: Tensor, k: int, slack: float) -> np.ndarray:
    """Up to k most-violating (mu, j) pairs per input: competitor >= target - slack."""
    sc, comp = scores(problem, W, keep_competitors=True)
    comp = comp.numpy()
    tgt = sc.target.numpy()[:, None]
    viol = comp - (tgt - slack)
    out = []
    for mu in np.nonzero((viol >= 0).any(1))[0]:
        order = np.argsort(-viol[mu])[:k]
        order = order[viol[mu, order] >= 0]
        cols = order if problem.kind == "decoupled" else np.where(order >= mu, order + 1, order)
        out.extend((mu, c) for c in cols)
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def separable(problem: MemoryProblem, W_hint: Tensor | None = None, *, k_init: int = 8, k_add: int = 4,
              max_iter: int = 200, tol: float = 1e-7, time_limit: float = 900.0) -> SeparableOutput:
    """Decide exactly (up to LP tolerance) whether perfect recall is achievable.

    ``W_hint`` (e.g. a trained W) seeds the working set with its strongest
    competitors; if it already recalls everything it is itself the certificate.
    Cuts added each round: per input, up to ``k_add`` competitors whose margin
    under the current LP solution is below t* (they cut the current optimum).
    """
    from scipy.optimize import linprog

    if problem.p > 5000:
        raise ValueError(f"separable: p={problem.p} is too large for the exact LP here (at most 5000)")
    d = problem.d
    hint = hebb(problem).double() if W_hint is None else W_hint.double()
    if W_hint is not None and scores(problem, hint).accuracy == 1.0:
        return SeparableOutput(True, W_hint.float(), float("nan"), 0, 0)
    E = problem.inputs().double().numpy()
    T = problem.outputs().double().numpy()
    pairs = _violators(problem, hint, k_init, slack=float("inf"))
    rows = _constraint_rows(problem, E, T, pairs)
    nvar = d * d + 1
    c = np.zeros(nvar)
    c[-1] = -1.0
    bounds = [(-1.0, 1.0)] * (d * d) + [(None, None)]
    t_star = 0.0
    for it in range(1, max_iter + 1):
        A = np.hstack([-rows, np.ones((len(rows), 1))])
        res = linprog(c, A_ub=A, b_ub=np.zeros(len(rows)), bounds=bounds, method="highs-ds",
                      options={"time_limit": time_limit})
        if res.status != 0:
            raise RuntimeError(f"LP solver failed (status {res.status}: {res.message})")
        t_star = float(-res.fun)
        if t_star <= tol:
            return SeparableOutput(False, None, t_star, len(rows), it)
        W = torch.from_numpy(res.x[:-1].reshape(d, d))
        if scores(problem, W).accuracy == 1.0:
            return SeparableOutput(True, W.float(), t_star, len(rows), it)
        # rows are scaled by d: margin_k = d * (target - comp); cut where margin < t* (1 - 1e-9)
        new = _violators(problem, W, k_add, slack=t_star * (1 - 1e-9) / d)
        rows = np.vstack([rows, _constraint_rows(problem, E, T, new)])
        pairs = np.vstack([pairs, new])
    raise RuntimeError(f"separable(): no decision after {max_iter} constraint-generation rounds "
                       f"(d={d}, p={problem.p}, {len(rows)} constraints)")
