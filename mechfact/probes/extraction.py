"""Attribute extraction (Geva et al., EMNLP 2023, "Dissecting Recall of Factual Associations"): how the last
position reads the fact out of the subject. Three measurements on any hooked model (a FactModel or a
LanguageModel), each over the facts it knows (queries as in :mod:`.tracing`: ``tokens`` (n,) ending at the answer
position ``a = n - 1``, ``subject`` (first, last) token, ``index``).

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

**Attribute rate** (:func:`attribute_rate`). The residual state at each position of ``positions`` and each layer
(``-1``: the input of block 0, i.e. the embedding; ``l``: the output of block ``l``) is read with the logit lens
(``model.final_logits``: the final norm, then the unembedding); its rate is the fraction of the top-``k`` tokens
that are attributes of the subject. The attribute set of a query is its ``attributes`` (token ids); for a fact
world, :func:`world_attributes` gives each subject's objects under all relations; for pretrained models,
:func:`relation_attributes` gives the first token of each object the subject has in the given relations (the
authors took tokens of the subject's Wikipedia paragraph, which the relation data has not). The baseline is
the same rate for the attribute set of another subject (a query with a different subject drawn at random):
what the top-``k`` share with attributes by chance.

**Extraction events** (:func:`extraction_events`). At the last position, the update each sublayer writes into
the residual stream (``hook_attn_out``, ``hook_mlp_out``) is read with the logit lens on its own: an
extraction event at layer ``l`` is the top-1 token of ``final_logits(update)`` being the clean run's top-1
token (the authors' ``argmax(E a^l) = o`` on facts the model predicts). Reported: the fraction of facts with an
event per sublayer and layer, and with an event at any layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import hooks, stats
from ..seeding import derive_seed
from .queries import model_device
from .tracing import window_layers

TARGETS = ("subject", "relation", "last")
POSITIONS = ("subject_first", "subject_last", "last")
SUBLAYERS = ("attn", "mlp")


def knockout_hook(layer: int) -> str:
    """The hook a knockout edits: the attention pattern (batch, head, query, key) of block ``layer``.

    Editing it changes the output of a FactModel and of a transformer-lens ``TransformerBridge`` (whose attention
    multiplies the values by the hooked pattern): on a bridge it equals setting ``hook_attn_scores`` to ``-inf``
    (tests/test_extraction.py checks both)."""
    return hooks.attn_pattern(layer)


def default_window(n_layers: int) -> int:
    """9 of GPT-2 XL's 48 layers (the authors' knockout window), scaled to the depth (at least 1)."""
    return max(1, round(9 * n_layers / 48))


class _Stop(Exception):
    pass


def _n_layers(model) -> int:
    n = getattr(model, "n_layers", None)
    if n is None:
        raise TypeError(f"{type(model).__name__} has no n_layers: attribute extraction needs a hooked model with "
                        "n_layers and final_logits (a LanguageModel or a FactModel)")
    return int(n)


def _vocab(model) -> int:
    return int(model.W_U.shape[-1])


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
class KnockoutResult:
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
        raise _Stop
    try:
        model.run_with_hooks(tokens, fwd_hooks=list(fwd_hooks) + [(hooks.resid(L - 1, "post"), stop)])
    except _Stop:
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


# ---- states at chosen positions ---------------------------------------------------------------------------------

def _positions(q: dict, names: Sequence[str]) -> list[int]:
    s0, s1 = (int(v) for v in q["subject"])
    at = {"subject_first": s0, "subject_last": s1, "last": len(q["tokens"]) - 1}
    return [at[p] for p in names]


@torch.no_grad()
def _collect(model, queries: Sequence[dict], names: Sequence[str], positions: Sequence[str], batch_size: int,
             progress: bool, desc: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The states at the hook points ``names`` and positions ``positions`` of every query, {name: (n_queries, P, d)},
    and the clean top-1 token of each query (n_queries,); same-length queries share forward passes."""
    dev = model_device(model)
    L = _n_layers(model)
    last_hook = hooks.resid(L - 1, "post")
    by_len: dict[int, list[int]] = {}
    for i, q in enumerate(queries):
        by_len.setdefault(len(q["tokens"]), []).append(i)
    out = {nm: [None] * len(queries) for nm in names}
    top = torch.zeros(len(queries), dtype=torch.long)
    batches = [(n, idx[b:b + batch_size]) for n, idx in sorted(by_len.items()) for b in range(0, len(idx), batch_size)]
    for n, idx in tqdm(batches, desc=desc, leave=False, disable=not progress):
        toks = torch.stack([queries[i]["tokens"].to(dev) for i in idx])
        pos = torch.tensor([_positions(queries[i], positions) for i in idx], device=dev)
        rows = torch.arange(len(idx), device=dev)[:, None]
        box = {}

        def grab(name):
            def fn(x, hook=None):
                if name in names:
                    box[name] = x[rows, pos].detach().clone()
                if name == last_hook:
                    box["last"] = x[:, n - 1].detach().clone()
                    raise _Stop
                return x
            return fn
        try:
            model.run_with_hooks(toks, fwd_hooks=[(nm, grab(nm)) for nm in dict.fromkeys([*names, last_hook])])
        except _Stop:
            pass
        t = model.final_logits(box["last"]).float().argmax(-1).cpu()
        for r, i in enumerate(idx):
            top[i] = t[r]
            for nm in names:
                out[nm][i] = box[nm][r]
    return {nm: torch.stack(v) for nm, v in out.items()}, top


