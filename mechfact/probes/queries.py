"""What every probe consumes: a hooked model plus a :class:`ProbeSet` of (subject, relation, object) queries.

A ``ProbeSet`` is model-agnostic: right-padded token ids with each query's
length, the positions that matter (the subject's last and first token, the
relation token where there is one, the answer position whose logits predict the
object) and integer ids. Two builders, one per source of queries:

* :meth:`ProbeSet.from_world` -- the single-hop queries ``[s, r]`` of a
  :class:`~mechfact.facts.world.FactWorld` (subject at position 0, relation and
  answer at position 1);
* :meth:`ProbeSet.from_prompts` -- tokenised relation prompts of a pretrained
  model (:mod:`mechfact.llm.prompts`; :func:`mechfact.llm.prompts.probe_set`
  builds them from :class:`~mechfact.llm.relations.Relation` objects).

Positions, ONE vocabulary for sites, interventions and the LLM commands
(:data:`POSITIONS`): ``subject`` (the subject's last token; ``subject_last`` is
accepted as its other name), ``subject_first``, ``relation``, ``last`` (the
answer position, the prompt's last token) and, for interventions only, ``all``.

A :class:`Site` names what a probe reads: a hook point (:mod:`mechfact.hooks`)
plus a position, e.g. ``Site(hooks.resid(0, "mid"), "last")``.
:func:`collect` is the one activation collector: length-sorted batches, right or
left padding, a cache restricted to the requested hooks, one row per query and
site, the greedy next token, and an optional disk cache keyed by the model's
identity.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Sequence

import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

POSITIONS = ("subject", "subject_first", "relation", "last", "all")
ALIASES = {"subject_last": "subject"}
SITE_POSITIONS = POSITIONS[:-1]  # a site reads ONE position per query
PADDING = ("right", "left")


def check_position(position: str, allowed: Sequence[str] = POSITIONS) -> str:
    """The canonical name of ``position`` (``subject_last`` -> ``subject``); ValueError naming the allowed ones."""
    p = ALIASES.get(position, position)
    if p not in allowed:
        raise ValueError(f"position {position!r}: allowed values are {', '.join(allowed)} (subject_last = subject)")
    return p


@dataclass
class ProbeSet:
    """n queries; all tensors (n,) except ``tokens`` (n, pos), right-padded with ``pad_id``."""

    tokens: Int[Tensor, "n pos"]
    subjects: Int[Tensor, "n"]  # subject ids (e.g. entity ids)
    relations: Int[Tensor, "n"]  # relation ids 0..R-1
    objects: Int[Tensor, "n"]  # object ids (rows of an object-vector table)
    object_tokens: Int[Tensor, "n"]  # output-vocabulary index of the object (accuracy = argmax == this)
    subject_pos: Int[Tensor, "n"]  # position of the subject's (last) token
    answer_pos: Int[Tensor, "n"]  # position whose logits predict the object (the last real token)
    relation_pos: Int[Tensor, "n"] | None = None  # position of the relation token, where one exists
    relation_token_ids: Int[Tensor, "R"] | None = None  # token of each relation (for relation swaps)
    subject_first_pos: Int[Tensor, "n"] | None = None  # first token of a multi-token subject (default: subject_pos)
    pad_id: int = 0  # token of the right padding
    relation_names: tuple[str, ...] | None = None  # name of each relation id, where known

    def __post_init__(self) -> None:
        n = self.tokens.shape[0]
        if self.tokens.ndim != 2:
            raise ValueError(f"tokens has shape {tuple(self.tokens.shape)}: expected (n, pos)")
        for name in ("subjects", "relations", "objects", "object_tokens", "subject_pos", "answer_pos"):
            v = getattr(self, name)
            if v.shape != (n,):
                raise ValueError(f"{name} has shape {tuple(v.shape)}: expected ({n},), one per query")
        if n and (int(self.answer_pos.min()) < 0 or int(self.answer_pos.max()) >= self.tokens.shape[1]):
            raise ValueError(f"answer_pos spans {int(self.answer_pos.min())}..{int(self.answer_pos.max())}: "
                             f"outside the {self.tokens.shape[1]} token positions")

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def lengths(self) -> Int[Tensor, "n"]:
        """Real (unpadded) length of each query: the answer position is its last token."""
        return self.answer_pos + 1

    @property
    def relation_ids(self) -> list[int]:
        return sorted(int(r) for r in self.relations.unique())

    def positions(self, where: str) -> Tensor | None:
        """(n,) positions of ``where`` (None for ``all``)."""
        where = check_position(where)
        if where == "all":
            return None
        if where == "relation":
            if self.relation_pos is None:
                raise ValueError("position 'relation' needs queries with a relation token (relation_pos); "
                                 "prompts of pretrained models have none")
            return self.relation_pos
        if where == "subject_first":
            return self.subject_pos if self.subject_first_pos is None else self.subject_first_pos
        return self.subject_pos if where == "subject" else self.answer_pos

    def subset(self, index) -> "ProbeSet":
        index = torch.as_tensor(index, dtype=torch.long)
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        return ProbeSet(self.tokens[index], self.subjects[index], self.relations[index], self.objects[index],
                        self.object_tokens[index], self.subject_pos[index], self.answer_pos[index],
                        pick(self.relation_pos), self.relation_token_ids, pick(self.subject_first_pos), self.pad_id,
                        self.relation_names)

    def for_relation(self, r: int) -> "ProbeSet":
        check_relation(self, r)
        return self.subset(torch.nonzero(self.relations == r).reshape(-1))

    # ---- builders ---------------------------------------------------------------------
    @classmethod
    def from_world(cls, world, subjects=None) -> "ProbeSet":
        """Single-hop queries ``[s, r]`` of a FactWorld (all subjects by default)."""
        q = world.single_hop(subjects)
        n = len(q)
        return cls(tokens=q.tokens, subjects=q.subjects, relations=q.relations[:, 0], objects=q.answers,
                   object_tokens=q.answers, subject_pos=torch.zeros(n, dtype=torch.long),
                   answer_pos=torch.ones(n, dtype=torch.long), relation_pos=torch.ones(n, dtype=torch.long),
                   relation_token_ids=torch.arange(world.n_relations) + world.n_entities, pad_id=world.pad_token)

    @classmethod
    def from_prompts(cls, prompts: Sequence, *, pad_id: int, relations: Sequence[int] | None = None,
                     objects: Sequence[int] | None = None, object_tokens: Sequence[int] | None = None,
                     subjects: Sequence[int] | None = None, relation_names: Sequence[str] | None = None
                     ) -> "ProbeSet":
        """Tokenised prompts (objects with ``tokens``, ``subject_first``, ``subject_last``), right-padded.

        Left out, ``relations`` are all 0 (one relation), ``objects`` and ``subjects`` the prompt indices and
        ``object_tokens`` 0: enough for collecting states or patching, where no answer is scored.
        """
        if not prompts:
            raise ValueError("no prompts: a probe set needs at least one query")
        n = len(prompts)
        toks = pad_batch([p.tokens for p in prompts], int(pad_id), "right")[0]
        as_t = lambda v: torch.as_tensor(list(v), dtype=torch.long)  # noqa: E731
        return cls(tokens=toks, subjects=as_t(range(n) if subjects is None else subjects),
                   relations=as_t([0] * n if relations is None else relations),
                   objects=as_t(range(n) if objects is None else objects),
                   object_tokens=as_t([0] * n if object_tokens is None else object_tokens),
                   subject_pos=as_t(p.subject_last for p in prompts),
                   answer_pos=as_t(len(p.tokens) - 1 for p in prompts),
                   subject_first_pos=as_t(p.subject_first for p in prompts), pad_id=int(pad_id),
                   relation_names=None if relation_names is None else tuple(relation_names))


def check_relation(ps: ProbeSet, r: int) -> None:
    if int(r) not in ps.relation_ids:
        raise ValueError(f"relation {r} is not in the queries; relations present: {ps.relation_ids}")


def as_probe_set(queries) -> ProbeSet:
    """A ProbeSet from a ProbeSet or a FactWorld (its single-hop queries)."""
    if isinstance(queries, ProbeSet):
        return queries
    if hasattr(queries, "single_hop") and hasattr(queries, "perms"):
        return ProbeSet.from_world(queries)
    raise ValueError(f"queries of type {type(queries).__name__}: expected a ProbeSet or a FactWorld "
                     "(for pretrained models: mechfact.llm.prompts.probe_set(lm, relations))")


@dataclass(frozen=True)
class Site:
    """A hook point and the position read there (see :data:`POSITIONS`)."""

    hook: str
    position: str = "last"

    def __post_init__(self) -> None:
        object.__setattr__(self, "position", check_position(self.position, SITE_POSITIONS))

    def __str__(self) -> str:
        return f"{self.hook}@{self.position}"

    @classmethod
    def parse(cls, text: "str | Site") -> "Site":
        """``"hook@position"`` (position defaults to ``last``) or a Site."""
        if isinstance(text, Site):
            return text
        hook, _, pos = str(text).partition("@")
        return cls(hook, pos or "last")


def check_hooks(model, names) -> None:
    """ValueError naming the missing hook points and the ones the model has."""
    have = set(getattr(model, "hook_dict", {}) or {})
    if not have:
        raise ValueError(f"{type(model).__name__} has no transformer-lens hook points (hook_dict); "
                         "probes need a HookedRootModule / TransformerBridge model")
    missing = [n for n in names if n not in have]
    if missing:
        import difflib

        m = missing[0]
        near = sorted(n for n in have if n.rsplit(".", 1)[0] == m.rsplit(".", 1)[0])
        near = near or difflib.get_close_matches(m, sorted(have), n=12, cutoff=0.5)
        shown = ", ".join(near or sorted(have)[:30])
        raise ValueError(f"unknown hook site(s) {missing}; the model has {len(have)} hook points, "
                         f"{'near it' if near else 'e.g.'}: {shown}")


def model_device(model) -> torch.device:
    dev = getattr(model, "device", None)
    if isinstance(dev, torch.device):
        return dev
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def logits_of(out) -> Tensor:
    return out.logits if hasattr(out, "logits") else out


def keeps_logits(model) -> bool:
    """Whether ``model`` (a bridge, or a LanguageModel holding one) runs a HuggingFace model whose forward takes
    ``logits_to_keep``: then only the positions read are unembedded. The unembedding at every position is most
    of a small model's forward (Gemma-3-270M: 168M of its 268M weights; Qwen2.5-Coder-0.5B-Instruct: 136M of 494M)."""
    import inspect

    hf = getattr(getattr(model, "bridge", model), "original_model", None)
    try:
        return hf is not None and "logits_to_keep" in inspect.signature(hf.forward).parameters
    except (TypeError, ValueError):
        return False


