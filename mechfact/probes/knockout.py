"""Attention knockout (Geva et al., EMNLP 2023, "Dissecting Recall of Factual Associations"): which positions the
last position must attend to for a fact to be recalled, on any hooked model (a FactModel or a LanguageModel), over
the facts it knows (queries as in :mod:`.tracing`: ``tokens`` (n,) ending at the answer position ``a = n - 1``,
``subject`` (first, last) token, ``index``). Also the helpers the other extraction measurements share
(:mod:`.extraction`: attribute rate, extraction events).

**Attention knockout** (:func:`attention_knockout`). Position groups of a query, the authors' three:
``subject`` (the subject's tokens), ``relation`` (every other token before the last one: their "non-subject"
group) and ``last`` (the last position itself). For each layer ``l`` (the centre of a window of ``window``
layers, :func:`~mechfact.probes.tracing.window_layers`; default 9 of GPT-2 XL's 48 layers scaled to the depth,
at least 1: :func:`default_window`) the last position's attention to one group is blocked in every head of the
window's layers, and the score is the relative change of the probability of the clean run's top-1 token ``y``:
``100 * (p_blocked(y) - p_clean(y)) / p_clean(y)`` (percent). Blocking sets the last query row's pre-softmax
scores at the group's keys to ``-inf``; done at the attention pattern (:func:`knockout_hook`), where it is the
same thing: those entries of the row zeroed and the row renormalised over the remaining keys (a uniform
averaging head is renormalised alike). A query whose first token is the model's BOS (``model.bos_id``) keeps
it out of ``relation``: the authors' models (GPT-2, GPT-J) prepend none, and blocking an attention sink would
measure the sink, not the relation. Nothing outside the target group is blocked; ``last`` blocks the last
position's attention to itself. An empty group (``[s, r]`` has no relation token besides the last) scores NaN
(``None`` in summaries), without running. Rows (group, layer) of one query share forward passes
(``batch_rows`` rows each), which stop after the last block; only the last position is unembedded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import hooks, stats
from ..results import Result
from .queries import StopForward, model_device
from .tracing import _n_layers as tracing_depth
from .tracing import window_layers

TARGETS = ("subject", "relation", "last")


def knockout_hook(layer: int) -> str:
    """The hook a knockout edits: the attention pattern (batch, head, query, key) of block ``layer``.

    Editing it changes the output of a FactModel and of a transformer-lens ``TransformerBridge`` (whose attention
    multiplies the values by the hooked pattern): on a bridge it equals setting ``hook_attn_scores`` to ``-inf``
    (tests/test_extraction.py checks both)."""
    return hooks.attn_pattern(layer)


def default_window(n_layers: int) -> int:
    """9 of GPT-2 XL's 48 layers (the authors' knockout window), scaled to the depth (at least 1)."""
    return max(1, round(9 * n_layers / 48))


def _n_layers(model) -> int:
    return tracing_depth(model, "attribute extraction")


def _check_queries(queries: Sequence[dict]) -> None:
    if not queries:
        raise ValueError("queries is empty: no known facts to measure (the model answers none?)")
    for q in queries:
        s0, s1 = (int(v) for v in q["subject"])
        a = len(q["tokens"]) - 1
        if not 0 <= s0 <= s1 < a:
            raise ValueError(f"query {q.get('index')}: subject tokens {s0}..{s1} must lie inside the prompt before "
                             f"its last token (positions 0..{a - 1})")


def _check_layers(layers: Sequence[int] | None, every: list[int], what: str) -> list[int]:
    if layers is None:
        return every
    bad = [l for l in layers if l not in every]
    if bad or not layers:
        raise ValueError(f"layers {bad or list(layers)}: allowed {every[0]}..{every[-1]} ({what})")
    return sorted(set(int(l) for l in layers))


def _f(x) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def _estimate(values: np.ndarray, seed: int) -> stats.Estimate:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return stats.bootstrap(v, seed=seed)


def position_groups(tokens: torch.Tensor, subject: tuple[int, int], bos_id: int | None = None
                    ) -> dict[str, list[int]]:
    """The key positions of each knockout group (module docstring): ``subject``, ``relation``, ``last``."""
    n = len(tokens)
    a = n - 1
    s0, s1 = int(subject[0]), int(subject[1])
    bos = bos_id is not None and s0 > 0 and int(tokens[0]) == int(bos_id)
    return {"subject": list(range(s0, s1 + 1)),
            "relation": [t for t in range(a) if not s0 <= t <= s1 and not (bos and t == 0)],
            "last": [a]}


# ---- attention knockout -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FactKnockout:
    """One query's knockouts: ``p_blocked[g, k]`` for group ``targets[g]`` and centre layer ``layers[k]``."""

    index: int
    target: int  # the clean run's top-1 token
    p_clean: float
    groups: dict  # group name -> key positions blocked (the query's positions)
    p_blocked: np.ndarray = field(repr=False)  # (n_targets, n_layers); NaN: empty group

    @property
    def change(self) -> np.ndarray:
        """(n_targets, n_layers): ``100 * (p_blocked - p_clean) / p_clean`` (percent)."""
        return 100.0 * (self.p_blocked - self.p_clean) / self.p_clean


