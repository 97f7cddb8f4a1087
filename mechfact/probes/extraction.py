"""Attribute extraction (Geva et al., EMNLP 2023, "Dissecting Recall of Factual Associations"): how the last
position reads the fact out of the subject. Three measurements on any hooked model (a FactModel or a
LanguageModel), each over the facts it knows (queries as in :mod:`.tracing`: ``tokens`` (n,) ending at the answer
position ``a = n - 1``, ``subject`` (first, last) token, ``index``).

**Attention knockout** (:func:`attention_knockout`): in :mod:`.knockout`, which also holds the helpers the three
share; its names are re-exported from this module.

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
from ..results import Result
from ..seeding import derive_seed
from .knockout import (TARGETS, FactKnockout, KnockoutResult, _check_layers, _check_queries, _estimate, _f,  # noqa: F401
                       _n_layers, attention_knockout, check_knockout, default_window, knockout_hook,
                       knockout_query, position_groups)
from .queries import StopForward, model_device

POSITIONS = ("subject_first", "subject_last", "last")
SUBLAYERS = ("attn", "mlp")


def _vocab(model) -> int:
    return int(model.W_U.shape[-1])


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
                    raise StopForward
                return x
            return fn
        try:
            model.run_with_hooks(toks, fwd_hooks=[(nm, grab(nm)) for nm in dict.fromkeys([*names, last_hook])])
        except StopForward:
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
class AttributeRateResult(Result):
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
class ExtractionResult(Result):
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