# ---- the activation collector -------------------------------------------------------------

@dataclass
class Activations:
    """What :func:`collect` returns: one (n, features) float32 CPU tensor per site, plus the greedy next token."""

    sites: dict[Site, Tensor]
    next_token: Tensor  # (n,) argmax of the logits at each query's answer position

    def __getitem__(self, site: "Site | str") -> Tensor:
        return self.sites[Site.parse(site)]


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
        toks[b, o:o + len(s)] = torch.as_tensor(list(s), dtype=torch.long)
        mask[b, o:o + len(s)] = 1
        offsets.append(o)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return toks, mask, pos, torch.tensor(offsets)


def _cache_file(model, ps: ProbeSet, sites: list[Site]):
    from ..runs import cache_dir

    h = hashlib.sha256()
    h.update(json.dumps({"model": model.model_id, "sites": [str(s) for s in sites], "v": 2}).encode())
    lengths = ps.lengths.tolist()
    h.update(json.dumps([ps.tokens[i, :n].tolist() for i, n in enumerate(lengths)]).encode())
    for s in sites:
        h.update(json.dumps(ps.positions(s.position).tolist()).encode())
    return cache_dir() / "states" / f"{h.hexdigest()[:24]}.pt"


@torch.no_grad()
def collect(model, queries, sites: Sequence["Site | str"], *, batch_size: int = 4096, padding: str = "right",
            cache: bool = False, progress: bool = False, desc: str = "activations") -> Activations:
    """Activations at every site, read at the site's position of each query, plus the greedy next token.

    ``model``: a FactModel, a TransformerBridge or a :class:`~mechfact.llm.models.loading.LanguageModel`.
    ``queries``: a :class:`ProbeSet` or a FactWorld. Queries run in length-sorted batches, each padded to
    its own longest query (``right``: causal attention never looks at the padding; ``left``: an attention
    mask and position ids are passed, for models that take them); both give the unbatched states (tested).
    ``cache=True`` keeps the result on disk under ``$MECHFACT_CACHE/states`` keyed by the model's
    ``model_id``, the exact tokens, the sites and the positions (models without a ``model_id`` are never
    cached).
    """
    ps = as_probe_set(queries)
    sites = [Site.parse(s) for s in sites]
    if padding not in PADDING:
        raise ValueError(f"--padding {padding}: allowed values are {', '.join(PADDING)}")
    if batch_size < 1:
        raise ValueError(f"--batch-size {batch_size}: must be >= 1")
    check_hooks(model, [s.hook for s in sites])
    pos = {s: ps.positions(s.position) for s in sites}
    path = None
    if cache and getattr(model, "model_id", None):
        path = _cache_file(model, ps, sites)
        if path.is_file():
            hit = _read_cache(path, sites, len(ps))
            if hit is not None:
                return hit
    names = sorted({s.hook for s in sites})
    want = set(names)
    dev = model_device(model)
    keep = keeps_logits(model) and not any(s.hook.startswith("unembed") for s in sites)  # a site may read logits
    n = len(ps)
    lengths = ps.lengths.tolist()
    out: dict[Site, Tensor | None] = {s: None for s in sites}
    nxt = torch.empty(n, dtype=torch.long)
    order = sorted(range(n), key=lambda i: lengths[i])  # similar lengths together: little padding
    batches = [order[i:i + batch_size] for i in range(0, n, batch_size)]
    for idx in tqdm(batches, desc=desc, leave=False, disable=not progress):
        seqs = [ps.tokens[i, :lengths[i]].tolist() for i in idx]
        toks, mask, posids, offsets = pad_batch(seqs, ps.pad_id, padding)
        kw = {}
        if padding == "left" and int(offsets.max()) > 0:
            kw = dict(attention_mask=mask.to(dev), position_ids=posids.to(dev))
        rows = torch.arange(len(idx))
        it = torch.as_tensor(idx)
        last = ps.answer_pos[it] + offsets
        if keep:  # the logits at each query's answer position alone: (batch, 1, vocab)
            kw["logits_to_keep"] = last[:, None].to(dev)
        logits, acts = model.run_with_cache(toks.to(dev), names_filter=lambda name: name in want, **kw)
        logits = logits_of(logits)
        if keep:
            last = torch.zeros_like(last)
        for s in sites:
            act = acts[s.hook]
            if act.ndim != 3:
                raise ValueError(f"hook {s.hook} has shape {tuple(act.shape)}: sites need (batch, pos, features)")
            if out[s] is None:
                out[s] = torch.empty((n, act.shape[-1]), dtype=torch.float32)
            p = (pos[s][it] + offsets).to(act.device)
            out[s][it] = act[rows.to(act.device), p].float().cpu()
        nxt[it] = logits[rows.to(logits.device), last.to(logits.device)].argmax(-1).cpu()
    res = Activations({s: v for s, v in out.items()}, nxt)
    if path is not None:
        _write_cache(path, [res.sites[s] for s in sites], nxt)
    return res


