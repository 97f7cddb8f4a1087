"""The linear maps of a block's parts for :mod:`mechfact.llm.jacobian`: norms (a closed form for RMS norms,
checked against forward-mode autograd once per module; autograd for any other norm) and the rotary embedding
with its transpose.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .blocks import _orig


def _as(t: torch.Tensor | None, dt: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.to(dt)


def _eps_candidates(module) -> list[float]:
    """The epsilon a norm may use: a bridge's config value, the wrapped module's attribute (distinct values)."""
    found = [getattr(getattr(module, "config", None), "eps", None)]
    for m in (module, _orig(module)):
        found += [getattr(m, "variance_epsilon", None), getattr(m, "eps", None)]
    return list(dict.fromkeys(float(e) for e in found if isinstance(e, (int, float)) and not isinstance(e, bool)))


def _norm(module, x: torch.Tensor) -> torch.Tensor:
    return module(x).to(x.dtype)


_RMS_EPS: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()  # norm module -> {key: eps}


def _rms_form(module, x: torch.Tensor) -> tuple[float, torch.Tensor] | None:
    """(eps, gain) when ``module`` is an RMS norm ``gain * x / sqrt(mean(x^2) + eps)``, else None.

    Which epsilon (if any) makes the closed form agree with forward-mode autograd on one random tangent at
    ``x`` is found once per module, dtype and shape (a property of the norm's formula); the gain is read off the
    module's output on a vector of ones at every call (the weights may have been edited since).
    """
    key = (x.dtype, x.device, tuple(x.shape[1:]))
    known = _RMS_EPS.setdefault(module, {})
    if key not in known:
        t = torch.randn(x.shape, generator=torch.Generator(x.device).manual_seed(0), device=x.device, dtype=x.dtype)
        want = torch.func.jvp(lambda z: _norm(module, z), (x,), (t,))[1]
        tol = (1e-5 if x.dtype == torch.float32 else 1e-12) * float(want.norm()) + 1e-30
        known[key] = None
        for eps in _eps_candidates(module):
            gain = _norm(module, torch.ones_like(x[:1]))[0] * (1.0 + eps) ** 0.5
            r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
            a, b = gain * r, gain * x * (r ** 3 / x.shape[-1])
            if float((t * a - (t * x).sum(-1, keepdim=True) * b - want).norm()) <= tol:
                known[key] = eps
                break
    eps = known[key]
    return None if eps is None else (eps, _norm(module, torch.ones_like(x[:1]))[0] * (1.0 + eps) ** 0.5)


class _NormLin:
    """The linearisation of a norm ``module`` (over the last axis) at the rows ``x`` (rows, ..., n).

    An RMS norm, ``y = gain * x / sqrt(mean(x^2) + eps)``, has the Jacobian ``diag(a) - b x^T`` per row, with
    ``a = gain / r`` and ``b = gain x / (n r^3)``: three passes over the tangents. The gain is read off the
    module's output on a vector of ones, and the closed form is checked against forward-mode autograd
    (:func:`_rms_form`); any other norm goes through autograd for every tangent.
    """

    def __init__(self, module, x: torch.Tensor):
        self.module, self.x = module, x.clone()  # not a view: forward AD would give a view's base a tangent
        x = self.x
        self.a = None
        form = _rms_form(module, x)
        if form is not None:
            eps, gain = form
            r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
            self.a, self.b, self.xb = (gain * r).unsqueeze(1), (gain * x * (r ** 3 / x.shape[-1])).unsqueeze(1), \
                x.unsqueeze(1)

    def _f(self, z):
        return _norm(self.module, z)

    def jvp(self, X: torch.Tensor) -> torch.Tensor:
        """Tangents of the outputs from tangents X (rows, B, ..., n) of the inputs."""
        if self.a is not None:
            return torch.addcmul(X * self.a, (X * self.xb).sum(-1, keepdim=True), self.b, value=-1)
        return torch.func.vmap(lambda t: torch.func.jvp(self._f, (self.x,), (t,))[1], in_dims=1, out_dims=1)(X)

    def vjp(self, Y: torch.Tensor) -> torch.Tensor:
        """Cotangents of the inputs from cotangents Y (rows, B, ..., n) of the outputs (the transposed map)."""
        if self.a is not None:
            return torch.addcmul(Y * self.a, (Y * self.b).sum(-1, keepdim=True), self.xb, value=-1)
        _, back = torch.func.vjp(self._f, self.x)
        return torch.func.vmap(lambda c: back(c)[0], in_dims=1, out_dims=1)(Y)


def _lin(module, x: torch.Tensor) -> _NormLin | None:
    return None if module is None or x.numel() == 0 else _NormLin(module, x)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half) of the head features x (..., head_dim): ``x cos + rotate_half(x) sin``
    on the first ``rot_dim`` features (all of them unless the rotation is partial), with ``cos`` and
    ``sin_signed`` (= sin with its first half negated) broadcasting against x[..., :rot_dim]. Linear in x, so
    it maps tangents too: ``rotate_half(x) sin = roll(x, rot_dim / 2) sin_signed``."""
    r = cos.shape[-1]
    xr = x if r == x.shape[-1] else x[..., :r]
    out = torch.addcmul(xr * cos, xr.roll(r // 2, -1), sin_signed)
    return out if r == x.shape[-1] else torch.cat((out, x[..., r:].expand(*out.shape[:-1], -1)), -1)


def _rope_t(y: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """The transpose of :func:`_rope` (the roll by half the rotated features is its own inverse)."""
    r = cos.shape[-1]
    yr = y if r == y.shape[-1] else y[..., :r]
    out = (yr * sin_signed).roll(r // 2, -1).addcmul_(yr, cos)
    return out if r == y.shape[-1] else torch.cat((out, y[..., r:].expand(*out.shape[:-1], -1)), -1)
