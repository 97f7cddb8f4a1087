"""Relations of a pretrained model as the facts :mod:`mechfact.probes.state_transfer` runs on: zero-shot prompts
of one template, the facts the model knows (the LRE authors' prefix match of the clean top-1), and each subject's
neutral prompt per relation: BOS (when the model prepends one) plus the subject's tokens as that relation's prompt
tokenises them (a mid-sentence subject keeps its leading space), so a patched state is that of the very tokens the
recipient prompt holds."""

from __future__ import annotations

from dataclasses import replace

import torch

from ..probes.queries import ProbeSet, predictions
from ..probes.selectivity import KnownFacts
from ..probes.state_transfer import TransferFact, TransferFacts, TransferRelation
from ..probes.known import knows, prefix_match
from .prompts import Prompt, check_template, prompt_text, tokenize_prompt
from .relations import as_relations


def _prompts(lm, rel, template: int) -> list[Prompt]:
    check_template(rel, template)
    out = []
    for i in range(len(rel)):
        text, a, b = prompt_text(rel, i, k=0, template=template)
        toks, first, last = tokenize_prompt(lm.tokenizer, text, (a, b), lm.bos_id)
        out.append(Prompt(text, rel.subjects[i], rel.objects[i], toks, first, last))
    return out


def transfer_facts(lm, relations, *, template: int = 0) -> TransferFacts:
    """The known facts of ``relations`` (a Relation, a list, a file or folder) for state transfer."""
    tok = lm.tokenizer

    def matches(t: int, objs: tuple[str, ...]) -> bool:
        return prefix_match(tok, t, objs)

    rels, neutral = [], {}
    for rel in as_relations(relations):
        prompts = _prompts(lm, rel, template)
        top = predictions(lm, ProbeSet.from_prompts(prompts, pad_id=lm.pad_id))
        ok = knows(tok, top, [p.object for p in prompts])
        known = [TransferFact(i, p.subject, tuple(o for s, o in zip(rel.subjects, rel.objects) if s == p.subject),
                              p.tokens, p.subject_last, int(top[i]), p.subject_last - p.subject_first + 1)
                 for i, p in enumerate(prompts) if ok[i]]
        rels.append(TransferRelation(rel.name, len(prompts), known, matches))
        for f in known:
            if (rel.name, f.subject) not in neutral:
                p = prompts[f.index]
                toks = ([lm.bos_id] if p.subject_first > 0 and p.tokens[0] == lm.bos_id else []) \
                    + list(p.tokens[p.subject_first:p.subject_last + 1])
                neutral[(rel.name, f.subject)] = (toks, len(toks) - 1)
    return TransferFacts(rels, neutral, int(lm.pad_id))


def known_facts(lm, relations, *, template: int = 0) -> KnownFacts:
    """The facts of ``relations`` the model knows, as one ProbeSet scored against each fact's clean top-1 token (a
    token that is a prefix of the object), for relation selectivity."""
    rels = as_relations(relations)
    prompts = [_prompts(lm, rel, template) for rel in rels]
    ps = ProbeSet.from_prompts([p for group in prompts for p in group], pad_id=lm.pad_id,
                               relations=[r for r, group in enumerate(prompts) for _ in group],
                               relation_names=[rel.name for rel in rels])
    top = predictions(lm, ps)
    objects = [p.object for group in prompts for p in group]
    known = torch.tensor(knows(lm.tokenizer, top, objects), dtype=torch.bool)
    idx = torch.nonzero(known).reshape(-1)
    if len(idx) == 0:
        raise ValueError(f"no known facts: the model answers none of the {len(ps)} facts of "
                         f"{', '.join(rel.name for rel in rels)}; relation selectivity needs facts the model knows")
    return KnownFacts(replace(ps, object_tokens=top).subset(idx), [rel.name for rel in rels])
