"""The model's blocks for :mod:`mechfact.llm.jacobian`: read as plain tensors and Hugging Face modules
(:class:`_Block`, or :class:`_Mismatch` for a block the forward-mode path does not reproduce), and the one
forward pass of the bridge that captures every block's output from ``layer`` on, the rotary tables and the
attention masks (:func:`_capture`, :func:`_mask`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ... import hooks
from ...probes.queries import StopForward


class _Mismatch(Exception):
    """The linearised block does not reproduce the bridge's block."""


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


# attention-bridge features the forward-mode path does not reproduce (config flags of the bridge, attributes of
# HF modules)
_CFG_FLAGS = ("gated_q_proj", "rotary_interleaved_cos_sin", "rotary_adjacent_pairs", "qk_norm_after_rope",
              "use_split_qkv_input", "use_attn_in")
_ATTN_ATTRS = ("key_multiplier", "sinks")


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


def layout_of(block):
    """What a bridge block holds, read as the Jacobian reads it: the record a packaged model's
    :class:`~mechfact.llm.models.registry.BlockLayout` is checked against. ValueError for a block the
    forward-mode path does not read."""
    from ..models.registry import BlockLayout

    try:
        b = block if isinstance(block, _Block) else _block(block)
    except _Mismatch as exc:
        raise ValueError(f"block layout not readable: {exc}") from None
    return BlockLayout(norms="pre+post" if b.norm_attn_out is not None else "pre",
                       qk_norm=b.q_norm is not None, qkv_bias=any(x is not None for x in (b.bq, b.bk, b.bv)),
                       softcap=b.softcap, mlp="gated")


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
                raise StopForward
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
    except StopForward:
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
