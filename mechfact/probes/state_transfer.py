"""The geometric-recall picture as two causal experiments: a subject's hidden state holds ALL its attributes at
once, and a relation-conditioned MLP at the last position selects one.

**(a) Subject-state transfer** (:func:`state_transfer`). Per relation r and layer l, for a known fact (s, r):

1. **Neutral state**: subject s's last-token residual state at layer l read from a context that names no
   relation. A pretrained model reads BOS (when the model prepends one) plus the subject's tokens AS THEY ARE
   TOKENISED IN RELATION r's PROMPT (with the leading space a mid-sentence subject takes), so the patched state is
   that of the same tokens the recipient prompt holds, not of another spelling. A fact model reads the one-token sequence ``[s]``: its queries ``[s, r]`` put the subject at
   position 0, and causal attention makes position 0's states those of ``[s]`` alone whatever relation follows,
   so this is the subject token of any relation's prompt.
2. **Transfer**: relation r's prompt for another subject s' (whose fact (s', r) the model also knows, and whose
   answer differs from s's) runs with its last subject token's state at layer l replaced by s's neutral state:
   ``blocks.<l>.hook_resid_post`` for ``l >= 0``, the token embedding (``hook_embed``) for ``l = -1``.
   **Success**: the top-1 token at the prompt's last position is s's object: the object token of a fact model,
   the LRE authors' prefix match for a pretrained model (:func:`mechfact.probes.known.prefix_match`).
3. **Control**: the same prompt of s' with the state of a random third subject s'' of the relation (not s, not
   s') patched in, drawn among the subjects of as many tokens as s (``control_same_length``: whether one was
   there; else any). ``control``: the output is s's object anyway (the chance rate of a success);
   ``control_moved``: it is the control subject's object (its state transfers too); ``control_kept``: it stays
   the target's own object. The transfer rows also record ``kept`` (the output stays the target's own object).

**The fixed layer**: the middle block (``n_layers // 2``; among the default layers) is the layer the test is
stated at before the run; ``summary()["fixed"]`` gives its transfer rate against its control, paired over the source facts (the
same target prompt), with a bootstrap interval and a sign-flip p-value (:func:`mechfact.stats.paired_difference`).
The best layer over all those run is an upper bound (chosen on the facts it scores).

A fact is known when the clean prompt's top-1 is its object (object token, or prefix match for a pretrained
model); a pair needs distinct subjects and answers that differ (neither clean top-1 matches the other fact's
object). Each known fact is the source of one pair (``max_facts``: at most that many per relation, the first in
a seeded order); the target s' and the control s'' are drawn with a seeded generator. Accuracies carry 95%
bootstrap intervals over facts (:func:`mechfact.stats.bootstrap`). Prompts are zero-shot (``"The capital of {}
is"``); the patched prompts of a layer run in right-padded batches of ``batch_size`` rows (causal attention: the
padding never reaches a real token), each answered at its own last real token.

**(b) Relation selectivity of last-position MLP units**: in :mod:`.selectivity`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import hooks, stats
from ..results import Result
from ..seeding import derive_seed
from .queries import ProbeSet, Site, StopForward, collect, model_device, pad_batch, predictions
from .tracing import _n_layers as tracing_depth

logger = logging.getLogger(__name__)

RATES = ("success", "kept", "control", "control_moved", "control_kept")


@dataclass
class TransferFact:
    """A known fact: its relation prompt (ending at the answer position) and clean top-1 token."""

    index: int  # fact index within its relation (sample index, or subject id of a fact world)
    subject: str
    objects: tuple[str, ...]  # every object of the subject in this relation
    tokens: list[int]  # the relation's prompt
    subject_pos: int  # last subject token in ``tokens``
    top1: int  # clean top-1 token at the last position
    subject_len: int = 1  # the subject's tokens in ``tokens``


@dataclass
class TransferRelation:
    """A relation's known facts and how a token is matched to objects."""

    name: str
    n_facts: int
    known: list[TransferFact]
    matches: Callable[[int, tuple[str, ...]], bool]  # does a token give one of these objects?


