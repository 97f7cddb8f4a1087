"""Prompts that share everything before their subject run that shared head once.

The LRE authors' protocol prompts every test fact of a trial with the same in-context examples and the same
template, so the test prompts differ only from their subject on: in a factual relation that is the last 2-10
tokens of 40-70. :func:`states_shared` groups prompts by the tokens before their subject (the *head*), runs each
head once and keeps its key/value cache, and runs the prompts' tails (subject onward) as one right-padded batch
over copies of that cache: causal attention never looks at the padding, and the positions continue the head's.
Same states, next tokens and edited logits as the full prompts, to float rounding (tested), for a fraction of
the work. :class:`Heads` keeps the heads' caches for the edited runs of the same prompts
(:func:`mechfact.llm.lre.operator.edited_logits` with ``prefix=heads.cache(head_of(p)), start=p.subject_first``:
the tail runs once up to the edited layer, as copies after it).
"""

from __future__ import annotations

import torch

from ...probes.queries import Activations, ProbeSet, Site, collect, logits_of, pad_batch
from ..jacobian.batched import _copies, _prefix_cache, keep_last


def head_of(prompt) -> tuple[int, ...]:
    """The prompt's tokens before its subject's first token."""
    return tuple(prompt.tokens[:prompt.subject_first])


class Heads:
    """Key/value caches of prompt heads, each computed once (batch 1) and shared: callers run on copies."""

    def __init__(self, lm):
        self.lm = lm
        self._kv: dict[tuple[int, ...], object] = {}

    def cache(self, head: tuple[int, ...]):
        """The cache of ``head`` (shared: callers copy before running on it)."""
        if head not in self._kv:
            self._kv[head] = _prefix_cache(self.lm, torch.tensor([head], device=self.lm.device), len(head))
        return self._kv[head]


def groups_by_head(prompts) -> tuple[dict[tuple[int, ...], list[int]], list[int]]:
    """({head: prompt indices} for heads shared by at least two prompts, indices of the other prompts)."""
    by: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        by.setdefault(head_of(p), []).append(i)
    shared = {h: idx for h, idx in by.items() if len(idx) > 1 and len(h) > 0}
    alone = sorted(i for h, idx in by.items() if h not in shared for i in idx)
    return shared, alone


@torch.no_grad()
def states_shared(lm, prompts, sites: list[Site], batch_size: int, heads: Heads | None = None) -> Activations:
    """:func:`mechfact.probes.queries.collect` of ``prompts`` at ``sites`` (positions ``subject`` or ``last``),
    each shared head run once (module docstring); prompts whose head no other prompt shares run whole."""
    for s in sites:
        if s.position not in ("subject", "last"):
            raise ValueError(f"site {s}: the shared-head path reads positions 'subject' and 'last' only")
    heads = heads or Heads(lm)
    n = len(prompts)
    out = {s: None for s in sites}
    nxt = torch.empty(n, dtype=torch.long)
    shared, alone = groups_by_head(prompts)

    def put(s, idx, vals):
        if out[s] is None:
            out[s] = torch.empty((n, vals.shape[-1]), dtype=torch.float32)
        out[s][idx] = vals.float().cpu()

    if alone:
        ps = ProbeSet.from_prompts([prompts[i] for i in alone], pad_id=lm.pad_id)
        acts = collect(lm, ps, sites, batch_size=batch_size)
        for s in sites:
            put(s, torch.as_tensor(alone), acts[s])
        nxt[torch.as_tensor(alone)] = acts.next_token
    want = {s.hook for s in sites}
    keep = keep_last(lm)
    for head, idx in shared.items():
        kv = heads.cache(head)
        first = len(head)
        idx = sorted(idx, key=lambda i: len(prompts[i].tokens))
        for c0 in range(0, len(idx), batch_size):
            part = idx[c0:c0 + batch_size]
            tails = [prompts[i].tokens[first:] for i in part]
            toks = pad_batch(tails, lm.pad_id, "right")[0]
            last = torch.tensor([len(t) - 1 for t in tails])
            subj = torch.tensor([prompts[i].subject_last - first for i in part])
            kw = {"logits_to_keep": last[:, None].to(lm.device)} if keep else {}
            logits, acts = lm.bridge.run_with_cache(toks.to(lm.device), past_key_values=_copies(kv, -1, len(part)),
                                                    names_filter=lambda name: name in want, **kw)
            logits = logits_of(logits)
            rows = torch.arange(len(part))
            at = torch.as_tensor(part)
            for s in sites:
                p = subj if s.position == "subject" else last
                put(s, at, acts[s.hook][rows, p.to(acts[s.hook].device)])
            lp = torch.zeros_like(last) if keep else last
            nxt[at] = logits[rows, lp.to(logits.device)].argmax(-1).cpu()
    return Activations(out, nxt)

