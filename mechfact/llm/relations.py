"""Relational facts: :class:`Relation` in memory, and JSON files of them (format in ``mechfact/data/relations/README.md``).

A relation file is ``{"name", "prompt_templates": ["... {} ..."], "samples":
[{"subject", "object"}]}`` plus the optional ``kind`` (``one_to_one``, ``many_to_one``,
``one_to_many``, ``many_to_many``; inferred when absent) and ``description``; other keys are ignored.
A file needs at least :data:`MIN_FACTS` distinct facts (a fact listed twice counts once).
Every problem is a ``ValueError`` that names the file and what is wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

KINDS = ("many_to_one", "one_to_one", "one_to_many", "many_to_many")
MIN_FACTS = 2  # distinct (subject, object) facts a relation FILE must hold


def infer_kind(subjects, objects) -> str:
    """``one_to_one``, ``many_to_one`` (objects repeat), ``one_to_many`` (subjects repeat) or ``many_to_many``."""
    objects_repeat = len(set(objects)) < len(objects)
    subjects_repeat = len(set(subjects)) < len(subjects)
    return {(False, False): "one_to_one", (True, False): "many_to_one", (False, True): "one_to_many",
            (True, True): "many_to_many"}[(objects_repeat, subjects_repeat)]


def _covers(declared: str, inferred: str) -> bool:
    """Whether samples of kind ``inferred`` fit a relation declared ``declared``: a sample of a many-to-many
    relation may happen to repeat only objects (the LRE authors' company_hq), never the other way round."""
    many_subjects = {"one_to_one": False, "many_to_one": True, "one_to_many": False, "many_to_many": True}
    many_objects = {"one_to_one": False, "many_to_one": False, "one_to_many": True, "many_to_many": True}
    return (many_subjects[declared] >= many_subjects[inferred]) and (many_objects[declared] >= many_objects[inferred])


class Relation:
    """A relation: a name, prompt templates with one ``{}`` for the subject, and (subject, object) samples.

    Built in memory, e.g. ``Relation("capital", ["The capital of {} is"], [("France", "Paris"), ...])``
    (samples as pairs or ``{"subject", "object"}`` dicts), or read from JSON with :func:`load_relations`.
    ``kind`` is inferred when not given: ``one_to_one``, ``many_to_one`` (objects repeat), ``one_to_many``
    (a subject has several objects, as in the LRE authors' antonyms) or ``many_to_many``. A fact listed twice
    counts once.
    Every problem is a ``ValueError`` naming the relation (or its file) and what is wrong.
    """

    __slots__ = ("name", "kind", "prompt_templates", "subjects", "objects", "description", "source")

    def __init__(self, name: str, prompt_templates, samples, *, kind: str | None = None, description: str = "",
                 source: str = ""):
        where = f"relation file {source}" if source else f"relation {name!r}"

        def bad(msg: str) -> ValueError:
            return ValueError(f"{where}: {msg}")

        if not isinstance(name, str) or not name.strip():
            raise bad("'name' must be a non-empty string")
        if isinstance(prompt_templates, str):
            prompt_templates = [prompt_templates]
        tpls = list(prompt_templates) if isinstance(prompt_templates, (list, tuple)) else None
        if not tpls or not all(isinstance(t, str) for t in tpls):
            raise bad("'prompt_templates' must be a non-empty list of strings")
        for t in tpls:
            if t.count("{}") != 1:
                raise bad(f"prompt template {t!r} must contain exactly one '{{}}' (the subject)")
            try:
                t.format("x")
            except (IndexError, KeyError, ValueError):
                raise bad(f"prompt template {t!r} is not a format string with one '{{}}'") from None
        if not isinstance(samples, (list, tuple)):
            raise bad("'samples' must be a list of {subject, object} (or (subject, object) pairs)")
        if not samples:
            raise bad("relation has no samples")
        subs, objs, seen = [], [], set()
        for i, smp in enumerate(samples):
            if isinstance(smp, dict):
                sub, obj = smp.get("subject"), smp.get("object")
            elif isinstance(smp, (list, tuple)) and len(smp) == 2:
                sub, obj = smp
            else:
                sub = obj = None
            if not isinstance(sub, str) or not isinstance(obj, str):
                raise bad(f"sample {i} must be an object with string 'subject' and 'object' (or a pair of strings)")
            if not sub.strip() or not obj.strip():
                raise bad(f"sample {i} has an empty subject or object")
            if (sub, obj.strip()) in seen:  # a fact listed twice counts once (the LRE authors' files have some)
                continue
            seen.add((sub, obj.strip()))
            subs.append(sub)
            objs.append(obj.strip())
        inferred = infer_kind(subs, objs)
        kind = kind or inferred
        if kind not in KINDS:
            raise bad(f"'kind' {kind!r}: allowed values are {', '.join(KINDS)}")
        if not _covers(kind, inferred):  # a declared kind may be more general than its samples show, not narrower
            raise bad(f"kind {kind} but the samples are {inferred} (subjects or objects repeat)")
        self.name, self.kind, self.prompt_templates = name, kind, tuple(tpls)
        self.subjects, self.objects = tuple(subs), tuple(objs)
        self.description, self.source = str(description), str(source)

    def __len__(self) -> int:
        return len(self.subjects)

    def __repr__(self) -> str:
        return f"Relation({self.name!r}, {len(self)} samples, {self.kind})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Relation) and self.to_dict() == other.to_dict()

    @property
    def samples(self) -> list[tuple[str, str]]:
        return list(zip(self.subjects, self.objects))

    def objects_of(self, subject: str) -> list[str]:
        """Every object of ``subject`` (several in one-to-many relations)."""
        return [o for s, o in zip(self.subjects, self.objects) if s == subject]

    @property
    def many_objects(self) -> bool:
        """Objects repeat across subjects (a classifier readout over the object set makes sense)."""
        return self.kind in ("many_to_one", "many_to_many")

    @property
    def object_set(self) -> list[str]:
        """Distinct objects in first-seen order."""
        return list(dict.fromkeys(self.objects))

    def subset(self, max_samples: int | None) -> "Relation":
        """``max_samples`` evenly spaced samples (files are often grouped by object; this keeps the object mix)."""
        if max_samples is None or max_samples >= len(self):
            return self
        import numpy as np

        keep = sorted({int(i) for i in np.linspace(0, len(self) - 1, max_samples).round()})
        return Relation(self.name, self.prompt_templates, [self.samples[i] for i in keep], kind=self.kind,
                        description=self.description, source=self.source)

    def to_dict(self) -> dict:
        """The JSON file format."""
        return {"name": self.name, "kind": self.kind, "description": self.description,
                "prompt_templates": list(self.prompt_templates),
                "samples": [{"subject": s, "object": o} for s, o in self.samples]}


def shipped_relations_dir() -> Path:
    """The dataset shipped with mechfact."""
    return Path(__file__).resolve().parent.parent / "data" / "relations"


def parse_relation(data: object, source: str) -> Relation:
    """Validate one decoded relation JSON object."""
    if not isinstance(data, dict):
        raise ValueError(f"relation file {source}: not a relation (expected a JSON object with name, "
                         "prompt_templates, samples)")
    missing = [k for k in ("name", "prompt_templates", "samples") if k not in data]
    if missing:
        raise ValueError(f"relation file {source}: not in the relation format: missing {', '.join(missing)}")
    tpls = data["prompt_templates"]
    if not isinstance(tpls, list):
        raise ValueError(f"relation file {source}: 'prompt_templates' must be a non-empty list of strings")
    rel = Relation(data["name"], tpls, data["samples"], kind=data.get("kind"),
                   description=str(data.get("description", "")), source=source)
    if len(rel) < MIN_FACTS:
        listed = len(data["samples"])
        dup = f" ({listed} listed; a fact listed twice counts once)" if listed != len(rel) else ""
        raise ValueError(f"relation file {source}: {len(rel)} distinct fact{'s' if len(rel) != 1 else ''}{dup}; a "
                         f"relation needs at least {MIN_FACTS} (readouts and LREs compare facts): add samples")
    return rel


def load_relation_file(path: str | Path) -> Relation:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark is accepted
    except UnicodeDecodeError as exc:
        raise ValueError(f"relation file {path}: not valid JSON (not UTF-8 text: byte {exc.start} is "
                         f"0x{exc.object[exc.start]:02x})") from None
    except OSError as exc:
        raise ValueError(f"relation file {path}: cannot be read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"relation file {path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    return parse_relation(data, str(path))


def load_relations(path: str | Path | None = None, names: list[str] | None = None) -> list[Relation]:
    """Relations from a file or a folder of ``*.json`` files (default: the shipped dataset), sorted by name.

    ``names`` keeps only those relations (each must exist).
    """
    path = shipped_relations_dir() if path is None else Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.json"))
        if not files:
            raise ValueError(f"--relations {path}: folder holds no .json relation files")
        rels = [load_relation_file(f) for f in files]
    elif path.is_file():
        rels = [load_relation_file(path)]
    else:
        raise ValueError(f"--relations {path}: no such file or folder")
    seen: dict[str, str] = {}
    for r in rels:
        if r.name in seen:
            raise ValueError(f"relation file {r.source}: relation name {r.name!r} also used by {seen[r.name]}")
        seen[r.name] = r.source
    rels.sort(key=lambda r: r.name)
    return keep_named(rels, names, f"in {path}")


def keep_named(rels: list[Relation], names: list[str] | None, where: str = "among them") -> list[Relation]:
    """``rels`` kept to ``names`` (all of them when None); ValueError naming any name that is not there."""
    if not names:
        return rels
    have = {r.name for r in rels}
    unknown = [n for n in names if n not in have]
    if unknown:
        raise ValueError(f"--relation-names {', '.join(unknown)}: not {where} (have {', '.join(sorted(have))})")
    return [r for r in rels if r.name in names]


def as_relations(relations=None, names: list[str] | None = None) -> list[Relation]:
    """A list of relations from a Relation, a list of them, a file / folder path, or None (the shipped dataset)."""
    if isinstance(relations, Relation):
        rels = [relations]
    elif isinstance(relations, (list, tuple)) and relations and all(isinstance(r, Relation) for r in relations):
        rels = list(relations)
    elif relations is None or isinstance(relations, (str, Path)):
        return load_relations(relations, names)
    else:
        raise ValueError(f"relations of type {type(relations).__name__}: expected a Relation, a list of them, "
                         "a relation file / folder path, or None (the shipped dataset)")
    return keep_named(rels, names)