@dataclass(frozen=True)
class KnockoutResult(Result):
    """Attention knockouts of many queries; ``layers``: the windows' centre layers."""

    targets: tuple[str, ...]
    window: int
    layers: tuple[int, ...]
    facts: tuple[FactKnockout, ...]

    def changes(self) -> np.ndarray:
        """(n_facts, n_targets, n_layers) relative changes in percent (NaN: empty group)."""
        if not self.facts:
            return np.zeros((0, len(self.targets), len(self.layers)))
        return np.stack([f.change for f in self.facts])

    def summary(self, seed: int = 0) -> dict:
        """Mean relative change (percent) per group and layer with 95% bootstrap intervals over facts (facts with
        an empty group left out), and per group the layer of the largest drop."""
        ch = self.changes()
        out = {"n_facts": len(self.facts), "window": self.window,
               **stats.fields("p_clean", stats.bootstrap([f.p_clean for f in self.facts], seed=seed))}
        per = {}
        for g, name in enumerate(self.targets):
            rows = []
            for k, layer in enumerate(self.layers):
                est = _estimate(ch[:, g, k], seed)
                rows.append({"layer": layer, **stats.fields("change", est)})
            per[name] = rows
            scored = [r for r in rows if r["change"] is not None]
            if scored:
                low = min(scored, key=lambda r: r["change"])
                out[f"largest_drop_{name}"] = {"layer": low["layer"], "change": low["change"],
                                               "change_ci": low["change_ci"]}
        out["change"] = per
        return out

    @property
    def records(self) -> list[dict]:
        """One flat row per (fact, group, layer)."""
        return [{"fact": f.index, "target": name, "layer": layer, "window": self.window, "p_clean": f.p_clean,
                 "p_blocked": _f(f.p_blocked[g, k]), "change": _f(f.change[g, k]), "n_blocked": len(f.groups[name])}
                for f in self.facts for g, name in enumerate(self.targets) for k, layer in enumerate(self.layers)]

    def to_dict(self) -> dict:
        return {"targets": list(self.targets), "window": self.window, "layers": list(self.layers),
                "facts": [{"index": f.index, "target": f.target, "p_clean": f.p_clean,
                           "groups": {k: list(v) for k, v in f.groups.items()},
                           "p_blocked": [[_f(x) for x in row] for row in f.p_blocked]} for f in self.facts]}


def check_knockout(model, window: int, targets: Sequence[str], layers: Sequence[int] | None) -> list[int]:
    """The centre layers; ValueError naming a bad window, target group or layer and what is allowed."""
    L = _n_layers(model)
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= L:
        raise ValueError(f"window {window!r}: must be an integer in 1..{L} (the model's {L} layers)")
    if isinstance(targets, str) or not targets:
        raise ValueError(f"targets {targets!r}: a non-empty list of groups among {', '.join(TARGETS)}")
    bad = [t for t in targets if t not in TARGETS]
    if bad:
        raise ValueError(f"target group {bad[0]!r}: allowed {', '.join(TARGETS)}")
    return _check_layers(layers, list(range(L)), "the windows' centre layers")


