"""Restored runs that compute only what a restoration can change: the tokens from the restored one on, the blocks
after the restored state, each row from the block where its cell first differs (the tracer's fast path on a
transformer-lens bridge; :func:`mechfact.probes.tracing.trace_query` uses it when :meth:`Suffix.of` finds the
model's decoder blocks).

A restoration at token ``t`` cannot change any state at a token before ``t`` (causal attention), and none before
the block it restores. So a restored run needs, per block after its first difference, the corrupted runs' keys and
values of tokens ``0..t-1`` (recorded once per query) and the hidden states of tokens ``t..n-1`` only. The cells of
one token ``t`` share a batch; sorted by the block where they start, they join the batch as the blocks pass, so no
row runs a block its cell does not change. Each block is the bridge's own (hook points fire, restorations go through
them); the clean run's keyword arguments (rotary embeddings, attention mask, positions) are recorded once and cut
to tokens ``t..n-1``, and the bridge's attention reads the prefix through the cache interface it uses to decode.
The scores equal a full forward pass's (the per-cell reference test and ``benchmarks/trace_bench.py`` check them).
"""

from __future__ import annotations

import contextlib

import einops
import torch

# keyword arguments of a decoder block that carry the sequence: how to cut them to tokens t..n-1
_SEQ_KWARGS = {"position_ids": -1, "cache_position": -1, "position_embeddings": -2}
_DROPPED = ("past_key_values", "past_key_value", "use_cache", "hidden_states", "output_attentions")


class _Record:
    """A cache that records each layer's keys and values and hands them back unchanged."""

    def __init__(self, store: dict):
        self.store = store

    def update(self, k, v, layer_idx, *args, **kwargs):
        self.store[int(layer_idx)] = (k.detach(), v.detach())
        return k, v


class _Prefix:
    """A cache holding tokens 0..t-1 of one layer for every row: ``update`` prepends them."""

    def __init__(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        self.layer, self.k, self.v = layer, k, v

    def update(self, k, v, layer_idx, *args, **kwargs):
        if int(layer_idx) != self.layer:
            raise RuntimeError(f"prefix cache of layer {self.layer} asked for layer {layer_idx}")
        return torch.cat([self.k.to(k.dtype), k], -2), torch.cat([self.v.to(v.dtype), v], -2)


def _cut(key: str, value, t: int):
    if value is None:
        return None
    if key == "attention_mask":
        return value[..., t:, :] if isinstance(value, torch.Tensor) and value.ndim == 4 else value
    dim = _SEQ_KWARGS[key]
    if isinstance(value, (tuple, list)):
        return type(value)(x.narrow(dim, t, x.shape[dim] - t) for x in value)
    return value.narrow(dim, t, value.shape[dim] - t)


def _block_list(model) -> torch.nn.ModuleList | None:
    """The wrapped Hugging Face model's list of decoder layers, when it holds the bridge's blocks (the bridge runs
    the Hugging Face forward, which loops over that list)."""
    bridge = getattr(model, "bridge", None)
    blocks = getattr(bridge, "blocks", None)
    hf = getattr(bridge, "original_model", None)
    if blocks is None or hf is None or len(blocks) == 0:
        return None
    for _, mod in hf.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == len(blocks) and mod[0] is blocks[0]:
            return mod
    return None


class Suffix:
    """The decoder blocks of a bridge and what one query's restored runs reuse (see the module docstring)."""

    def __init__(self, model, blocks: torch.nn.ModuleList):
        self.model, self.blocks = model, blocks
        self.kwargs: dict[int, dict] = {}  # block -> keyword arguments of the clean run
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # block -> the corrupted runs' keys, values
        self.entry: dict[str, torch.Tensor] = {}  # "clean" / "corrupt": the hidden states entering block 0
        self.usable = True  # False once a block takes a sequence-shaped argument of unknown layout

    @classmethod
    def of(cls, model) -> Suffix | None:
        blocks = _block_list(model)
        return None if blocks is None else cls(model, blocks)

    @contextlib.contextmanager
    def recording(self, run: str):
        """Around the clean run (``run="clean"``: the blocks' keyword arguments) or the corrupted runs
        (``"corrupt"``: every block's keys and values); both keep the hidden states entering block 0."""
        handles = []

        def pre(module, args, kwargs, j):
            h = args[0] if args else kwargs["hidden_states"]
            if j == 0:
                self.entry[run] = h.detach().clone()
            if run == "clean":
                kw = {k: v for k, v in kwargs.items() if k not in _DROPPED}
                odd = [k for k, v in kw.items() if k not in _SEQ_KWARGS and k != "attention_mask"
                       and isinstance(v, torch.Tensor) and v.ndim >= 1 and h.shape[1] in v.shape]
                if odd:  # arguments this module does not know how to cut: the caller runs whole blocks instead
                    self.usable = False
                self.kwargs[j] = kw
                return None
            return args, {**kwargs, "past_key_values": _Record(self.kv)}
        for j, b in enumerate(self.blocks):
            handles.append(b.register_forward_pre_hook(lambda m, a, k, j=j: pre(m, a, k, j), with_kwargs=True))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def run(self, t: int, starts: list[int], init: list[torch.Tensor], fwd_hooks: list, answer: int) -> torch.Tensor:
        """The residual stream after the last block at token ``answer`` for the rows of cells at token ``t``:
        ``starts`` (ascending) -- the block after which each cell's run first differs (-1: before block 0);
        ``init`` -- each cell's rows at that point, tokens t..n-1 (the restoration at that very state already
        written); ``fwd_hooks`` -- (hook name, fn) restorations at later hook points, positions counted from
        ``t`` (rows of cells that have not joined yet are never asked for: their restorations come later)."""
        if list(starts) != sorted(starts):
            raise ValueError("cells must come sorted by the block where they start")
        L = len(self.blocks)
        hps = []
        for name, fn in fwd_hooks:
            hp = self.model.hook_dict[name]
            hp.add_hook(fn, dir="fwd")
            hps.append(hp)
        h, c = None, 0
        try:
            for j in range(starts[0] + 1, L + 1):
                while c < len(starts) and starts[c] == j - 1:  # cells whose run first differs here join
                    h = init[c] if h is None else torch.cat([h, init[c]])
                    c += 1
                if j == L:
                    break
                k, v = self.kv[j]
                cells = h.shape[0] // k.shape[0]  # rows are (cell, corrupted run) pairs, cell-major
                cache = _Prefix(j, *(einops.repeat(x[:, :, :t], "run head pos e -> (cell run) head pos e", cell=cells)
                                     for x in (k, v)))
                kw = {key: _cut(key, val, t) for key, val in self.kwargs[j].items()}
                out = self.blocks[j](h, past_key_values=cache, **kw)
                h = out[0] if isinstance(out, tuple) else out
        finally:
            for hp in hps:
                hp.remove_hooks("fwd")
        return h[:, answer - t]
