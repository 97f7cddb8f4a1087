"""Batched hidden-state extraction through the bridge's hooks, with padding and a disk cache.

``extract_states`` runs prompts in length-sorted batches, caches only the
requested hooks (``names_filter``), gathers one position per prompt and layer,
and returns ``states: (layers, n, d_model)`` plus each prompt's greedy next
token. Right padding needs no mask (causal attention never looks ahead); left
padding passes an attention mask and position ids derived from it. Both give
the unbatched states (tested to 1e-4).

Results are cached on disk under ``$MECHFACT_CACHE/states/<key>.pt``, the key
hashing the model identity, the exact token ids, positions, site and layers.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
from tqdm.auto import tqdm

from ..facts import hooks
from ..runs import atomic_path
from .loading import LoadedModel, cache_dir

logger = logging.getLogger(__name__)

SITES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
PADDING = ("right", "left")


def hook_name(site: str, layer: int) -> str:
    """The transformer-lens hook of ``site`` at block ``layer``."""
    if site.startswith("resid_"):
        return hooks.resid(layer, site.split("_", 1)[1])
    if site == "attn_out":
        return hooks.attn_out(layer)
    if site == "mlp_out":
        return hooks.mlp_out(layer)
    raise ValueError(f"--site {site}: allowed values are {', '.join(SITES)}")


@dataclass
class Extraction:
    states: torch.Tensor  # (len(layers), n, d_model), float32 on CPU
    next_token: torch.Tensor  # (n,) greedy next token after each prompt
    layers: list[int]
    site: str


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int, side: str = "right"):
    """(tokens, attention_mask, position_ids, offsets): ``offsets[b]`` is where sequence b starts."""
    if side not in PADDING:
        raise ValueError(f"--padding {side}: allowed values are {', '.join(PADDING)}")
    T = max(len(s) for s in seqs)
    toks = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    offsets = []
    for b, s in enumerate(seqs):
        o = T - len(s) if side == "left" else 0
        toks[b, o:o + len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[b, o:o + len(s)] = 1
        offsets.append(o)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return toks, mask, pos, torch.tensor(offsets)


def forward_batch(lm: LoadedModel, seqs: Sequence[Sequence[int]], names: list[str], side: str = "right"):
    """Run one padded batch; (logits, {name: activation}, offsets). Only ``names`` are cached."""
    toks, mask, pos, offsets = pad_batch(seqs, lm.pad_id, side)
    kw = {}
    if side == "left" and int(offsets.max()) > 0:
        kw = dict(attention_mask=mask.to(lm.device), position_ids=pos.to(lm.device))
    want = set(names)
    with torch.no_grad():
        logits, cache = lm.bridge.run_with_cache(toks.to(lm.device), names_filter=lambda n: n in want, **kw)
    return logits, {n: cache[n] for n in names}, offsets


def _cache_key(lm: LoadedModel, seqs, positions, site: str, layers: list[int]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"model": lm.model_id, "site": site, "layers": list(layers), "v": 1}).encode())
    h.update(json.dumps([list(map(int, s)) for s in seqs]).encode())
    h.update(json.dumps([int(p) for p in positions]).encode())
    return h.hexdigest()[:24]


def extract_states(lm: LoadedModel, seqs: Sequence[Sequence[int]], positions: Sequence[int], *,
                   layers: Sequence[int] | None = None, site: str = "resid_post", batch_size: int = 16,
                   padding: str = "right", use_cache: bool = True, progress: bool = True,
                   desc: str = "hidden states") -> Extraction:
    """States at ``positions[i]`` of prompt ``i`` for every requested layer, plus greedy next tokens."""
    layers = list(range(lm.n_layers)) if layers is None else [lm.check_layer(int(l), "--layers") for l in layers]
    if len(seqs) != len(positions):
        raise ValueError(f"{len(seqs)} prompts but {len(positions)} positions")
    for s, p in zip(seqs, positions):
        if not 0 <= p < len(s):
            raise ValueError(f"position {p} outside a prompt of {len(s)} tokens")
    names = [hook_name(site, l) for l in layers]
    missing = [n for n in names if n not in lm.bridge.hook_dict]
    if missing:
        raise ValueError(f"--site {site}: {lm.name} has no hook {missing[0]}")
    path: Path | None = None
    if use_cache:
        path = cache_dir() / "states" / f"{_cache_key(lm, seqs, positions, site, layers)}.pt"
        if path.is_file():
            d = torch.load(path, map_location="cpu", weights_only=True)
            logger.debug("state cache hit %s", path)
            return Extraction(states=d["states"], next_token=d["next_token"], layers=layers, site=site)
    n = len(seqs)
    states = torch.empty((len(layers), n, lm.d_model), dtype=torch.float32)
    nxt = torch.empty(n, dtype=torch.long)
    order = sorted(range(n), key=lambda i: len(seqs[i]))  # similar lengths together: little padding
    batches = [order[i:i + batch_size] for i in range(0, n, batch_size)]
    for idx in tqdm(batches, desc=desc, leave=False, **({} if progress else {"disable": True})):
        batch = [seqs[i] for i in idx]
        logits, acts, offsets = forward_batch(lm, batch, names, padding)
        rows = torch.arange(len(idx))
        pos = torch.tensor([positions[i] for i in idx]) + offsets
        last = torch.tensor([len(s) - 1 for s in batch]) + offsets
        for j, name in enumerate(names):
            states[j, idx] = acts[name][rows, pos].float().cpu()
        nxt[idx] = logits[rows, last].argmax(-1).cpu()
    out = Extraction(states=states, next_token=nxt, layers=layers, site=site)
    if path is not None:
        with atomic_path(path) as tmp:
            torch.save({"states": states, "next_token": nxt}, tmp)
    return out


def greedy_tokens(lm: LoadedModel, seqs: Sequence[Sequence[int]], n_tokens: int, *, batch_size: int = 16,
                  first: torch.Tensor | None = None) -> torch.Tensor:
    """(n, n_tokens) greedy continuation of each prompt (no KV cache: prompts are short, n_tokens small)."""
    n = len(seqs)
    out = torch.empty((n, n_tokens), dtype=torch.long)
    cur = [list(s) for s in seqs]
    for t in range(n_tokens):
        if t == 0 and first is not None:
            step = first
        else:
            step = torch.empty(n, dtype=torch.long)
            for i in range(0, n, batch_size):
                batch = cur[i:i + batch_size]
                logits, _, _ = forward_batch(lm, batch, [], "right")
                last = torch.tensor([len(s) - 1 for s in batch])
                step[i:i + len(batch)] = logits[torch.arange(len(batch)), last].argmax(-1).cpu()
        out[:, t] = step
        for i in range(n):
            cur[i].append(int(step[i]))
    return out
