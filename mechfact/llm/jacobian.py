"""Exact Jacobians ``J = d o / d s`` of a language model's residual stream, fast.

``s`` = ``resid_post`` of block ``layer`` at token ``pos``; ``o`` = ``resid_post`` of the last block at the
prompt's last token (before the final norm); ``J[i, j] = d o_i / d s_j`` (``d_model x d_model``): the Jacobian
of the linear relational embedding (:mod:`mechfact.llm.lre`).

(One module of ~750 lines on purpose: the forward-mode rules of every block part -- norms, rotary attention in
its three score paths, gated MLPs, Gemma's extra norms -- are one computation that must stay consistent with
itself; the checks that fall back to the batched-copies method live beside the rules they guard.)

:func:`jacobian` computes it in forward mode, all ``d_model`` input directions at once, from ONE forward pass
of the model (batch 1) for the primal values:

* the bridge runs the prompt once; hooks keep every block's output from ``layer`` on (all tokens) and the
  rotary tables and attention mask each attention layer receives;
* blocks ``layer+1 ..`` are then linearised one at a time at those captured inputs: only tangents (``d_model``
  directions x the tokens from ``pos`` on) move; the prompt before ``pos`` enters as constant keys and values;
* the gated MLP of each token is linearised as one explicit matrix,
  ``K = W_down (diag(act'(g) * u) W_gate + diag(act(g)) W_up)``: one ``d x m x d`` product per token, where
  pushing ``d`` tangents through the MLP costs three;
* attention scores take tangents either by forming query and key tangents (one large product per key/value
  head against the whole prompt: no copies of a cache, no repeated grouped keys) or, when the prompt has fewer
  tokens than a head has features, by pulling every key back to a ``d_model`` vector that meets the tangents
  in one product (:class:`_Linearised`; the cheaper way is picked per block);
* in the first block only the subject token carries a tangent, in the last block only the last token's output
  is formed.

Each block's primal output is compared with the bridge's own output: a block this module does not reproduce
(another attention variant, another residual layout) is found there, logged once, and that model's Jacobians
come from :func:`jacobian_copies` -- the batched-copies autograd method (prefix key/value cache, the suffix as
copies through the bridge, one backward per chunk of rows), which works for any model the bridge runs.

Blocks: an ``input_layernorm``, rotary attention with ``q/k/v/o`` (or fused ``qkv``) projections, optional
per-head q/k norms, a query scale, soft-capping and sliding windows, and a gated MLP (separate or fused
gate/up), in the Llama layout (two pre-norms) or Gemma's (norms before and after attention and MLP). Tested
against the batched copies and finite differences on Llama, Qwen2, Qwen3, Phi-3 (with partial rotary) and
Gemma-3 (``tests/test_jacobian.py``); timed by ``benchmarks/jacobian_bench.py``.
"""

from __future__ import annotations

import copy
import logging
import operator
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .. import hooks

logger = logging.getLogger(__name__)

# relative error allowed between a linearised block's primal output and the bridge's (the bridge takes the
# attention softmax in float32 for every dtype)
SELF_CHECK_TOL = {torch.float32: 1e-4, torch.float64: 1e-6}
SELF_CHECK_TOL_LOW = 3e-2  # bfloat16 / float16 models (the linearisation runs in float32 from their states)
_UNSUPPORTED: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()  # bridge -> why not


class _Stop(Exception):
    """Raised by a hook to end a forward pass early (the output was captured)."""


class _Mismatch(Exception):
    """The linearised block does not reproduce the bridge's block."""


