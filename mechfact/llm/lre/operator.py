"""The LRE operator and the model-facing steps both LRE protocols share.

* :class:`LRE`: ``beta * J s + b`` with rank-r pseudo-inverses of ``beta J`` (one SVD for every rank);
* :func:`jacobians` / :func:`estimate_lre`: per-prompt Jacobians ``dz/ds`` (exact, :func:`mechfact.llm.jacobian.jacobian`)
  and their mean operator;
* :func:`states_at`: subject states at some layers, the last layer's state at the last token and the greedy next
  token, for a list of prompts (each head shared by several prompts run once, cached on disk when asked);
* :func:`decode_top`: the top token of last-layer states through the final norm and unembedding;
* :func:`edited_logits` / :func:`edited_predictions`: one prompt run with its subject state replaced by each of
  several vectors (prefix once, suffix as copies); :func:`patched_predictions`: the same through the shared
  patching engine (one prompt at a time; kept as the reference the fast path is tested against).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from ... import hooks
from ...probes.queries import ProbeSet, Site, _cache_file, _read_cache, _write_cache
from ..jacobian import jacobian
from ..jacobian.batched import _copies, _prefix_cache, _putter_at, keep_last
from ..models.loading import LanguageModel
from .shared_prefix import Heads, states_shared


@dataclass
class LRE:
    J: torch.Tensor  # (d, d) mean Jacobian
    b: torch.Tensor  # (d,)
    beta: float

    def __call__(self, s: torch.Tensor) -> torch.Tensor:  # (n, d) -> (n, d)
        return self.beta * s @ self.J.T + self.b

    def pinv(self, rank: int) -> torch.Tensor:
        """Rank-``rank`` pseudo-inverse of ``beta J``."""
        return self.pinvs([rank])[rank]

    def pinvs(self, ranks: list[int]) -> dict[int, torch.Tensor]:
        """Rank-r pseudo-inverses of ``beta J`` for every r of ``ranks``, from one SVD."""
        U, S, Vh = torch.linalg.svd(self.beta * self.J.double())
        n = int((S > S[0] * 1e-10).sum())
        return {rank: (Vh[:r].T @ torch.diag(1 / S[:r]) @ U[:, :r].T).float()
                for rank in ranks for r in [min(rank, n)]}


def jacobians(lm: LanguageModel, prompts: list, layer: int, chunk: int | None, progress: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(Js (n, d, d), bs (n, d)): each prompt's Jacobian ``dz/ds`` and ``z - J s`` at its subject's last token."""
    Js, bs = [], []
    for p in tqdm(prompts, desc="jacobians", leave=False, **({} if progress else {"disable": True})):
        J, s, o = jacobian(lm, p.tokens, p.subject_last, layer, chunk)
        Js.append(J)
        bs.append(o - J @ s)
    return torch.stack(Js), torch.stack(bs)


def estimate_lre(lm: LanguageModel, prompts: list, idx: list[int], layer: int, beta: float, chunk: int | None = None,
                 progress: bool = False) -> LRE:
    """The operator of prompts ``idx``: the mean of their Jacobians and of their ``z - J s``."""
    Js, bs = jacobians(lm, [prompts[i] for i in idx], layer, chunk, progress)
    return LRE(J=Js.mean(0), b=bs.mean(0), beta=beta)


def states_at(lm: LanguageModel, prompts: list, layers: list[int], batch_size: int, cache: bool,
              heads: "Heads | None" = None) -> tuple[dict[int, torch.Tensor], torch.Tensor, torch.Tensor]:
    """({layer: subject states}, last-layer states at the last token, greedy next tokens) of ``prompts``.

    Prompts sharing the tokens before their subject run that head once (:mod:`.shared_heads`; ``heads`` keeps
    the caches for later edited runs); ``cache``: the result is kept on disk, keyed as
    :func:`~mechfact.probes.queries.collect` keys it.
    """
    ps = ProbeSet.from_prompts(prompts, pad_id=lm.pad_id)
    s_sites = {l: Site(hooks.resid(l, "post"), "subject") for l in layers}
    z_site = Site(hooks.resid(lm.n_layers - 1, "post"), "last")
    sites = [*s_sites.values(), z_site]
    path = _cache_file(lm, ps, sites) if cache and getattr(lm, "model_id", None) else None
    acts = _read_cache(path, sites, len(ps)) if path is not None and path.is_file() else None
    if acts is None:
        acts = states_shared(lm, prompts, sites, batch_size, heads)
        if path is not None:
            _write_cache(path, [acts[s] for s in sites], acts.next_token)
    return {l: acts[st] for l, st in s_sites.items()}, acts[z_site], acts.next_token