def _read_cache(path, sites: list[Site], n: int) -> Activations | None:
    """A state-cache entry, checked (one (n, features) float32 tensor per site, (n,) next tokens); a damaged
    one is deleted, with a warning naming it, and recomputed by the caller (None)."""
    try:
        d = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(d, dict) or not isinstance(d.get("states"), (list, tuple)):
            raise ValueError("not a state-cache entry")
        states, nxt = list(d["states"]), d.get("next_token")
        if len(states) != len(sites):
            raise ValueError(f"{len(states)} sites stored, {len(sites)} expected")
        for s, t in zip(sites, states):
            if not (isinstance(t, Tensor) and t.ndim == 2 and t.shape[0] == n and t.dtype == torch.float32):
                what = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"site {s}: {what}, expected ({n}, features) float32")
        if not (isinstance(nxt, Tensor) and tuple(nxt.shape) == (n,) and nxt.dtype == torch.long):
            raise ValueError(f"next_token is not ({n},) integers")
    except Exception as exc:  # noqa: BLE001 - truncated zip, pickle errors, wrong content: recompute it
        if isinstance(exc, MemoryError):
            raise
        from ..runs import cache_dir

        logger.warning("hidden-state cache entry %s is damaged (%s); deleting and recomputing it (the cache "
                       "is %s: delete it to clear it)", path, " ".join(str(exc).split())[:160] or type(exc).__name__,
                       cache_dir() / "states")
        try:
            path.unlink(missing_ok=True)
        except OSError as err:
            logger.warning("could not delete %s (%s)", path, err.strerror or err)
        return None
    logger.debug("state cache hit %s", path)
    return Activations(dict(zip(sites, states)), nxt)


