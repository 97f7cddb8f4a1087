"""Cross-entropy of a linear read-out without materialising the full logit matrix.

For N entities and B supervised queries the logits ``h @ W`` are a (B, N)
matrix; at N = 4096 and B = 16384 that is 268 MB, and the softmax
cross-entropy over it (read and written several times, forward and backward)
is memory-bound: 55-61% of a dense training step on CPU at N >= 1024
(``benchmarks/facts_bench.py``). :func:`linear_cross_entropy` computes the same
mean loss and the same gradients row-chunk by row-chunk, recomputing each
chunk's logits in the backward pass, so the working set stays in cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

CHUNK_ELEMENTS = 1 << 20  # logits per chunk (4 MB in float32)


def _chunk_rows(n_cols: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(1, n_cols))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, W: Tensor, targets: Tensor) -> Tensor:
        rows = _chunk_rows(W.shape[1])
        total = h.new_zeros((), dtype=torch.float64)
        for i in range(0, h.shape[0], rows):
            # F.cross_entropy's fused log-softmax kernel; torch.logsumexp was 25x slower on CPU for
            # confident (large-magnitude) logits
            total += F.cross_entropy(h[i: i + rows] @ W, targets[i: i + rows], reduction="sum").double()
        ctx.save_for_backward(h, W, targets)
        return (total / h.shape[0]).to(h.dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        h, W, targets = ctx.saved_tensors
        rows = _chunk_rows(W.shape[1])
        scale = grad_out / h.shape[0]
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_W = torch.zeros_like(W) if ctx.needs_input_grad[1] else None
        for i in range(0, h.shape[0], rows):
            hc = h[i: i + rows]
            p = torch.softmax(hc @ W, dim=1)
            p[torch.arange(len(p), device=p.device), targets[i: i + rows]] -= 1.0
            p *= scale
            if grad_h is not None:
                grad_h[i: i + rows] = p @ W.T
            if grad_W is not None:
                grad_W.addmm_(hc.T, p)
        return grad_h, grad_W, None


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
    """
    _check_shapes("linear_cross_entropy", h, W, targets)
    if h.shape[0] <= _chunk_rows(W.shape[1]):  # one chunk: the dense form, no recomputation
        return F.cross_entropy(h @ W, targets)
    return _LinearCrossEntropy.apply(h, W, targets)


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
    target = (h * W.T[targets]).sum(-1)
    return ((h @ gram) * h).sum(-1).mean() - 2 * target_logit * target.mean() + target_logit ** 2