def jacobian(lm, tokens: list[int], pos: int, layer: int, chunk: int | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(J, s, o): J = d o / d s (d_model, d_model) float32 CPU, s = resid_post[layer] at ``pos``, o = the last
    block's resid_post at the prompt's last token (float32 CPU vectors).

    ``chunk``: at most this many input directions per tangent product (memory); None = all ``d_model`` at
    once. The model's parameters are never differentiated (no autograd graph is built).
    """
    tokens = [int(t) for t in tokens]
    n = len(tokens)
    pos, layer = _index("pos", pos, n), _index("layer", layer, lm.n_layers)
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"chunk={chunk!r}: must be a positive integer or None")
    why = _UNSUPPORTED.get(lm.bridge)
    if why is None:
        plan = _plan(lm)
        if isinstance(plan, str):
            why = plan
        else:
            try:
                return _forward_mode(lm, plan, tokens, pos, layer, chunk)
            except _Mismatch as exc:
                why = str(exc)
            except (RuntimeError, IndexError, ValueError, TypeError, AttributeError, KeyError) as exc:
                why = f"{type(exc).__name__} in the forward-mode path: {' '.join(str(exc).split())[:200]}"
        _UNSUPPORTED[lm.bridge] = why
        logger.warning("%s: Jacobians by batched copies (slower): %s", getattr(lm, "name", "model"), why)
    return jacobian_copies(lm, tokens, pos, layer, 96 if chunk is None else chunk)


def _index(name: str, v, n: int) -> int:
    try:
        if isinstance(v, bool):
            raise TypeError
        i = operator.index(v)
    except TypeError:
        raise ValueError(f"{name}={v!r}: must be an integer") from None
    if not 0 <= i < n:
        raise ValueError(f"{name}={i}: out of range 0..{n - 1}")
    return i


def fast_path_problem(lm) -> str | None:
    """Why :func:`jacobian` computes ``lm``'s Jacobians by :func:`jacobian_copies`, or None when it does not (as
    far as known: a block that does not reproduce the bridge's is found at the first call)."""
    why = _UNSUPPORTED.get(lm.bridge)
    if why is None:
        plan = _plan(lm)
        why = plan if isinstance(plan, str) else None
    return why


# ---- the model's blocks as plain tensors and Hugging Face modules --------------------------------------------

def _orig(m):
    """The Hugging Face module a bridge component wraps (the module itself when it wraps nothing)."""
    o = getattr(m, "original_component", None)
    return m if o is None else o


def _weight(m) -> tuple[torch.Tensor, torch.Tensor | None]:
    m = _orig(m)
    w, b = getattr(m, "weight", None), getattr(m, "bias", None)
    if not isinstance(w, torch.Tensor) or w.ndim != 2 or not w.is_floating_point() or w.device.type == "meta":
        raise _Mismatch(f"{type(m).__name__}: not a plain linear layer")
    return w, b if isinstance(b, torch.Tensor) else None


@dataclass
class _Block:
    norm_in: Any  # norm before attention
    norm_attn_out: Any  # norm of the attention output (Gemma), or None
    norm_mlp_in: Any  # norm before the MLP
    norm_mlp_out: Any  # norm of the MLP output (Gemma), or None
    wq: torch.Tensor
    bq: torch.Tensor | None
    wk: torch.Tensor
    bk: torch.Tensor | None
    wv: torch.Tensor
    bv: torch.Tensor | None
    wo: torch.Tensor
    bo: torch.Tensor | None
    q_norm: Any  # per-head norms (Qwen3, Gemma3) or None
    k_norm: Any
    n_heads: int
    n_kv: int
    head_dim: int
    scaling: float
    softcap: float | None
    wg: torch.Tensor
    bg: torch.Tensor | None
    wu: torch.Tensor
    bu: torch.Tensor | None
    wd: torch.Tensor
    bd: torch.Tensor | None
    act: Any


# attention-bridge features this module does not reproduce (config flags of the bridge, attributes of HF modules)
_CFG_FLAGS = ("gated_q_proj", "rotary_interleaved_cos_sin", "rotary_adjacent_pairs", "qk_norm_after_rope",
              "use_split_qkv_input", "use_attn_in")
_ATTN_ATTRS = ("key_multiplier", "sinks")


def _plan(lm) -> list[_Block] | str:
    """Every block as a :class:`_Block`, or a one-line reason why this module cannot linearise them."""
    b = lm.bridge
    cfg = getattr(b, "cfg", None)
    for flag in _CFG_FLAGS:
        if getattr(cfg, flag, False):
            return f"the bridge's {flag} is set"
    try:
        plan = [_block(blk) for blk in b.blocks]
    except (_Mismatch, AttributeError, TypeError, ValueError) as exc:
        return f"unsupported block ({exc})"
    dev = torch.device(lm.device)
    for blk in plan:
        for w in (blk.wq, blk.wk, blk.wv, blk.wo, blk.wg, blk.wu, blk.wd):
            if w.device.type != dev.type or (dev.index is not None and w.device.index != dev.index):
                return f"weights on {w.device}, inputs on {dev} (a model spread over devices)"
    return plan


def _block(blk) -> _Block:
    layer = _orig(blk)
    attn_bridge = getattr(layer, "self_attn", None)
    mlp = _orig(getattr(layer, "mlp", None))
    if attn_bridge is None or mlp is None or not hasattr(layer, "input_layernorm"):
        raise _Mismatch(f"{type(layer).__name__}: no self_attn / mlp / input_layernorm")
    attn = _orig(attn_bridge)
    for a in _ATTN_ATTRS:
        if getattr(attn, a, None) is not None:
            raise _Mismatch(f"{type(attn).__name__}.{a}")
    if getattr(getattr(attn, "config", None), "clip_qkv", None) is not None:
        raise _Mismatch("clip_qkv")
    rope = getattr(getattr(attn, "config", None), "rope_parameters", None)
    if isinstance(rope, dict) and rope.get("llama_4_scaling_beta") is not None:
        raise _Mismatch("llama-4 query scaling")
    if getattr(attn, "q_norm", None) is not None and getattr(attn_bridge, "_qk_norm_phase", None) not in (
            None, "post_reshape"):
        raise _Mismatch("q/k norm over all heads")
    if getattr(attn_bridge, "_modules", {}).get("gate") is not None:
        raise _Mismatch("gated attention")
    head_dim = int(attn.head_dim)
    cfg = attn.config
    n_heads = int(cfg.num_attention_heads)
    n_kv = int(getattr(cfg, "num_key_value_heads", None) or n_heads)
    if hasattr(attn, "qkv_proj"):
        w, bias = _weight(attn.qkv_proj)
        cuts = [0, n_heads * head_dim, (n_heads + n_kv) * head_dim, (n_heads + 2 * n_kv) * head_dim]
        if w.shape[0] != cuts[-1]:
            raise _Mismatch(f"qkv_proj rows {w.shape[0]} != {cuts[-1]}")
        (wq, wk, wv), (bq, bk, bv) = ([w[a:c] for a, c in zip(cuts, cuts[1:])],
                                      [None if bias is None else bias[a:c] for a, c in zip(cuts, cuts[1:])])
    else:
        (wq, bq), (wk, bk), (wv, bv) = (_weight(attn.q_proj), _weight(attn.k_proj), _weight(attn.v_proj))
    wo, bo = _weight(attn.o_proj)
    if wq.shape[0] != n_heads * head_dim or wk.shape[0] != n_kv * head_dim or wv.shape[0] != n_kv * head_dim:
        raise _Mismatch("q/k/v projection shapes")
    # norms: the modules the bridge runs (a bridge norm may compute its own way, e.g. float64 kept float64)
    q_norm, k_norm = (next((m for m in (getattr(attn_bridge, nm, None), getattr(attn, nm, None)) if m is not None),
                           None) for nm in ("q_norm", "k_norm"))
    for nm in (q_norm, k_norm):
        w = getattr(_orig(nm), "weight", None)
        if nm is not None and isinstance(w, torch.Tensor) and w.shape[-1] != head_dim:
            raise _Mismatch("q/k norm over all heads")
    if hasattr(mlp, "gate_up_proj"):
        w, bias = _weight(mlp.gate_up_proj)
        m = w.shape[0] // 2
        wg, wu = w[:m], w[m:]
        bg, bu = (None, None) if bias is None else (bias[:m], bias[m:])
        act = getattr(mlp, "activation_fn", None) or getattr(mlp, "act_fn", None)
    elif hasattr(mlp, "gate_proj") and hasattr(mlp, "up_proj"):
        (wg, bg), (wu, bu) = _weight(mlp.gate_proj), _weight(mlp.up_proj)
        act = getattr(mlp, "act_fn", None) or getattr(mlp, "activation_fn", None)
    else:
        raise _Mismatch(f"{type(mlp).__name__}: not a gated MLP")
    wd, bd = _weight(mlp.down_proj)
    if act is None:
        raise _Mismatch(f"{type(mlp).__name__}: no activation")
    gemma = hasattr(layer, "pre_feedforward_layernorm") and hasattr(layer, "post_feedforward_layernorm")
    if not gemma and hasattr(layer, "post_feedforward_layernorm"):
        raise _Mismatch(f"{type(layer).__name__}: residual layout")
    return _Block(
        norm_in=layer.input_layernorm,
        norm_attn_out=layer.post_attention_layernorm if gemma else None,
        norm_mlp_in=layer.pre_feedforward_layernorm if gemma else layer.post_attention_layernorm,
        norm_mlp_out=layer.post_feedforward_layernorm if gemma else None,
        wq=wq, bq=bq, wk=wk, bk=bk, wv=wv, bv=bv, wo=wo, bo=bo, q_norm=q_norm, k_norm=k_norm,
        n_heads=n_heads, n_kv=n_kv, head_dim=head_dim, scaling=float(getattr(attn, "scaling", head_dim ** -0.5)),
        softcap=getattr(attn, "attn_logit_softcapping", None),
        wg=wg, bg=bg, wu=wu, bu=bu, wd=wd, bd=bd, act=act)


# ---- one forward pass of the bridge: every block's output from `layer` on, rotary tables and masks ---------

def _capture(lm, toks: torch.Tensor, layer: int) -> tuple[dict, dict]:
    b = lm.bridge
    last = lm.n_layers - 1
    resid: dict[int, torch.Tensor] = {}
    attn_in: dict[int, dict] = {}

    def keep(k):
        def hook(act, hook):
            resid[k] = act[0].detach()
            if k == last:
                raise _Stop
        return hook

    def keep_attn(k):
        def pre(module, args, kwargs):
            attn_in[k] = {"position_embeddings": kwargs.get("position_embeddings"),
                          "attention_mask": kwargs.get("attention_mask")}
        return pre

    handles = [b.blocks[k].attn.register_forward_pre_hook(keep_attn(k), with_kwargs=True)
               for k in range(layer + 1, lm.n_layers)]
    try:
        with torch.no_grad():
            b.run_with_hooks(toks, fwd_hooks=[(hooks.resid(k, "post"), keep(k)) for k in range(layer, lm.n_layers)])
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    return resid, attn_in


def _mask(attn_in: dict, n: int, device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(fill, add) as the bridge masks a full-prompt run: ``fill`` (n, n) bool = positions set to the dtype's
    minimum (its own causal mask, when the model gave no 4-d mask), ``add`` (..., n, n) float added after."""
    mask = attn_in.get("attention_mask")
    fill = None
    if mask is None or not isinstance(mask, torch.Tensor) or mask.ndim < 4:
        fill = ~torch.tril(torch.ones(n, n, dtype=torch.bool, device=device))
    if mask is not None and not isinstance(mask, torch.Tensor):
        raise _Mismatch(f"attention mask of type {type(mask).__name__}")
    add = None
    if mask is not None:
        mask = mask[..., :n]
        if mask.ndim >= 3 and mask.shape[-2] != n:
            mask = mask[..., -n:, :]
        if mask.dtype == torch.bool:
            add = torch.where(mask, torch.zeros((), device=device),
                              torch.full((), torch.finfo(torch.float32).min, device=device))
        else:
            add = mask if mask.dtype == torch.float64 else mask.float()
        while add.ndim > 3:  # (batch 1, heads or 1, n, n) -> (heads or 1, n, n)
            add = add[0]
        if add.ndim < 3:  # a mask over keys: the same for every query
            add = add.reshape(-1)[-n:].expand(1, n, n) if add.ndim else add.expand(1, n, n)
        if add.shape[-2:] != (n, n):
            raise _Mismatch(f"attention mask of shape {tuple(mask.shape)}")
    return fill, add


# ---- the linearised block ------------------------------------------------------------------------------------

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


ATTENTION_PATHS = ("direct", "scores")
ATTENTION_PATH: str | None = None  # None: per block, whichever needs fewer multiplications (tests force each)


class _Linearised:
    """One block's primal values at the suffix tokens (from its captured input) and its tangent map.

    The suffix is the tokens from ``pos`` on (T of them); the block's outputs are formed at the suffix rows
    ``r0..T-1``; tangents enter at the suffix tokens ``0..n_tan-1`` (the later ones have none yet).

    Attention scores take tangents two ways, whichever needs fewer multiplications: ``direct`` forms the
    tangents of the queries and keys (B x d x heads x head_dim per token) and multiplies them with the keys and
    queries; ``scores`` pulls each key back through the query's rotation, norm and projection to a vector of
    ``d_model`` (and each query back through the key's), so a tangent meets the scores in one product of
    B x d x (heads x keys) -- fewer when there are fewer keys than head features (short prompts, wide heads).
    """

    def __init__(self, blk: _Block, h_in: torch.Tensor, pos: int, r0: int, n_tan: int,
                 cos: torch.Tensor, sin: torch.Tensor, fill, add):
        n, d = h_in.shape
        H, KV, hd = blk.n_heads, blk.n_kv, blk.head_dim
        g = H // KV
        R = n - pos - r0
        dt = self.dt = h_in.dtype  # the computation's dtype (float32, or float64 for a float64 model)
        self.blk, self.pos, self.r0, self.R, self.n_tan, self.g = blk, pos, r0, R, n_tan, g
        self.nq = max(0, min(R, n_tan - r0))  # output rows whose own token carries a tangent: the first nq
        half = cos.shape[-1] // 2
        self.cos, self.sin = cos.to(dt), torch.cat((-sin[:, :half], sin[:, half:]), -1).to(dt)
        qi = slice(pos + r0, n)  # the output rows' positions
        ti = slice(pos, pos + n_tan)  # the positions of the tokens that carry tangents
        self.h_in = h_in
        a = _norm(blk.norm_in, h_in)  # (n, d)
        q = F.linear(a[qi], _as(blk.wq, dt), _as(blk.bq, dt)).view(R, H, hd)
        k = F.linear(a, _as(blk.wk, dt), _as(blk.bk, dt)).view(n, KV, hd)
        v = F.linear(a, _as(blk.wv, dt), _as(blk.bv, dt)).view(n, KV, hd)
        self.n_in = _NormLin(blk.norm_in, h_in[ti])
        self.n_q = _lin(blk.q_norm, q[:self.nq])
        self.n_k = _lin(blk.k_norm, k[ti])
        if blk.q_norm is not None:
            q = _norm(blk.q_norm, q)
        if blk.k_norm is not None:
            k = _norm(blk.k_norm, k)
        q = _rope(q, self.cos[qi, None], self.sin[qi, None])
        k = _rope(k, self.cos[:, None], self.sin[:, None])
        raw = torch.einsum("rkge,nke->krgn", q.view(R, KV, g, hd), k) * blk.scaling  # (KV, R, g, n)
        # for the score tangents (dq . k + q . dk): each term meets one of these, so both carry the scale
        self.q, self.k, self.v = q * blk.scaling, k * blk.scaling, v
        if blk.softcap is not None:
            th = torch.tanh(raw / blk.softcap)
            self.dcap = (1 - th * th)[:, :, None]
            raw = th * blk.softcap
        if fill is not None:
            raw = raw.masked_fill(fill[qi][None, :, None, :], torch.finfo(dt).min)
        if add is not None:
            am = add[:, qi]  # (heads or 1, R, n)
            am = am.view(KV, g, R, n).permute(0, 2, 1, 3) if am.shape[0] == H else am[:, :, None, :]
            raw = raw + am.to(dt)
        self.P = torch.softmax(raw, -1)  # (KV, R, g, n)
        o = torch.einsum("krgn,nke->rkge", self.P, v).reshape(R, H * hd)
        attn = F.linear(o, _as(blk.wo, dt), _as(blk.bo, dt))
        self.n_attn = _lin(blk.norm_attn_out, attn)
        if blk.norm_attn_out is not None:
            attn = _norm(blk.norm_attn_out, attn)
        self.h_mid = h_in[qi] + attn
        self.n_mlp = _NormLin(blk.norm_mlp_in, self.h_mid)
        a2 = _norm(blk.norm_mlp_in, self.h_mid)
        gate = F.linear(a2, _as(blk.wg, dt), _as(blk.bg, dt))
        up = F.linear(a2, _as(blk.wu, dt), _as(blk.bu, dt))
        act, dact = torch.func.jvp(lambda z: blk.act(z).to(dt), (gate,), (torch.ones_like(gate),))
        mlp = F.linear(act * up, _as(blk.wd, dt), _as(blk.bd, dt))
        self.n_out = _lin(blk.norm_mlp_out, mlp)
        if blk.norm_mlp_out is not None:
            mlp = _norm(blk.norm_mlp_out, mlp)
        self.h_out = self.h_mid + mlp
        # the MLP's Jacobian at each output row, as one matrix: W_down (diag(act'(g) u) W_gate + diag(act(g)) W_up)
        wg, wu, wd = _as(blk.wg, dt), _as(blk.wu, dt), _as(blk.wd, dt)
        c1, c2 = dact * up, act
        self.K = torch.empty(R, d, d, device=h_in.device, dtype=dt)
        M = torch.empty_like(wg)  # one buffer, written in place (a fresh m x d tensor per token costs page faults)
        for r in range(R):
            torch.mul(wg, c1[r, :, None], out=M).addcmul_(wu, c2[r, :, None])
            torch.mm(wd, M, out=self.K[r])
        # the norms around the MLP folded in, K <- N_out K N_in (the rows of K pulled back through N_in, its
        # columns pushed through N_out): the tangents meet one matrix per token
        self.K = self.n_mlp.vjp(self.K)
        if self.n_out is not None:
            self.K = self.n_out.jvp(self.K.transpose(1, 2)).transpose(1, 2)
        self.Uq = self.Uk = None

    def _paths(self) -> tuple[str, str]:
        """(queries' path, keys' path): the fewest multiplications for all d_model directions (the pulled-back
        vectors are formed once per block, whatever the chunks) unless ATTENTION_PATH forces one."""
        if ATTENTION_PATH is not None:
            return ATTENTION_PATH, ATTENTION_PATH
        blk, (n, d), R = self.blk, self.h_in.shape, self.R
        H, KV, hd, B = blk.n_heads, blk.n_kv, blk.head_dim, d
        q = "scores" if H * n * hd * d + B * d * H * n < B * d * H * hd + B * H * hd * n else "direct"
        k = "scores" if R * H * hd * d + B * d * R * H < B * d * KV * hd + B * H * R * hd else "direct"
        return q, k

    def _query_pullback(self) -> torch.Tensor:
        """(nq, H * n, d): row r, head h, key j -> the vector u with (query tangent of r, h) . k_j = A_r . u."""
        if self.Uq is None:
            blk, pos, r0, nq, g = self.blk, self.pos, self.r0, self.nq, self.g
            n, d = self.h_in.shape
            H, KV, hd = blk.n_heads, blk.n_kv, blk.head_dim
            qi = slice(pos + r0, pos + r0 + nq)
            w = _rope_t(self.k[None], self.cos[qi, None, None], self.sin[qi, None, None])  # (nq, n, KV, hd)
            w = w[:, :, :, None].expand(nq, n, KV, g, hd).reshape(nq, n, H, hd)
            if self.n_q is not None:
                w = self.n_q.vjp(w)
            self.Uq = torch.einsum("rjhe,hed->rhjd", w, _as(blk.wq, self.dt).view(H, hd, d)).reshape(nq, H * n, d)
        return self.Uq

    def _key_pullback(self) -> torch.Tensor:
        """(n_tan, R * H, d): key j, row r, head h -> the vector u with q_{r,h} . (key tangent of j) = A_j . u."""
        if self.Uk is None:
            blk, pos, n_tan, R, g = self.blk, self.pos, self.n_tan, self.R, self.g
            d = self.h_in.shape[1]
            H, KV, hd = blk.n_heads, blk.n_kv, blk.head_dim
            ti = slice(pos, pos + n_tan)
            z = _rope_t(self.q[None], self.cos[ti, None, None], self.sin[ti, None, None])  # (n_tan, R, H, hd)
            z = z.view(n_tan, R, KV, g, hd).permute(0, 1, 3, 2, 4).reshape(n_tan, R * g, KV, hd)
            if self.n_k is not None:
                z = self.n_k.vjp(z)
            z = z.view(n_tan, R, g, KV, hd).permute(0, 1, 3, 2, 4)  # (n_tan, R, KV, g, hd)
            self.Uk = torch.einsum("jrkge,ked->jrkgd", z, _as(blk.wk, self.dt).view(KV, hd, d)).reshape(
                n_tan, R * H, d)
        return self.Uk

    def tangent(self, X: torch.Tensor) -> torch.Tensor:
        """Tangents (R, B, d) of the block's outputs at the output rows from tangents X (n_tan, B, d) of its
        inputs at the suffix tokens 0..n_tan-1."""
        blk, pos, r0, R, n_tan, nq, g = self.blk, self.pos, self.r0, self.R, self.n_tan, self.nq, self.g
        B, dt = X.shape[1], self.dt
        H, KV, hd = blk.n_heads, blk.n_kv, blk.head_dim
        n = self.h_in.shape[0]
        ti = slice(pos, pos + n_tan)
        q_path, k_path = self._paths()
        A = self.n_in.jvp(X)  # (n_tan, B, d)
        dS = torch.zeros(KV, R, B, g, n, device=X.device, dtype=dt) if nq < R or q_path == "scores" else None
        # scores: (the output rows' query tangents) x (all keys)
        if nq and q_path == "scores":
            s1 = torch.bmm(A[r0:r0 + nq], self._query_pullback().transpose(1, 2))  # (nq, B, H * n)
            dS[:, :nq] = s1.view(nq, B, KV, g, n).permute(2, 0, 1, 3, 4)
        elif nq:
            dq = F.linear(A[r0:r0 + nq], _as(blk.wq, dt)).view(nq, B, H, hd)
            if self.n_q is not None:
                dq = self.n_q.jvp(dq)
            qi = slice(pos + r0, pos + r0 + nq)
            dq = _rope(dq, self.cos[qi, None, None], self.sin[qi, None, None])
            dqk = dq.view(nq, B, KV, g, hd).permute(2, 0, 1, 3, 4).reshape(KV, nq * B * g, hd)
            s1 = torch.bmm(dqk, self.k.permute(1, 2, 0)).view(KV, nq, B, g, n)
            if dS is None:
                dS = s1
            else:
                dS[:, :nq] = s1
        # + (queries) x (the keys' tangents)
        if k_path == "scores":
            s2 = torch.bmm(A, self._key_pullback().transpose(1, 2))  # (n_tan, B, R * H)
            dS[..., ti] += s2.view(n_tan, B, R, KV, g).permute(3, 2, 1, 4, 0)
        else:
            dk = F.linear(A, _as(blk.wk, dt)).view(n_tan, B, KV, hd)
            if self.n_k is not None:
                dk = self.n_k.jvp(dk)
            dk = _rope(dk, self.cos[ti, None, None], self.sin[ti, None, None])
            dS[..., ti] += torch.einsum("rkge,jbke->krbgj", self.q.view(R, KV, g, hd), dk)
        if blk.softcap is not None:
            dS.mul_(self.dcap)
        P = self.P[:, :, None]  # (KV, R, 1, g, n)
        dS.sub_((P * dS).sum(-1, keepdim=True)).mul_(P)  # softmax: dP = P (dS - sum(P dS))
        do = torch.bmm(dS.view(KV, -1, n), self.v.permute(1, 0, 2)).view(KV, R, B, g, hd)
        dv = F.linear(A, _as(blk.wv, dt)).view(n_tan, B, KV, hd)
        do += torch.einsum("krgj,jbke->krbge", self.P[..., ti], dv)
        do = do.permute(1, 2, 0, 3, 4).reshape(R, B, H * hd)
        dattn = F.linear(do, _as(blk.wo, dt))  # (R, B, d)
        if self.n_attn is not None:
            dattn = self.n_attn.jvp(dattn)
        if nq:  # residual: the rows whose token carried a tangent keep it
            dattn[:nq] += X[r0:r0 + nq]
        return torch.baddbmm(dattn, dattn, self.K.transpose(1, 2))  # + the MLP (between its norms)


def _check(k: int, mine: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    tol = SELF_CHECK_TOL.get(dtype, SELF_CHECK_TOL_LOW)
    err = float((mine - ref).norm() / ref.norm().clamp_min(1e-30))
    if not err <= tol:
        raise _Mismatch(f"block {k}: linearised block's output differs from the bridge's by {err:.2e} "
                        f"(relative; allowed {tol:.0e})")


def _forward_mode(lm, plan: list[_Block], tokens: list[int], pos: int, layer: int, chunk: int | None):
    dev = lm.device
    toks = torch.tensor([tokens], device=dev)
    n = len(tokens)
    last = lm.n_layers - 1
    resid, attn_in = _capture(lm, toks, layer)
    dt = torch.float64 if lm.dtype == torch.float64 else torch.float32  # the linearisation's dtype
    s = resid[layer][pos].float()
    o = resid[last][n - 1].float()
    d = s.shape[0]
    if layer == last:  # o and s are the same block's output
        J = torch.eye(d) if pos == n - 1 else torch.zeros(d, d)
        return J, s.cpu(), o.cpu()
    T = n - pos
    B = d if chunk is None else min(chunk, d)
    with torch.no_grad():
        X = torch.eye(d, device=dev, dtype=dt)[None]  # (1 token, d directions, d): only the subject token moves
        for k in range(layer + 1, lm.n_layers):
            if k not in attn_in or attn_in[k].get("position_embeddings") is None:
                raise _Mismatch(f"block {k}: no rotary tables reached the attention")
            cos, sin = attn_in[k]["position_embeddings"]
            cos, sin = cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1])
            if cos.shape[0] != n:
                raise _Mismatch(f"block {k}: rotary tables of shape {tuple(cos.shape)}")
            fill, add = _mask(attn_in[k], n, dev)
            r0 = 0 if k < last else T - 1  # the last block: the last token's output only
            lin = _Linearised(plan[k], resid[k - 1].to(dt), pos, r0, X.shape[0], cos, sin, fill, add)
            _check(k, lin.h_out, resid[k][pos + r0:].to(dt), lm.dtype)
            X = lin.tangent(X) if B >= d else torch.cat([lin.tangent(X[:, c:c + B]) for c in range(0, d, B)], 1)
    J = X[-1].T.contiguous()
    return J.float().cpu(), s.cpu(), o.cpu()


# ---- the batched-copies method (any model the bridge runs) --------------------------------------------------

def jacobian_copies(lm, tokens: list[int], pos: int, layer: int, chunk: int = 96
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`jacobian` by reverse-mode autograd through the bridge: the prompt before ``pos`` runs once and its
    key/value cache is reused; the rest runs as ``chunk`` copies from block ``layer + 1`` on, one output
    coordinate per copy, one backward per chunk. Works for every model the bridge runs; several times slower.

    The model's parameters are switched off for the computation and their ``requires_grad`` flags restored.
    """
    grad_on = [p for p in lm.bridge.parameters() if p.requires_grad]
    for p in grad_on:
        p.requires_grad_(False)
    try:
        return _jacobian_copies(lm, tokens, pos, layer, chunk)
    finally:
        for p in grad_on:
            p.requires_grad_(True)


def _prefix_cache(lm, toks: torch.Tensor, pos: int):
    """Key/value cache of the prompt before position ``pos`` (batch 1), or None when ``pos`` is 0."""
    if pos == 0:
        return None
    with torch.no_grad():
        _, pkv = lm.bridge(toks[:, :pos], return_type="logits_and_cache")
    return pkv


def _copies(pkv, layer: int, B: int):
    """A fresh copy of the prefix cache for a suffix run with ``B`` copies from the block after ``layer`` on
    (blocks up to ``layer`` run the suffix once and keep the batch-1 cache; the hook at ``layer`` expands)."""
    kv = copy.deepcopy(pkv)
    if kv is not None:
        for li in range(layer + 1, len(kv.layers)):
            kv.layers[li].keys = kv.layers[li].keys.expand(B, -1, -1, -1).contiguous()
            kv.layers[li].values = kv.layers[li].values.expand(B, -1, -1, -1).contiguous()
    return kv


def _putter(states: torch.Tensor):
    """Hook: the subject position (the suffix's first) takes ``states`` (B, d); the rest is the one run's."""
    B = states.shape[0]

    def put(act, hook):
        return torch.cat([states[:, None].to(act.dtype), act[:, 1:].expand(B, -1, -1)], 1)
    return put


def _jacobian_copies(lm, tokens: list[int], pos: int, layer: int, chunk: int):
    b = lm.bridge
    name_s, name_o = hooks.resid(layer, "post"), hooks.resid(lm.n_layers - 1, "post")
    d = lm.d_model
    toks = torch.tensor([tokens], device=lm.device)
    pkv = _prefix_cache(lm, toks, pos)
    suffix = toks[:, pos:]
    got: dict[str, torch.Tensor] = {}

    def take_s(act, hook):
        got["s"] = act[0, 0].detach().clone()
        raise _Stop

    def take_o(act, hook):
        got["o"] = act[:, -1]
        raise _Stop

    try:
        with torch.no_grad():
            b.run_with_hooks(suffix, past_key_values=copy.deepcopy(pkv), fwd_hooks=[(name_s, take_s)])
    except _Stop:
        pass
    s0 = got["s"]
    J = torch.empty((d, d), dtype=torch.float32)
    o0 = None
    for c0 in range(0, d, chunk):
        B = min(chunk, d - c0)
        kv = _copies(pkv, layer, B)
        s = s0.to(lm.dtype).expand(B, d).clone().requires_grad_(True)
        with torch.enable_grad():
            try:
                b.run_with_hooks(suffix, past_key_values=kv, fwd_hooks=[(name_s, _putter(s)), (name_o, take_o)])
            except _Stop:
                pass
            o = got.pop("o")
            if o0 is None:
                o0 = o[0].detach().float().cpu()
            if not o.requires_grad:  # s and o are the same block's output at different tokens
                J[c0:c0 + B] = 0
                continue
            o[torch.arange(B), torch.arange(c0, c0 + B)].sum().backward()
        J[c0:c0 + B] = s.grad.float().cpu()
    return J, s0.float().cpu(), o0