def _write_cache(path, states: list[Tensor], nxt: Tensor) -> None:
    """Write a state-cache entry atomically; a cache that cannot be written is a warning, not a failure."""
    from ..runs import atomic_path

    try:
        with atomic_path(path) as tmp:
            torch.save({"states": states, "next_token": nxt}, tmp)
    except OSError as exc:
        logger.warning("hidden-state cache %s not written (%s); continuing without it (set MECHFACT_CACHE to a "
                       "writable folder)", path, exc.strerror or exc)


@torch.no_grad()
def predictions(model, ps: ProbeSet, fwd_hooks=(), batch_size: int = 4096) -> Tensor:
    """Argmax token at each query's answer position (optionally under forward hooks). A hook with a
    ``for_rows(rows)`` method holds one entry per query (e.g. :func:`~mechfact.probes.swap.embedding_hook`): each
    batch runs ``for_rows`` of its rows; any other hook acts the same on every query."""
    dev = model_device(model)
    preds = []
    # without hooks, a model that unembeds a residual state (final_logits) runs to its last block only and unembeds
    # the answer positions alone (with a large vocabulary the unembedding of every position costs as much as the
    # blocks); with hooks the whole forward runs, so a hook after the last block still acts
    last = _last_resid(model) if not fwd_hooks else None
    for i in range(0, len(ps), batch_size):
        tok = ps.tokens[i: i + batch_size].to(dev)
        rows = slice(i, i + batch_size)
        pos = ps.answer_pos[i: i + batch_size]
        if last is not None:
            preds.append(_answer_logits(model, tok, pos, last).argmax(-1).cpu())
            continue
        batch_hooks = [(name, fn.for_rows(rows) if hasattr(fn, "for_rows") else fn) for name, fn in fwd_hooks]
        logits = logits_of(model.run_with_hooks(tok, fwd_hooks=batch_hooks) if fwd_hooks else model(tok))
        rows = torch.arange(tok.shape[0], device=logits.device)
        preds.append(logits[rows, pos.to(logits.device)].argmax(-1).cpu())
    return torch.cat(preds) if preds else torch.zeros(0, dtype=torch.long)