_CHUNK = 256  # queries whose states are held at once
_LENS_ROWS = 1024  # states unembedded at once


def _lens(model, x: torch.Tensor, pick: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``pick`` of the logit lens (``model.final_logits``) of states ``x`` (rows, d), in blocks of rows, on CPU."""
    return torch.cat([pick(model.final_logits(x[i:i + _LENS_ROWS]).float()).cpu()
                      for i in range(0, x.shape[0], _LENS_ROWS)])


# ---- attribute rate ---------------------------------------------------------------------------------------------

def world_attributes(world, queries: Sequence[dict]) -> list[dict]:
    """Copies of fact-world ``queries`` (subject token = entity id) with ``attributes``: the subject's objects
    under every relation of ``world`` (``world.perms[:, s]``)."""
    out = []
    for q in queries:
        s = int(q["tokens"][int(q["subject"][0])])
        if not 0 <= s < world.n_entities:
            raise ValueError(f"query {q.get('index')}: subject token {s} is not an entity of the world "
                             f"(0..{world.n_entities - 1})")
        out.append({**q, "attributes": frozenset(int(v) for v in world.perms[:, s].tolist())})
    return out


def relation_attributes(tokenizer, queries: Sequence[dict], relations: Sequence) -> list[dict]:
    """Copies of relation ``queries`` (with ``subject_text``) with ``attributes``: the first token (after a
    space, as an object continues a prompt) of every object the subject has in ``relations`` (objects with
    ``subjects`` and ``objects`` lists, e.g. :class:`mechfact.llm.relations.Relation`; load files with
    :func:`mechfact.llm.relations.load_relations`)."""
    objects: dict[str, set[str]] = {}
    for rel in relations:
        for s, o in zip(rel.subjects, rel.objects):
            objects.setdefault(s, set()).add(o)
    out = []
    for q in queries:
        if "subject_text" not in q:
            raise ValueError(f"query {q.get('index')}: no subject_text to look its objects up by")
        ids = set()
        for o in sorted(objects.get(q["subject_text"], ())):
            toks = tokenizer(" " + o, add_special_tokens=False)["input_ids"]
            if toks:
                ids.add(int(toks[0]))
        out.append({**q, "attributes": frozenset(ids)})
    return out


def _subject_key(q: dict):
    if "subject_text" in q:
        return q["subject_text"]
    s0, s1 = (int(v) for v in q["subject"])
    return tuple(int(t) for t in q["tokens"][s0:s1 + 1])


@dataclass(frozen=True)
class FactAttributes:
    """One query's rates: ``rate[p, k]`` at position ``positions[p]`` and layer ``layers[k]``."""

    index: int
    n_attributes: int
    control: int | None  # the index of the query whose attribute set gives the baseline
    rate: np.ndarray = field(repr=False)  # (P, n_layers)
    baseline: np.ndarray = field(repr=False)  # (P, n_layers); NaN without another subject


@dataclass(frozen=True)
class AttributeRateResult:
    """Attribute rates of many queries; ``layers``: ``-1`` (the embedding) and the blocks read."""

    k: int
    positions: tuple[str, ...]
    layers: tuple[int, ...]
    facts: tuple[FactAttributes, ...]

    def rates(self) -> tuple[np.ndarray, np.ndarray]:
        """(rate, baseline), each (n_facts, P, n_layers)."""
        if not self.facts:
            z = np.zeros((0, len(self.positions), len(self.layers)))
            return z, z
        return np.stack([f.rate for f in self.facts]), np.stack([f.baseline for f in self.facts])

    def summary(self, seed: int = 0) -> dict:
        """Per position and layer: the mean rate, the random-subject baseline and their difference (paired over
        facts), each with a 95% bootstrap interval over facts."""
        rate, base = self.rates()
        per = {}
        for p, name in enumerate(self.positions):
            rows = []
            for k, layer in enumerate(self.layers):
                rows.append({"layer": layer, **stats.fields("rate", _estimate(rate[:, p, k], seed)),
                             **stats.fields("baseline", _estimate(base[:, p, k], seed)),
                             **stats.fields("excess", _estimate(rate[:, p, k] - base[:, p, k], seed))})
            per[name] = rows
        return {"n_facts": len(self.facts), "k": self.k, "rate": per}

    @property
    def records(self) -> list[dict]:
        """One flat row per (fact, position, layer)."""
        return [{"fact": f.index, "position": name, "layer": layer, "k": self.k, "rate": float(f.rate[p, j]),
                 "baseline": _f(f.baseline[p, j]), "n_attributes": f.n_attributes}
                for f in self.facts for p, name in enumerate(self.positions) for j, layer in enumerate(self.layers)]

    def to_dict(self) -> dict:
        return {"k": self.k, "positions": list(self.positions), "layers": list(self.layers),
                "facts": [{"index": f.index, "n_attributes": f.n_attributes, "control": f.control,
                           "rate": np.round(f.rate, 6).tolist(),
                           "baseline": [[_f(x) for x in row] for row in np.round(f.baseline, 6)]}
                          for f in self.facts]}


def _check_positions(positions: Sequence[str]) -> tuple[str, ...]:
    if isinstance(positions, str) or not positions:
        raise ValueError(f"positions {positions!r}: a non-empty list among {', '.join(POSITIONS)}")
    bad = [p for p in positions if p not in POSITIONS]
    if bad:
        raise ValueError(f"position {bad[0]!r}: allowed {', '.join(POSITIONS)}")
    return tuple(dict.fromkeys(positions))


@torch.no_grad()
def attribute_rate(model, queries: Sequence[dict], *, k: int = 50, positions: Sequence[str] = ("subject_last", "last"),
                   world=None, layers: Sequence[int] | None = None, seed: int = 0, batch_size: int = 32,
                   progress: bool = False) -> AttributeRateResult:
    """The fraction of the top-``k`` logit-lens tokens that are attributes of the subject, per position and layer,
    and the same for another subject's attributes (module docstring). Each query needs ``attributes`` (token ids),
    or ``world`` to take them from (:func:`world_attributes`)."""
    L = _n_layers(model)
    V = _vocab(model)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= V:
        raise ValueError(f"k {k!r}: must be an integer in 1..{V} (the model's output vocabulary)")
    positions = _check_positions(positions)
    layers = _check_layers(layers, list(range(-1, L)), "-1: the embedding, l: the output of block l")
    _check_queries(queries)
    if any("attributes" not in q for q in queries):
        if world is None:
            raise ValueError("queries without attributes: give each query its attribute token ids, or pass world "
                             "(see world_attributes, relation_attributes)")
        queries = [q if "attributes" in q else world_attributes(world, [q])[0] for q in queries]
    names = [hooks.resid(0, "pre") if l < 0 else hooks.resid(l, "post") for l in layers]
    n, P = len(queries), len(positions)
    top = []
    for c in range(0, n, _CHUNK):
        states, _ = _collect(model, queries[c:c + _CHUNK], names, positions, batch_size, progress, "attribute rate")
        x = torch.stack([states[nm] for nm in names], 2)  # (chunk, P, n_layers, d)
        top.append(_lens(model, x.reshape(-1, x.shape[-1]), lambda lg: lg.topk(k, -1).indices))
    top = torch.cat(top).view(n, P, len(layers), k)
    keys = [_subject_key(q) for q in queries]
    rng = np.random.default_rng(derive_seed(seed, "probes.extraction.baseline"))
    facts = []
    for i, q in enumerate(queries):
        others = [j for j in range(n) if keys[j] != keys[i]]
        j = others[int(rng.integers(len(others)))] if others else None

        def rate(attrs) -> np.ndarray:
            hit = torch.isin(top[i], torch.tensor(sorted(int(t) for t in attrs), dtype=torch.long))
            return hit.float().mean(-1).numpy().astype(float)
        attrs = q["attributes"]
        facts.append(FactAttributes(index=int(q.get("index", i)), n_attributes=len(attrs), control=j,
                                    rate=rate(attrs),
                                    baseline=rate(queries[j]["attributes"]) if j is not None
                                    else np.full((P, len(layers)), np.nan)))
    return AttributeRateResult(k=k, positions=positions, layers=tuple(layers), facts=tuple(facts))


# ---- extraction events ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FactExtraction:
    """One query's events at the last position: ``events[s, l]`` for sublayer ``SUBLAYERS[s]`` and layer ``l``."""

    index: int
    target: int  # the clean run's top-1 token
    top: np.ndarray = field(repr=False)  # (2, n_layers) the top-1 token of each sublayer update's logit lens

    @property
    def events(self) -> np.ndarray:
        return self.top == self.target


@dataclass(frozen=True)
class ExtractionResult:
    """Extraction events of many queries at every layer."""

    layers: tuple[int, ...]
    facts: tuple[FactExtraction, ...]

    def events(self) -> np.ndarray:
        """(n_facts, 2, n_layers) booleans."""
        if not self.facts:
            return np.zeros((0, len(SUBLAYERS), len(self.layers)), dtype=bool)
        return np.stack([f.events for f in self.facts])

    def summary(self, seed: int = 0) -> dict:
        """Per sublayer: the fraction of facts with an event at each layer and at any layer, with 95% bootstrap
        intervals over facts."""
        ev = self.events().astype(float)
        out = {"n_facts": len(self.facts)}
        for s, name in enumerate(SUBLAYERS):
            out[name] = [{"layer": layer, **stats.fields("rate", _estimate(ev[:, s, k], seed))}
                         for k, layer in enumerate(self.layers)]
            out[f"{name}_any"] = stats.fields("rate", _estimate(ev[:, s].max(-1) if len(ev) else ev[:, s, 0],
                                                                seed))
        return out

    @property
    def records(self) -> list[dict]:
        """One flat row per (fact, sublayer, layer)."""
        return [{"fact": f.index, "sublayer": name, "layer": layer, "target": f.target, "top": int(f.top[s, k]),
                 "event": bool(f.events[s, k])}
                for f in self.facts for s, name in enumerate(SUBLAYERS) for k, layer in enumerate(self.layers)]

    def to_dict(self) -> dict:
        return {"layers": list(self.layers), "sublayers": list(SUBLAYERS),
                "facts": [{"index": f.index, "target": f.target, "top": f.top.tolist()} for f in self.facts]}


@torch.no_grad()
def extraction_events(model, queries: Sequence[dict], *, batch_size: int = 32, progress: bool = False
                      ) -> ExtractionResult:
    """Per layer, whether the attention (MLP) update at the last position alone has the clean top-1 token as its
    logit lens's top-1 (module docstring)."""
    L = _n_layers(model)
    _check_queries(queries)
    names = [hooks.attn_out(l) for l in range(L)] + [hooks.mlp_out(l) for l in range(L)]
    n = len(queries)
    top, target = [], []
    for c in range(0, n, _CHUNK):
        states, t = _collect(model, queries[c:c + _CHUNK], names, ["last"], batch_size, progress, "extraction")
        x = torch.stack([states[nm][:, 0] for nm in names], 1)  # (chunk, 2L, d)
        top.append(_lens(model, x.reshape(-1, x.shape[-1]), lambda lg: lg.argmax(-1)))
        target.append(t)
    top, target = torch.cat(top).view(n, 2, L), torch.cat(target)
    facts = [FactExtraction(index=int(q.get("index", i)), target=int(target[i]), top=top[i].numpy())
             for i, q in enumerate(queries)]
    return ExtractionResult(layers=tuple(range(L)), facts=tuple(facts))


__all__ = ["TARGETS", "POSITIONS", "SUBLAYERS", "knockout_hook", "default_window", "position_groups",
           "FactKnockout", "KnockoutResult", "check_knockout", "knockout_query", "attention_knockout",
           "world_attributes", "relation_attributes", "FactAttributes", "AttributeRateResult", "attribute_rate",
           "FactExtraction", "ExtractionResult", "extraction_events"]