def _last_state(model, tokens: torch.Tensor, fwd_hooks: list, pos: int) -> torch.Tensor:
    """The residual state after the last block at ``pos`` (rows, d); the run stops there."""
    L = _n_layers(model)
    box = {}

    def stop(x, hook=None):
        box["x"] = x[:, pos].clone()
        raise StopForward
    try:
        model.run_with_hooks(tokens, fwd_hooks=list(fwd_hooks) + [(hooks.resid(L - 1, "post"), stop)])
    except StopForward:
        pass
    return box["x"]


def _block_hook(mask: torch.Tensor, pos: int) -> Callable:
    """Zero the attention of query row ``pos`` at the keys ``mask`` (rows, n) marks; renormalise the row."""
    def fn(x, hook=None):
        row = x[:, :, pos, :]
        keep = (~mask).to(device=row.device, dtype=row.dtype)[:, None, :]
        row = row * keep
        total = row.sum(-1, keepdim=True)
        x = x.clone()
        x[:, :, pos, :] = row / torch.where(total > 0, total, torch.ones_like(total))
        return x
    return fn


@torch.no_grad()
def knockout_query(model, tokens: torch.Tensor, subject: tuple[int, int], *, window: int, layers: Sequence[int],
                   targets: Sequence[str] = TARGETS, batch_rows: int = 64, index: int = 0) -> FactKnockout:
    """One query's knockouts (module docstring); ``layers``: the windows' centre layers."""
    dev = model_device(model)
    L = _n_layers(model)
    tokens = tokens.to(dev)
    n = tokens.shape[0]
    a = n - 1
    groups = position_groups(tokens, subject, getattr(model, "bos_id", None))
    clean = model.final_logits(_last_state(model, tokens[None], [], a)).float()[0]
    y = int(clean.argmax())
    p_clean = float(torch.softmax(clean, -1)[y])
    p = np.full((len(targets), len(layers)), np.nan)
    cells = [(g, k) for g, name in enumerate(targets) if groups[name] for k in range(len(layers))]
    for c0 in range(0, len(cells), batch_rows):
        chunk = cells[c0:c0 + batch_rows]
        masks = {}
        for r, (g, k) in enumerate(chunk):
            for l in window_layers(layers[k], window, L):
                m = masks.setdefault(l, torch.zeros(len(chunk), n, dtype=torch.bool))
                m[r, groups[targets[g]]] = True
        fh = [(knockout_hook(l), _block_hook(m.to(dev), a)) for l, m in sorted(masks.items())]
        lg = model.final_logits(_last_state(model, tokens[None].expand(len(chunk), n), fh, a)).float()
        pb = torch.softmax(lg, -1)[:, y].cpu().numpy()
        for r, (g, k) in enumerate(chunk):
            p[g, k] = pb[r]
    return FactKnockout(index=index, target=y, p_clean=p_clean,
                        groups={name: tuple(groups[name]) for name in targets}, p_blocked=p)


def attention_knockout(model, queries: Sequence[dict], *, window: int | None = None,
                       targets: Sequence[str] = TARGETS, layers: Sequence[int] | None = None, batch_rows: int = 64,
                       progress: bool = False) -> KnockoutResult:
    """Block the last position's attention to each group of ``targets`` in a window of ``window`` layers around
    each of ``layers`` (default every layer); the relative change of the clean top-1 token's probability
    (module docstring). ``window`` defaults to :func:`default_window`."""
    L = _n_layers(model)
    window = default_window(L) if window is None else window
    layers = check_knockout(model, window, targets, layers)
    _check_queries(queries)
    targets = tuple(targets)
    facts = [knockout_query(model, q["tokens"], tuple(q["subject"]), window=window, layers=layers, targets=targets,
                            batch_rows=batch_rows, index=int(q.get("index", i)))
             for i, q in enumerate(tqdm(queries, desc="knockout", disable=not progress))]
    return KnockoutResult(targets=targets, window=window, layers=tuple(layers), facts=tuple(facts))


__all__ = ["TARGETS", "knockout_hook", "default_window", "position_groups", "FactKnockout", "KnockoutResult",
           "check_knockout", "knockout_query", "attention_knockout"]