class StopForward(Exception):
    """Raised by a hook to end a forward pass once what it needs is captured (the one early stop of the probes:
    callers catch it around ``run_with_hooks``)."""



def _last_resid(model) -> str | None:
    """The hook name of the last block's residual output, for a model with ``n_layers`` and ``final_logits``."""
    from .. import hooks

    n = getattr(model, "n_layers", None)
    if n is None or not hasattr(model, "final_logits") or not hasattr(model, "run_with_hooks"):
        return None
    return hooks.resid(int(n) - 1, "post")


def _answer_logits(model, tok: Tensor, pos: Tensor, last: str) -> Tensor:
    """Logits (rows, vocab) at each row's answer position: the run stops after the last block."""
    box = {}

    def grab(x, hook=None):
        box["x"] = x[torch.arange(x.shape[0], device=x.device), pos.to(x.device)].clone()
        raise StopForward
    try:
        model.run_with_hooks(tok, fwd_hooks=[(last, grab)])
    except StopForward:
        pass
    return model.final_logits(box["x"]).float()


def accuracy(model, ps: ProbeSet, fwd_hooks=(), targets: Tensor | None = None) -> float:
    if len(ps) == 0:
        return float("nan")
    t = ps.object_tokens if targets is None else targets
    return float((predictions(model, ps, fwd_hooks) == t).double().mean())
