"""The fused pass of the gradient trainer (:func:`mechfact.memory.train.train`).

Each input's loss over all its competitors, the recall check and the gradient with respect to v_mu = W e_mu are
formed in one pass over cache-sized chunks of rows (:class:`_FusedRows`), without padding masks or
concatenations.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


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
