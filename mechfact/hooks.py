"""Transformer-lens hook names, built in one place.

Every probe, loader and CLI default asks for hook points through these helpers
instead of spelling the strings, so a transformer-lens rename touches only this
file. The names are the ones :class:`mechfact.facts.model.FactModel` exposes and
the ones pretrained models expose through transformer-lens' ``TransformerBridge``.

:func:`layer_site` maps the short per-layer site names of the LLM commands
(``--site resid_post``) to hook names.
"""

from __future__ import annotations

RESID_WHERE = ("pre", "mid", "post")
LAYER_SITES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "mlp_post")


def _layer(layer: int) -> int:
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise ValueError(f"layer={layer!r}: must be a non-negative integer")
    return layer


def embed() -> str:
    """Token embeddings, (batch, pos, d_model)."""
    return "hook_embed"


def pos_embed() -> str:
    """Positional embeddings, (batch, pos, d_model)."""
    return "hook_pos_embed"


def resid(layer: int, where: str = "post") -> str:
    """Residual stream of block ``layer`` before attention (pre), between attention and MLP (mid), or after (post)."""
    if where not in RESID_WHERE:
        raise ValueError(f"where={where!r}: allowed values are {', '.join(RESID_WHERE)}")
    return f"blocks.{_layer(layer)}.hook_resid_{where}"


def attn_pattern(layer: int) -> str:
    """Attention probabilities, (batch, head, query_pos, key_pos)."""
    return f"blocks.{_layer(layer)}.attn.hook_pattern"


def attn_scores(layer: int) -> str:
    """Attention scores before the softmax, (batch, head, query_pos, key_pos)."""
    return f"blocks.{_layer(layer)}.attn.hook_attn_scores"


def attn_out(layer: int) -> str:
    """Attention output written to the residual stream, (batch, pos, d_model)."""
    return f"blocks.{_layer(layer)}.hook_attn_out"


def mlp_pre(layer: int) -> str:
    """MLP pre-activations, (batch, pos, d_mlp)."""
    return f"blocks.{_layer(layer)}.mlp.hook_pre"


def mlp_post(layer: int) -> str:
    """MLP activations after the non-linearity, (batch, pos, d_mlp)."""
    return f"blocks.{_layer(layer)}.mlp.hook_post"


def mlp_out(layer: int) -> str:
    """MLP output written to the residual stream, (batch, pos, d_model)."""
    return f"blocks.{_layer(layer)}.hook_mlp_out"


def layer_site(site: str, layer: int) -> str:
    """The hook of a per-layer site name (``resid_pre|resid_mid|resid_post|attn_out|mlp_out|mlp_post``)."""
    if site.startswith("resid_") and site in LAYER_SITES:
        return resid(layer, site.split("_", 1)[1])
    if site == "attn_out":
        return attn_out(layer)
    if site == "mlp_out":
        return mlp_out(layer)
    if site == "mlp_post":
        return mlp_post(layer)
    raise ValueError(f"site {site!r}: allowed values are {', '.join(LAYER_SITES)}")
