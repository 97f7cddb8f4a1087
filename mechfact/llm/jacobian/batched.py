"""The batched-copies Jacobian (:func:`jacobian_copies`): reverse-mode autograd through the bridge, for any
model the bridge runs; :func:`mechfact.llm.jacobian.jacobian` falls back to it. The prefix key/value cache and
the copies of it (:func:`_prefix_cache`, :func:`_copies`) are shared with :mod:`mechfact.llm.lre.operator` and
:mod:`mechfact.llm.lre.shared_prefix`; the hook that sets one position of every copy (:func:`_putter_at`) with
:mod:`mechfact.llm.lre.operator`'s edited runs.
"""

from __future__ import annotations

import copy

import torch

from ... import hooks
from ...probes.queries import StopForward


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
        _, pkv = lm.bridge(toks[:, :pos], return_type="logits_and_cache", **keep_last(lm))
    return pkv


def keep_last(lm) -> dict:
    """Forward keywords that unembed the last position alone, where the model takes them (else none)."""
    from ...probes.queries import keeps_logits

    return {"logits_to_keep": 1} if keeps_logits(lm) else {}


def _copies(pkv, layer: int, B: int):
    """A fresh copy of the prefix cache for a suffix run with ``B`` copies from the block after ``layer`` on
    (blocks up to ``layer`` run the suffix once and keep the batch-1 cache; the hook at ``layer`` expands)."""
    kv = copy.deepcopy(pkv)
    if kv is not None:
        for li in range(layer + 1, len(kv.layers)):
            kv.layers[li].keys = kv.layers[li].keys.expand(B, -1, -1, -1).contiguous()
            kv.layers[li].values = kv.layers[li].values.expand(B, -1, -1, -1).contiguous()
    return kv


def _putter_at(states: torch.Tensor, at: int):
    """Hook: the one run becomes ``B`` copies, copy k with position ``at`` set to ``states[k]`` (differentiable in
    ``states``: the Jacobian's hook at the suffix's first position, and every edited run's)."""
    def put(act, hook):
        out = act.expand(states.shape[0], -1, -1).clone()
        out[:, at] = states.to(act.dtype)
        return out
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
        raise StopForward

    def take_o(act, hook):
        got["o"] = act[:, -1]
        raise StopForward

    try:
        with torch.no_grad():
            b.run_with_hooks(suffix, past_key_values=copy.deepcopy(pkv), fwd_hooks=[(name_s, take_s)])
    except StopForward:
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
                b.run_with_hooks(suffix, past_key_values=kv,
                                 fwd_hooks=[(name_s, _putter_at(s, 0)), (name_o, take_o)])
            except StopForward:
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