@dataclass
class TransferFacts:
    """What :func:`state_transfer` runs on: the relations' known facts, each subject's neutral prompt (tokens and
    last subject token; keyed by ``(relation name, subject)``, or by the subject alone where every relation
    shares it), and the padding token. A FactWorld is turned into one here; pretrained-model relations
    by :func:`mechfact.llm.transfer.transfer_facts`."""

    relations: list[TransferRelation]
    neutral: dict[str, tuple[list[int], int]]
    pad_id: int


def _is_world(source) -> bool:
    return hasattr(source, "single_hop") and hasattr(source, "perms")


def _n_layers(model) -> int:
    return tracing_depth(model, "state transfer")


def _check_layers(n_layers: int, layers) -> list[int]:
    every = list(range(-1, n_layers))
    if layers is None:
        return every
    if isinstance(layers, (int, np.integer)) and not isinstance(layers, bool):
        layers = [layers]
    layers = list(layers)
    bad = [l for l in layers if isinstance(l, bool) or not isinstance(l, (int, np.integer)) or l not in every]
    if bad or not layers:
        raise ValueError(f"layers {bad or layers}: allowed -1..{n_layers - 1} (-1: the token embedding; the model "
                         f"has {n_layers} layer{'s' if n_layers != 1 else ''})")
    return sorted({int(l) for l in layers})


def _site(layer: int) -> str:
    return hooks.embed() if layer < 0 else hooks.resid(layer, "post")


# ---- facts and their neutral contexts --------------------------------------------------------------------------

def world_facts(model, world) -> TransferFacts:
    """The known facts of a FactWorld, each subject's neutral prompt ``[s]``."""
    ps = ProbeSet.from_world(world)
    top = predictions(model, ps)
    rels = []
    for r in range(world.n_relations):
        rows = torch.nonzero(ps.relations == r).reshape(-1).tolist()
        known = [TransferFact(int(ps.subjects[i]), str(int(ps.subjects[i])), (str(int(ps.object_tokens[i])),),
                       ps.tokens[i, :int(ps.answer_pos[i]) + 1].tolist(), int(ps.subject_pos[i]), int(top[i]))
                 for i in rows if int(top[i]) == int(ps.object_tokens[i])]
        rels.append(TransferRelation(f"r{r}", len(rows), known, lambda t, objs: str(int(t)) in objs))
    neutral = {str(s): ([s], 0) for s in range(world.n_entities)}
    return TransferFacts(rels, neutral, int(world.pad_token))


@dataclass
class _Neutral:
    tokens: list[int]
    subject_first: int
    subject_last: int


def _neutral(source: TransferFacts, relation: str, subject: str) -> tuple[list[int], int]:
    return source.neutral.get((relation, subject)) or source.neutral[subject]


def _pairs(rel: TransferRelation, max_facts: int | None, seed: int) -> list[tuple[TransferFact, TransferFact, TransferFact]]:
    """(source s, target s', control s'') per source fact; see the module docstring."""
    facts = rel.known
    rng = np.random.default_rng(derive_seed(seed, f"probes.state_transfer.{rel.name}"))
    order = [facts[i] for i in rng.permutation(len(facts))]
    out = []
    for s in order:
        if max_facts is not None and len(out) >= max_facts:
            break
        targets = [t for t in facts if t.subject != s.subject and not rel.matches(t.top1, s.objects)
                   and not rel.matches(s.top1, t.objects)]
        if not targets:
            continue
        t = targets[int(rng.integers(len(targets)))]
        controls = [c for c in facts if c.subject not in (s.subject, t.subject)]
        if not controls:
            continue
        controls = [c for c in controls if c.subject_len == s.subject_len] or controls
        out.append((s, t, controls[int(rng.integers(len(controls)))]))
    return out


# ---- the batched patched runs ------------------------------------------------------------------------------------

