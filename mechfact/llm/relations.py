"""Relational facts: load and validate relation JSON files (format in ``mechfact/data/relations/README.md``).

A relation file is ``{"name", "prompt_templates": ["... {} ..."], "samples":
[{"subject", "object"}]}`` plus the optional ``kind`` (``many_to_one`` /
``one_to_one``, inferred from repeated objects when absent) and ``description``.
Every problem is a ``ValueError`` that names the file and what is wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

KINDS = ("many_to_one", "one_to_one")


@dataclass(frozen=True)
class Relation:
    name: str
    kind: str  # many_to_one | one_to_one
    prompt_templates: tuple[str, ...]
    subjects: tuple[str, ...]
    objects: tuple[str, ...]
    description: str = ""
    source: str = ""  # file it came from

    def __len__(self) -> int:
        return len(self.subjects)

    @property
    def object_set(self) -> list[str]:
        """Distinct objects in first-seen order."""
        return list(dict.fromkeys(self.objects))


def shipped_relations_dir() -> Path:
    """The dataset shipped with mechfact."""
    return Path(__file__).resolve().parent.parent / "data" / "relations"


def parse_relation(data: object, source: str) -> Relation:
    """Validate one decoded relation JSON object."""
    def bad(msg: str) -> ValueError:
        return ValueError(f"relation file {source}: {msg}")

    if not isinstance(data, dict):
        raise bad("not a relation (expected a JSON object with name, prompt_templates, samples)")
    missing = [k for k in ("name", "prompt_templates", "samples") if k not in data]
    if missing:
        raise bad(f"not in the relation format: missing {', '.join(missing)}")
    name = data["name"]
    if not isinstance(name, str) or not name.strip():
        raise bad("'name' must be a non-empty string")
    tpls = data["prompt_templates"]
    if not isinstance(tpls, list) or not tpls or not all(isinstance(t, str) for t in tpls):
        raise bad("'prompt_templates' must be a non-empty list of strings")
    for t in tpls:
        if t.count("{}") != 1:
            raise bad(f"prompt template {t!r} must contain exactly one '{{}}' (the subject)")
        try:
            t.format("x")
        except (IndexError, KeyError, ValueError):
            raise bad(f"prompt template {t!r} is not a format string with one '{{}}'") from None
    samples = data["samples"]
    if not isinstance(samples, list):
        raise bad("'samples' must be a list of {subject, object}")
    if not samples:
        raise bad("relation has no samples")
    subs, objs = [], []
    for i, s in enumerate(samples):
        if not isinstance(s, dict) or not isinstance(s.get("subject"), str) or not isinstance(s.get("object"), str):
            raise bad(f"sample {i} must be an object with string 'subject' and 'object'")
        if not s["subject"].strip() or not s["object"].strip():
            raise bad(f"sample {i} has an empty subject or object")
        subs.append(s["subject"])
        objs.append(s["object"].strip())
    if len(set(subs)) != len(subs):
        dup = sorted({x for x in subs if subs.count(x) > 1})
        raise bad(f"subjects must be unique (repeated: {', '.join(dup[:5])})")
    kind = data.get("kind") or ("many_to_one" if len(set(objs)) < len(objs) else "one_to_one")
    if kind not in KINDS:
        raise bad(f"'kind' {kind!r}: allowed values are {', '.join(KINDS)}")
    if kind == "one_to_one" and len(set(objs)) < len(objs):
        raise bad("kind one_to_one but some objects repeat")
    return Relation(name=name, kind=kind, prompt_templates=tuple(tpls), subjects=tuple(subs), objects=tuple(objs),
                    description=str(data.get("description", "")), source=source)


def load_relation_file(path: str | Path) -> Relation:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"relation file {path}: cannot be read ({exc})") from None
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
    if names:
        unknown = [n for n in names if n not in seen]
        if unknown:
            raise ValueError(f"--relation-names {', '.join(unknown)}: not in {path} (have {', '.join(sorted(seen))})")
        rels = [r for r in rels if r.name in names]
    return rels
