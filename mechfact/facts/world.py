"""A seeded fact world: N entities, R relations, each relation a bijection (or a map into a shared pool).

Relation r is a random permutation ``pi_r`` of the entities (drawn from
``generator(seed, "facts.world.perm", r)``), so entities double as subjects and
attributes and facts compose ("the mother of the wife of x").

With ``attributes=A < N`` every relation instead maps the N subjects into a
SHARED POOL of attributes, the entities ``0 .. A-1``: ``pi_r = randperm(N) mod A``
(same generator stream), so each attribute is the value of about N / A
subjects per relation and co-occurs with many different attributes of other
relations. In a bijection world a subject's R attributes determine each other
(``pi_r' o pi_r^{-1}``), a regularity a trained model can exploit; a pool world
has none (docs/results_probes.md).

Token layout (one shared input vocabulary of ``N + R + 1`` tokens)::

    0 .. N-1        entity tokens            (entity e is token e)
    N .. N+R-1      relation tokens          (relation r is token N + r)
    N+R             PAD                      (right padding when batches mix lengths)

The model's OUTPUT vocabulary is the N entities only: targets are entity ids.

Queries are token sequences plus a same-shape ``targets`` tensor holding the
entity to predict at each position, or ``IGNORE`` (-100, the cross-entropy
ignore index) at unsupervised positions. Logits at position t predict
``targets[:, t]`` (next-token convention: the answer comes after the last input).

* ``single``  -- tokens ``[s, r]``; supervised: position 1 -> ``pi_r(s)``.
* ``direct``  -- k hops answered at once: tokens ``[s, r1, ..., rk]``
  (length k+1); supervised: position k only -> ``e_k``.
* ``cot``     -- k hops with chain of thought, grouped layout: tokens
  ``[s, r1, ..., rk, e1, ..., e_{k-1}]`` (length 2k) where
  ``e_i = pi_{r_i}(e_{i-1})``, ``e_0 = s``. Supervised: position k (the last
  relation token) -> ``e1``, and position k+i (token ``e_i``) -> ``e_{i+1}`` for
  i = 1..k-1; i.e. positions k..2k-1 carry targets e1..ek and positions 0..k-1
  are IGNORE. With k = 1 this is exactly the single-hop query.

Relations in k-hop queries are written in application order: ``r1`` is applied
first. Single-hop queries are ordered subject-major (row ``s * R + r``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from jaxtyping import Int
from torch import Tensor

from ..seeding import generator

IGNORE = -100  # target at unsupervised positions (torch cross-entropy ignore_index)
QUERY_KINDS = ("single", "direct", "cot")
MAX_ENUMERATE = 1_000_000  # k-hop query sets larger than this must be sampled (pass n=...)


def _check_int(name: str, value: Any, minimum: int, what: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r}: must be an integer >= {minimum}{what}")
    return value


class FactWorld:
    """N entities and R relations; ``perms[r, s] = pi_r(s)`` (a bijection, or into ``0..attributes-1``)."""

    def __init__(self, n_entities: int, n_relations: int, seed: int = 0, *, perms: Tensor | None = None,
                 attributes: int | None = None):
        self.n_entities = _check_int("n_entities", n_entities, 2, " (at least 2 subjects)")
        self.n_relations = _check_int("n_relations", n_relations, 1, " (at least 1 relation)")
        self.seed = int(seed)
        A = n_entities if attributes is None else _check_int("attributes", attributes, 2, " (the pool size)")
        if A > n_entities:
            raise ValueError(f"attributes={A}: the pool is entities 0..A-1, so it must be <= n_entities={n_entities}")
        self.n_attributes = A
        if perms is None:
            perms = torch.stack([
                torch.randperm(n_entities, generator=generator(self.seed, "facts.world.perm", r)) % A
                for r in range(n_relations)
            ])
        perms = torch.as_tensor(perms, dtype=torch.long).cpu()
        if perms.shape != (n_relations, n_entities):
            raise ValueError(f"perms has shape {tuple(perms.shape)}: expected (n_relations, n_entities) = "
                             f"({n_relations}, {n_entities})")
        ref = torch.arange(n_entities)
        for r in range(n_relations):
            if self.is_bijective and not torch.equal(perms[r].sort().values, ref):
                raise ValueError(f"perms[{r}] is not a permutation of 0..{n_entities - 1}")
            if not self.is_bijective and (perms[r].min() < 0 or perms[r].max() >= A):
                raise ValueError(f"perms[{r}] has values outside the attribute pool 0..{A - 1}")
        self.perms: Int[Tensor, "R N"] = perms

    @property
    def is_bijective(self) -> bool:
        """Every relation a permutation of the entities (no shared attribute pool)."""
        return self.n_attributes == self.n_entities

    # ---- vocabulary --------------------------------------------------------------
    @property
    def n_special(self) -> int:
        return 1

    @property
    def pad_token(self) -> int:
        return self.n_entities + self.n_relations

    @property
    def vocab_size(self) -> int:
        """Input vocabulary: entities, relations, PAD."""
        return self.n_entities + self.n_relations + self.n_special

    def relation_token(self, r: int | Tensor) -> int | Tensor:
        return self.n_entities + r

    @property
    def n_facts(self) -> int:
        return self.n_entities * self.n_relations

    def __repr__(self) -> str:
        pool = "" if self.is_bijective else f", attributes={self.n_attributes}"
        return f"FactWorld(n_entities={self.n_entities}, n_relations={self.n_relations}, seed={self.seed}{pool})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, FactWorld) and self.n_entities == other.n_entities
                and self.n_relations == other.n_relations and self.seed == other.seed
                and self.n_attributes == other.n_attributes and torch.equal(self.perms, other.perms))

    # ---- composition -------------------------------------------------------------
    def apply(self, subjects: Int[Tensor, "n"], relations: Int[Tensor, "n k"]) -> Int[Tensor, "n k"]:
        """Intermediate entities e_1..e_k of each chain (e_i = pi_{r_i}(e_{i-1}), e_0 = s)."""
        e = subjects
        out = []
        for i in range(relations.shape[1]):
            e = self.perms[relations[:, i], e]
            out.append(e)
        return torch.stack(out, 1) if out else subjects.new_zeros(len(subjects), 0)

    def _check_subjects(self, subjects: Sequence[int] | Tensor | None) -> Int[Tensor, "n"]:
        if subjects is None:
            return torch.arange(self.n_entities)
        subjects = torch.as_tensor(subjects, dtype=torch.long).reshape(-1)
        if len(subjects) and (subjects.min() < 0 or subjects.max() >= self.n_entities):
            bad = subjects[(subjects < 0) | (subjects >= self.n_entities)][0].item()
            raise ValueError(f"subject {bad}: subjects must lie in 0..{self.n_entities - 1}")
        return subjects

    # ---- queries -----------------------------------------------------------------
    def single_hop(self, subjects: Sequence[int] | Tensor | None = None) -> "Queries":
        """All N*R (or len(subjects)*R) single-hop facts, subject-major."""
        subj = self._check_subjects(subjects)
        s = subj.repeat_interleave(self.n_relations)
        r = torch.arange(self.n_relations).repeat(len(subj))
        return self._build("single", s, r[:, None])

    def k_hop(self, hops: int, *, cot: bool = False, n: int | None = None,
              subjects: Sequence[int] | Tensor | None = None, seed: int | None = None) -> "Queries":
        """k-hop queries, answered directly or with chain of thought (``cot``).

        ``n=None`` enumerates all ``len(subjects) * R**k`` chains (subject-major,
        then relations in lexicographic order); otherwise ``n`` chains are drawn
        uniformly WITH replacement (subject and each relation independent) from
        ``generator(seed, "facts.world.khop", hops, cot)``, seed defaulting to the
        world's seed.
        """
        _check_int("hops", hops, 1, " (at least 1 hop)")
        subj = self._check_subjects(subjects)
        if len(subj) == 0:
            raise ValueError("subjects is empty: need at least one subject")
        R = self.n_relations
        if n is None:
            total = len(subj) * R**hops
            if total > MAX_ENUMERATE:
                raise ValueError(f"hops={hops}: {total} chains exceed {MAX_ENUMERATE}; pass n=... to sample")
            rel = torch.cartesian_prod(*[torch.arange(R)] * hops).reshape(-1, hops) if hops > 1 \
                else torch.arange(R)[:, None]
            s = subj.repeat_interleave(len(rel))
            rel = rel.repeat(len(subj), 1)
        else:
            _check_int("n", n, 1)
            g = generator(self.seed if seed is None else seed, "facts.world.khop", hops, int(cot))
            s = subj[torch.randint(len(subj), (n,), generator=g)]
            rel = torch.randint(R, (n, hops), generator=g)
        return self._build("cot" if cot else "direct", s, rel)

    def _build(self, kind: str, s: Tensor, rel: Tensor) -> "Queries":
        chain = self.apply(s, rel)  # (n, k)
        n, k = rel.shape
        rel_tok = rel + self.n_entities
        if kind in ("single", "direct"):
            tokens = torch.cat([s[:, None], rel_tok], 1)
            targets = torch.full_like(tokens, IGNORE)
            targets[:, k] = chain[:, -1]
        else:
            tokens = torch.cat([s[:, None], rel_tok, chain[:, :-1]], 1)
            targets = torch.full_like(tokens, IGNORE)
            targets[:, k:] = chain
        return Queries(kind, self.n_entities, self.n_relations, tokens, targets, s.clone(), rel.clone(),
                       chain[:, -1].clone())

    # ---- splits ------------------------------------------------------------------
    def split_subjects(self, heldout_fraction: float = 0.2, seed: int | None = None
                       ) -> tuple[Int[Tensor, "n_train"], Int[Tensor, "n_heldout"]]:
        """Random disjoint (train, held-out) subject ids, each sorted: the probes' split
        (:func:`mechfact.probes.folds.split_indices`; held-out size ``round(fraction * N)``, clipped to 1..N-1)
        seeded by ``seed`` (default: the world's seed)."""
        from ..probes.folds import split_indices

        tr, te = split_indices(self.n_entities, heldout_fraction, self.seed if seed is None else seed,
                               "facts.world.split")
        return torch.from_numpy(tr), torch.from_numpy(te)

    # ---- serialisation -----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"n_entities": self.n_entities, "n_relations": self.n_relations, "seed": self.seed,
                "n_attributes": self.n_attributes, "perms": self.perms.tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FactWorld":
        if not isinstance(d, dict):
            raise ValueError(f"fact world: expected an object, got a {type(d).__name__}")
        missing = {"n_entities", "n_relations", "seed", "perms"} - set(d)
        if missing:
            raise ValueError(f"fact world dict is missing {sorted(missing)}")
        if isinstance(d["seed"], bool) or not hasattr(d["seed"], "__index__"):
            raise ValueError(f"seed={d['seed']!r}: must be an integer")
        return cls(d["n_entities"], d["n_relations"], d["seed"], perms=_int_table("perms", d["perms"]),
                   attributes=d.get("n_attributes"))  # absent in files written before attribute pools

    def save_json(self, path: str | os.PathLike) -> None:
        from ..runs import write_json_atomic

        write_json_atomic(path, self.to_dict())

    @classmethod
    def load_json(cls, path: str | os.PathLike) -> "FactWorld":
        """The world saved by :meth:`save_json`; a damaged file is one ``CorruptFile`` (ValueError) naming it."""
        return _load_json(cls, path, "fact world")


@dataclass
class Queries:
    """A set of same-length queries (see the module docstring for the layout)."""

    kind: str  # single | direct | cot
    n_entities: int
    n_relations: int
    tokens: Int[Tensor, "n pos"]
    targets: Int[Tensor, "n pos"]  # entity id, or IGNORE where unsupervised
    subjects: Int[Tensor, "n"]
    relations: Int[Tensor, "n k"]  # relation ids (not tokens), application order
    answers: Int[Tensor, "n"]  # final entity of the chain

    def __post_init__(self) -> None:
        if self.kind not in QUERY_KINDS:
            raise ValueError(f"kind={self.kind!r}: allowed values are {', '.join(QUERY_KINDS)}")
        if self.tokens.shape != self.targets.shape:
            raise ValueError(f"tokens {tuple(self.tokens.shape)} and targets {tuple(self.targets.shape)} differ")

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def hops(self) -> int:
        return self.relations.shape[1]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Queries):
            return NotImplemented
        return (self.kind == other.kind and self.n_entities == other.n_entities
                and self.n_relations == other.n_relations
                and all(torch.equal(getattr(self, f), getattr(other, f)) for f in _TENSOR_FIELDS))

    def subset(self, index: Tensor) -> "Queries":
        return Queries(self.kind, self.n_entities, self.n_relations,
                       *(getattr(self, f)[index] for f in _TENSOR_FIELDS))

    # ---- datasets / JSON -----------------------------------------------------------
    def _rows(self) -> dict[str, list]:
        return {f: getattr(self, f).tolist() for f in _TENSOR_FIELDS}

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "n_entities": self.n_entities, "n_relations": self.n_relations,
                **self._rows()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Queries":
        missing = {"kind", "n_entities", "n_relations", *_TENSOR_FIELDS} - set(d)
        if missing:
            raise ValueError(f"queries dict is missing {sorted(missing)}")
        n = len(d["subjects"])
        k = len(d["relations"][0]) if n else (1 if d["kind"] == "single" else 0)
        tensors = {f: _int_table(f, d[f]) for f in _TENSOR_FIELDS}
        if n == 0:  # keep 2-D shapes for empty sets
            tensors["relations"] = tensors["relations"].reshape(0, k)
            pos = k + 1 if d["kind"] != "cot" else 2 * k
            tensors["tokens"] = tensors["tokens"].reshape(0, pos)
            tensors["targets"] = tensors["targets"].reshape(0, pos)
        return cls(d["kind"], int(d["n_entities"]), int(d["n_relations"]), **tensors)

    def save_json(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps(self.to_dict()))

    @classmethod
    def load_json(cls, path: str | os.PathLike) -> "Queries":
        """The queries saved by :meth:`save_json`; a damaged file is one ``CorruptFile`` (ValueError) naming it."""
        return _load_json(cls, path, "query set")

    def to_dataset(self):
        """A ``datasets.Dataset``: one row per query; kind and sizes in ``info.description``."""
        import datasets

        ds = datasets.Dataset.from_dict(self._rows())
        ds.info.description = json.dumps({"kind": self.kind, "n_entities": self.n_entities,
                                          "n_relations": self.n_relations})
        return ds

    @classmethod
    def from_dataset(cls, ds, *, kind: str | None = None, n_entities: int | None = None,
                     n_relations: int | None = None) -> "Queries":
        """Inverse of :meth:`to_dataset`; metadata from ``info.description`` unless given."""
        try:
            meta = json.loads(ds.info.description or "{}")
        except json.JSONDecodeError:
            meta = {}
        meta = {k: v for k, v in meta.items() if k in ("kind", "n_entities", "n_relations")}
        for key, val in (("kind", kind), ("n_entities", n_entities), ("n_relations", n_relations)):
            if val is not None:
                meta[key] = val
        cols = ds.to_dict()
        return cls.from_dict({**meta, **{f: cols[f] for f in _TENSOR_FIELDS if f in cols}})


_TENSOR_FIELDS = ("tokens", "targets", "subjects", "relations", "answers")

FILE_FIX = "rerun the command that wrote it (same --out) to rewrite it"


def _int_table(name: str, value: Any) -> Tensor:
    """An integer tensor from nested lists; ValueError naming ``name`` when they are ragged or not integers."""
    try:
        t = torch.tensor(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{name} is not a table of integers ({' '.join(str(exc).split())[:80]})") from None
    if t.numel() and (t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex()):
        raise ValueError(f"{name} holds {t.dtype} values, expected integers")
    return t.long()


def _load_json(cls, path: str | os.PathLike, what: str):
    """``cls.from_dict`` of a JSON file; every problem one CorruptFile: ``<path>: <what is wrong>; <what to do>``."""
    from ..runs import CorruptFile

    path = Path(path)
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        wrong = "empty" if path.stat().st_size == 0 else f"not valid JSON ({' '.join(str(exc).split())[:100]})"
        raise CorruptFile(f"{path}: {wrong}; {FILE_FIX}") from None
    try:
        return cls.from_dict(data)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise CorruptFile(f"{path}: not a valid {what} ({' '.join(str(exc).split())[:200]}); {FILE_FIX}") from None