def decode_top(lm: LanguageModel, o: torch.Tensor) -> torch.Tensor:
    """Top token of final-layer states o (n, d) through the final norm and the unembedding."""
    with torch.no_grad():
        x = o.to(lm.device, lm.dtype)[:, None]
        return lm.bridge.unembed(lm.bridge.ln_final(x))[:, 0].argmax(-1).cpu()


def edited_logits(lm: LanguageModel, tokens: list[int], pos: int, layer: int, states: torch.Tensor,
                  chunk: int = 64, prefix=None, start: int | None = None) -> torch.Tensor:
    """Next-token logits (m, vocab) of one prompt with its state at (``layer``, ``pos``) set to each row of
    ``states`` (m, d).

    The prefix before ``start`` (default ``pos``) runs once; the rest runs once up to ``layer`` and as ``m``
    copies (in chunks) after it -- the same numbers as patching the full prompt ``m`` times (tested), a fraction
    of the work. ``prefix``: the key/value cache of ``tokens[:start]`` when the caller has it (a prompt head's,
    :class:`.shared_heads.Heads`; only copies of it are run on), else computed here.
    """
    start = pos if start is None else start
    if not 0 <= start <= pos:
        raise ValueError(f"edited_logits: start {start} must lie in [0, pos = {pos}]")
    toks = torch.tensor([tokens], device=lm.device)
    pkv = prefix if prefix is not None else _prefix_cache(lm, toks, start)
    keep = keep_last(lm)
    out = []
    with torch.no_grad():
        for c0 in range(0, len(states), chunk):
            st = states[c0:c0 + chunk].to(lm.device, lm.dtype)
            put = _putter_at(st, pos - start)
            logits = lm.bridge.run_with_hooks(toks[:, start:], past_key_values=_copies(pkv, layer, len(st)),
                                              fwd_hooks=[(hooks.resid(layer, "post"), put)], **keep)
            out.append(logits[:, -1].float().cpu())
    return torch.cat(out)


def edited_predictions(lm: LanguageModel, tokens: list[int], pos: int, layer: int, states: torch.Tensor,
                       chunk: int = 64, prefix=None, start: int | None = None) -> torch.Tensor:
    """Greedy next token (m,) of :func:`edited_logits`."""
    return edited_logits(lm, tokens, pos, layer, states, chunk, prefix, start).argmax(-1)


def patched_predictions(lm: LanguageModel, prompts: list, idx: list[int], layer: int, new_states: torch.Tensor
                        ) -> torch.Tensor:
    """Greedy next token of prompts ``idx`` with the subject state at ``layer`` set to ``new_states[k]``.

    Uses the shared patching engine (:func:`mechfact.probes.patching.run_with_interventions`, kind ``set``
    at the subject position), one prompt at a time since each gets its own vector.
    """
    from ...probes.patching import Intervention, run_with_interventions

    ps = ProbeSet.from_prompts([prompts[i] for i in idx], pad_id=lm.pad_id, objects=idx, subjects=idx)
    out = torch.empty(len(idx), dtype=torch.long)
    for k in range(len(idx)):
        iv = Intervention(site=hooks.resid(layer, "post"), kind="set", position="subject",
                          values=new_states[k].tolist())
        out[k] = run_with_interventions(lm, ps.subset([k]), [iv]).argmax(-1)[0]
    return out
