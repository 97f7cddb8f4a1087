"""Prompts for relational facts: zero-shot or k-shot, tokenised with the subject's token positions.

A k-shot prompt puts ``k`` completed examples of the same relation (other
subjects, drawn with a seeded generator) before the query, one per line::

    Tokyo is a city in Japan
    Lyon is a city in France
    Cairo is a city in Egypt
    Osaka is a city in

Token positions count the BOS token the bridge prepends (when it does).
:func:`probe_set` turns the prompts of several relations into the
:class:`~mechfact.probes.queries.ProbeSet` every probe takes; positions use the
probes' one vocabulary (``subject`` = the subject's last token, ``subject_first``,
``last``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..probes.known import GENERIC_TOKENS, KNOWN_RULES, knows, prefix_match, spells_object  # noqa: F401 (its home)
from ..probes.queries import SITE_POSITIONS, ProbeSet, check_position
from ..seeding import derive_seed
from .relations import Relation, as_relations

POSITIONS = tuple(p for p in SITE_POSITIONS if p != "relation")  # a prompt has no relation token


@dataclass
class Prompt:
    text: str
    subject: str
    object: str
    tokens: list[int]  # including BOS when the model prepends it
    subject_first: int  # token positions in ``tokens``
    subject_last: int

    @property
    def last(self) -> int:
        return len(self.tokens) - 1

    def position(self, which: str) -> int:
        which = check_position(which, POSITIONS)
        return self.subject_last if which == "subject" else getattr(self, which)


def icl_examples(n: int, i: int, k: int, seed: int, tag: str) -> list[int]:
    """``k`` indices of other samples (not ``i``) for the in-context examples of sample ``i``."""
    if k <= 0 or n < 2:
        return []
    others = np.array([j for j in range(n) if j != i])
    rng = np.random.default_rng(derive_seed(seed, f"llm.icl.{tag}", i))
    return [int(j) for j in rng.choice(others, size=min(k, len(others)), replace=False)]


def prompt_text(rel: Relation, i: int, *, k: int = 3, template: int = 0, seed: int = 0,
                examples: list[int] | None = None) -> tuple[str, int, int]:
    """(text, subject char start, subject char end) of sample ``i``'s prompt.

    ``examples``: fixed in-context samples (those with sample ``i``'s subject left out), instead of ``k``
    random other samples.
    """
    tpl = rel.prompt_templates[template]
    shown = icl_examples(len(rel), i, k, seed, rel.name) if examples is None else \
        [j for j in examples if rel.subjects[j] != rel.subjects[i]]
    lines = [f"{tpl.format(rel.subjects[j])} {rel.objects[j]}" for j in shown]
    head = "".join(line + "\n" for line in lines)
    start = len(head) + tpl.index("{}")
    return head + tpl.format(rel.subjects[i]), start, start + len(rel.subjects[i])


def tokenize_prompt(tokenizer, text: str, span: tuple[int, int], bos_id: int | None) -> tuple[list[int], int, int]:
    """Token ids (BOS first when ``bos_id`` is given) and the first/last token positions of ``text[span]``."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offs = list(enc["input_ids"]), list(enc["offset_mapping"])
    start, end = span
    inside = [t for t, (a, b) in enumerate(offs) if a < end and b > start]
    if not inside:
        raise ValueError(f"subject span {text[start:end]!r} maps to no token in {text!r}")
    shift = 1 if bos_id is not None else 0
    return ([bos_id] if bos_id is not None else []) + ids, inside[0] + shift, inside[-1] + shift


def object_token_ids(tokenizer, obj: str) -> list[int]:
    """Tokens of the object as it continues a prompt (a leading space)."""
    return list(tokenizer(" " + obj, add_special_tokens=False)["input_ids"])


def check_template(rel: Relation, template: int) -> None:
    """ValueError naming the template index and the relation's range."""
    if not 0 <= template < len(rel.prompt_templates):
        raise ValueError(f"--template {template}: relation {rel.name} has templates 0..{len(rel.prompt_templates) - 1}")


def build_prompts(rel: Relation, tokenizer, bos_id: int | None, *, k: int = 3, template: int = 0,
                  seed: int = 0, examples: list[int] | None = None, samples: list[int] | None = None) -> list[Prompt]:
    """Prompts of ``samples`` (default all) with ``k`` random in-context examples, or the fixed ``examples``."""
    check_template(rel, template)
    out = []
    for i in (range(len(rel)) if samples is None else samples):
        text, a, b = prompt_text(rel, i, k=k, template=template, seed=seed, examples=examples)
        toks, first, last = tokenize_prompt(tokenizer, text, (a, b), bos_id)
        out.append(Prompt(text=text, subject=rel.subjects[i], object=rel.objects[i], tokens=toks,
                          subject_first=first, subject_last=last))
    return out


def probe_set(lm, relations=None, *, k_shot: int = 3, template: int = 0, seed: int = 0,
              max_samples: int | None = None) -> ProbeSet:
    """One query per fact of every relation, as a k-shot prompt of ``lm``: a right-padded ProbeSet.

    ``relations``: a Relation, a list of them, a file / folder path or None (the shipped dataset).
    ``relations`` ids index the list (sorted by name when loaded from files), ``objects`` are global ids of
    distinct (relation, object) pairs, ``object_tokens`` the first token of ``" " + object``.
    """
    rels = [r.subset(max_samples) for r in as_relations(relations)]
    prompts, rel_ids, obj_names, obj_toks = [], [], [], []
    for r_id, rel in enumerate(rels):
        ps = build_prompts(rel, lm.tokenizer, lm.bos_id, k=k_shot, template=template, seed=seed)
        prompts += ps
        rel_ids += [r_id] * len(ps)
        obj_names += [f"{rel.name}:{p.object}" for p in ps]
        obj_toks += [object_token_ids(lm.tokenizer, p.object)[0] for p in ps]
    obj_index = {o: i for i, o in enumerate(dict.fromkeys(obj_names))}
    return ProbeSet.from_prompts(prompts, relations=rel_ids, objects=[obj_index[o] for o in obj_names],
                                 object_tokens=obj_toks, pad_id=lm.pad_id, relation_names=[r.name for r in rels])
