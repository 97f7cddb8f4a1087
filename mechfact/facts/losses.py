"""Cross-entropy of a linear read-out without materialising the full logit matrix.

For N entities and B supervised queries the logits ``h @ W`` are a (B, N)
matrix; at N = 4096 and B = 16384 that is 268 MB, and the softmax
cross-entropy over it (read and written several times, forward and backward)
is memory-bound: 55-61% of a dense training step on CPU at N >= 1024
(``benchmarks/facts_bench.py``). :func:`linear_cross_entropy` computes the same
mean loss and the same gradients row-chunk by row-chunk, forming each chunk's
gradients while its logits are in cache (once: the backward pass only scales
them), so the working set stays in cache and the logits are computed once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK_ELEMENTS = 1 << 18  # logits per chunk (1 MB in float32: L2-resident; measured 1.2x faster than 4 MB)


def _chunk_rows(n_cols: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(1, n_cols))


class _LinearCrossEntropy(torch.autograd.Function):
    """The mean cross-entropy and, in the same pass over each chunk of logits, its gradients: the chunk's
    log-softmax gives both the loss and (through log_softmax's own backward kernel) softmax - onehot, so the
    backward pass only scales them (no second logit matmul, no separate softmax)."""

    @staticmethod
    def forward(ctx, h: Tensor, W: Tensor, targets: Tensor, need_h: bool, need_W: bool) -> Tensor:
        rows = _chunk_rows(W.shape[1])
        total = h.new_zeros((), dtype=torch.float64)
        grad_h = torch.empty_like(h) if need_h else None
        grad_W = torch.zeros_like(W) if need_W else None
        in_place = h.device.type == "cpu"  # aten's CPU (log-)softmax kernels are row-local: safe in place
        for i in range(0, h.shape[0], rows):
            hc, tc = h[i: i + rows], targets[i: i + rows]
            z = hc @ W
            if in_place:
                ls = torch.ops.aten._log_softmax.out(z, 1, False, out=z)
            else:
                ls = torch.log_softmax(z, 1)
            total += F.nll_loss(ls, tc, reduction="sum").double()  # = F.cross_entropy(hc @ W, tc, "sum")
            if not (need_h or need_W):
                continue
            G = torch.zeros_like(ls)
            G[torch.arange(len(tc), device=G.device), tc] = -1.0
            if in_place:  # softmax - onehot
                G = torch.ops.aten._log_softmax_backward_data.out(G, ls, 1, ls.dtype, out=G)
            else:
                G = torch._log_softmax_backward_data(G, ls, 1, ls.dtype)
            if need_h:
                torch.mm(G, W.T, out=grad_h[i: i + rows])
            if need_W:
                grad_W.addmm_(hc.T, G)
        ctx.grads, ctx.n_rows = (grad_h, grad_W), h.shape[0]
        return (total / h.shape[0]).to(h.dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        grad_h, grad_W = ctx.grads
        if grad_h is None and grad_W is None and any(ctx.needs_input_grad[:2]):
            raise RuntimeError("linear_cross_entropy: gradients were not formed (grad mode was off in the forward)")
        scale = grad_out / ctx.n_rows
        return (None if grad_h is None else grad_h * scale, None if grad_W is None else grad_W * scale,
                None, None, None)


def _check_shapes(name: str, h: Tensor, W: Tensor, targets: Tensor) -> None:
    if h.ndim != 2 or W.ndim != 2 or h.shape[1] != W.shape[0]:
        raise ValueError(f"{name}: h {tuple(h.shape)} and W {tuple(W.shape)} must be (B, d) and (d, N)")
    if targets.shape != (h.shape[0],):
        raise ValueError(f"{name}: targets {tuple(targets.shape)} must be ({h.shape[0]},)")
    if h.shape[0] == 0:
        raise ValueError(f"{name}: empty batch")


def linear_cross_entropy(h: Tensor, W: Tensor, targets: Tensor) -> Tensor:
    """``F.cross_entropy(h @ W, targets)`` (mean), computed in row chunks.

    ``h``: (B, d) features, ``W``: (d, N) read-out, ``targets``: (B,) class
    indices in ``[0, N)``. Same value and gradients as the dense form up to
    float rounding (tested), with O(chunk * N) extra memory instead of O(B * N).
    The gradients are formed in the forward pass (when grad mode is on and an
    input requires them): call ``backward`` on the result, as training does.
    """
    _check_shapes("linear_cross_entropy", h, W, targets)
    grad = torch.is_grad_enabled()  # gradients are formed in the forward pass, and only those needed
    return _LinearCrossEntropy.apply(h, W, targets, grad and h.requires_grad, grad and W.requires_grad)


def logit_squared_error(z: Tensor, targets: Tensor, target_logit: float = 1.0) -> Tensor:
    """Mean over rows of ``||z - target_logit * onehot(targets)||^2`` for logits ``z`` (B, N), expanded as
    ``|z|^2 - 2 target_logit z[target] + target_logit^2`` (no one-hot matrix)."""
    rows = torch.arange(z.shape[0], device=z.device)
    return ((z * z).sum(-1) - 2 * target_logit * z[rows, targets] + target_logit ** 2).mean()


def linear_squared_error(h: Tensor, W: Tensor, targets: Tensor, target_logit: float = 1.0) -> Tensor:
    """Mean over rows of ``||h @ W - target_logit * onehot(targets)||^2`` without forming ``h @ W``.

    Expands the square: ``h (W W^T) h^T - 2 target_logit (h . W[:, t]) + target_logit^2``, so the cost is
    O(B d^2 + d^2 N) instead of O(B d N) and nothing of size (B, N) exists. Unlike cross-entropy this loss has
    a finite minimiser: every logit has a fixed target, so training converges instead of growing margins.
    """
    _check_shapes("linear_squared_error", h, W, targets)
    gram = W @ W.T
    # index_select, not W.T[targets]: the backward of advanced indexing (index_put with accumulation over repeated
    # targets) is not deterministic on CPU with several threads; index_select's (index_add) is
    target = (h * torch.index_select(W.T, 0, targets)).sum(-1)
    return ((h @ gram) * h).sum(-1).mean() - 2 * target_logit * target.mean() + target_logit ** 2