@torch.no_grad()
def _patched_top1(model, tokens: list[list[int]], pos: list[int], states: torch.Tensor, layer: int, pad_id: int,
                  batch_size: int) -> torch.Tensor:
    """Top-1 token at each prompt's last real token, with ``states[i]`` written at ``(i, pos[i])`` of the layer's
    site; prompts run in length-sorted batches, and each run stops after the last block and unembeds only the
    answer positions."""
    dev = model_device(model)
    site, last = _site(layer), hooks.resid(_n_layers(model) - 1, "post")
    out = torch.empty(len(tokens), dtype=torch.long)
    order = sorted(range(len(tokens)), key=lambda i: len(tokens[i]))
    for b0 in range(0, len(tokens), batch_size):
        idx = order[b0:b0 + batch_size]
        toks = pad_batch([tokens[i] for i in idx], pad_id, "right")[0].to(dev)
        rows = torch.arange(len(idx), device=dev)
        p = torch.tensor([pos[i] for i in idx], device=dev)
        ans = torch.tensor([len(tokens[i]) - 1 for i in idx], device=dev)
        v = states[idx]
        box = {}

        def patch(x, hook=None, p=p, v=v):
            x[rows.to(x.device), p.to(x.device)] = v.to(x.device, x.dtype)
            return x

        def stop(x, hook=None, ans=ans):
            if site == last:
                x = patch(x)
            box["final"] = x[rows.to(x.device), ans.to(x.device)].clone()
            raise StopForward

        fwd = ([] if site == last else [(site, patch)]) + [(last, stop)]
        try:
            model.run_with_hooks(toks, fwd_hooks=fwd)
        except StopForward:
            pass
        out[idx] = model.final_logits(box["final"]).float().argmax(-1).cpu()
    return out


# ---- results -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TransferResult(Result):
    """Per (relation, layer, source fact): ``success``, ``kept``, ``control``, ``control_moved``,
    ``control_kept`` (module docstring), with the subjects, facts and top-1 tokens of both runs."""

    layers: tuple[int, ...]
    relations: list[dict]  # name, n_facts, n_known, n_pairs
    records: list[dict] = field(repr=False)
    fixed_layer: int | None = None  # the layer the test is stated at (module docstring)

    def summary(self, seed: int = 0) -> dict:
        """``per_relation``: per relation and layer, each rate with its 95% bootstrap interval over facts and its
        n (``accuracy`` is the transfer's success rate); ``pooled``: the same per layer over every relation."""
        def row(recs: list[dict]) -> dict:
            out = {}
            for k in RATES:
                est = stats.bootstrap(np.array([r[k] for r in recs], dtype=float), seed=seed)
                out.update(stats.fields("accuracy" if k == "success" else k, est))
            return out

        per, pooled = [], []
        for layer in self.layers:
            at = [r for r in self.records if r["layer"] == layer]
            for rel in self.relations:
                recs = [r for r in at if r["relation"] == rel["name"]]
                if recs:
                    per.append({"relation": rel["name"], "layer": layer, "n": len(recs), **row(recs)})
            if at:
                pooled.append({"layer": layer, "n": len(at), **row(at)})
        out = {"n_pairs": sum(r["n_pairs"] for r in self.relations), "per_relation": per, "pooled": pooled}
        at = [r for r in self.records if r["layer"] == self.fixed_layer]
        if at:
            out["fixed"] = {"layer": self.fixed_layer, "n": len(at), **row(at),
                            "control_same_length": float(np.mean([r.get("control_same_length", True) for r in at])),
                            "vs_control": stats.paired_difference([r["success"] for r in at],
                                                                  [r["control"] for r in at], seed=seed)}
        return out

    def accuracy(self, relation: str | None = None) -> dict[int, float]:
        """Transfer success rate per layer (of one relation, or pooled)."""
        out = {}
        for layer in self.layers:
            v = [r["success"] for r in self.records if r["layer"] == layer and relation in (None, r["relation"])]
            if v:
                out[layer] = float(np.mean(v))
        return out

    def to_dict(self) -> dict:
        return {"layers": list(self.layers), "fixed_layer": self.fixed_layer, "relations": self.relations,
                "records": self.records}


def state_transfer(model, source, *, layers=None, max_facts: int | None = None, seed: int = 0,
                   progress: bool = False, batch_size: int = 64) -> TransferResult:
    """Subject-state transfer (module docstring) on every relation of ``source`` at every layer of ``layers``.

    ``model``: a FactModel with ``source`` its FactWorld, or any hooked model with :class:`TransferFacts`
    (pretrained-model relations, files or folders: :func:`mechfact.state_transfer` prepares them). ``layers``: ``-1`` (the token embedding) ..
    ``n_layers - 1`` (default all). ``max_facts``: source facts per relation (default all known).
    ValueError when a layer is out of range or no relation has a usable pair of known facts.
    """
    L = _n_layers(model)
    layers = _check_layers(L, layers)
    if max_facts is not None and (isinstance(max_facts, bool) or not isinstance(max_facts, int) or max_facts < 1):
        raise ValueError(f"max_facts {max_facts!r}: must be a positive integer or None (all known facts)")
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size}: must be >= 1")
    if _is_world(source):
        source = world_facts(model, source)
    if not isinstance(source, TransferFacts):
        raise ValueError(f"source of type {type(source).__name__}: expected a FactWorld or TransferFacts "
                         "(relations of a pretrained model: mechfact.state_transfer)")
    rels, pad_id = source.relations, source.pad_id
    n_facts, n_known = sum(r.n_facts for r in rels), sum(len(r.known) for r in rels)
    if n_known == 0:
        raise ValueError(f"no known facts: the model answers none of the {n_facts} facts of "
                         f"{', '.join(r.name for r in rels)}; state transfer needs facts the model knows")
    pairs = {r.name: _pairs(r, max_facts, seed) for r in rels}
    info = [{"name": r.name, "n_facts": r.n_facts, "n_known": len(r.known), "n_pairs": len(pairs[r.name])}
            for r in rels]
    if not any(pairs.values()):
        per = ", ".join(f"{i['name']} {i['n_known']} known" for i in info)
        raise ValueError(f"no usable pairs: {n_known} known facts of {n_facts}, but no relation has three known facts "
                         f"of distinct subjects with a source and a target whose answers differ ({per})")
    for i in info:
        if not i["n_pairs"]:
            logger.warning("%s: %d known facts, no usable pair; left out", i["name"], i["n_known"])
    rows = [(r, s, t, c) for r in rels for s, t, c in pairs[r.name]]
    donors = sorted({(r.name, x.subject) for r, s, _, c in rows for x in (s, c)})
    slot = {d: i for i, d in enumerate(donors)}
    nps = ProbeSet.from_prompts([_Neutral(toks, last, last) for toks, last in (_neutral(source, *d) for d in donors)],
                                pad_id=pad_id)
    acts = collect(model, nps, [Site(_site(l), "subject") for l in layers], batch_size=batch_size)
    tokens = [t.tokens for _, _, t, _ in rows] * 2
    pos = [t.subject_pos for _, _, t, _ in rows] * 2
    src = torch.tensor([slot[r.name, s.subject] for r, s, _, _ in rows] + [slot[r.name, c.subject]
                                                                            for r, _, _, c in rows])
    records = []
    for layer in tqdm(layers, desc="state transfer", disable=not progress):
        states = acts[Site(_site(layer), "subject")][src]
        top = _patched_top1(model, tokens, pos, states, layer, pad_id, batch_size).tolist()
        n = len(rows)
        for k, (r, s, t, c) in enumerate(rows):
            a, b = top[k], top[n + k]
            records.append({"relation": r.name, "layer": layer, "fact": s.index, "subject": s.subject,
                            "target_fact": t.index, "target_subject": t.subject, "control_fact": c.index,
                            "control_subject": c.subject, "success": bool(r.matches(a, s.objects)),
                            "kept": bool(r.matches(a, t.objects)), "control": bool(r.matches(b, s.objects)),
                            "control_moved": bool(r.matches(b, c.objects)),
                            "control_kept": bool(r.matches(b, t.objects)), "top1": int(a), "control_top1": int(b),
                            "control_same_length": c.subject_len == s.subject_len})
    return TransferResult(tuple(layers), info, records, L // 2)


__all__ = ["TransferFact", "TransferRelation", "TransferFacts", "TransferResult", "state_transfer", "world_facts"]
