"""The known-fact filter, in one place: which facts a model knows, from its top-1 token.

A probe of factual recall runs on the facts the model knows. A fact model's objects are single tokens: the top
token must be the object token. A pretrained model's objects are text, and two rules are in use:

* ``prefix``, the LRE authors' (Hernandez et al. 2024): the decoded token, stripped and lower-cased, is a
  non-empty prefix of an object (:func:`prefix_match`);
* ``spells``, the tracing authors' "the prediction IS the attribute" (Meng et al. 2022) made a rule: a generic
  first token such as " the" before "the United States" does not count (:func:`spells_object`).

:func:`knows` applies either to a batch; :func:`known_indices` runs a model on a ProbeSet and keeps the facts it
knows. :mod:`mechfact.llm.prompts` re-exports the text rules.
"""

from __future__ import annotations


__all__ = ["GENERIC_TOKENS", "KNOWN_RULES", "prefix_match", "spells_object", "knows", "known_indices"]


def prefix_match(tokenizer, token: int, objects) -> bool:
    """The LRE authors' match: the decoded token (stripped, lowercased) is a non-empty prefix of an object."""
    t = tokenizer.decode([int(token)]).strip().lower()
    return bool(t) and any(str(o).lower().startswith(t) for o in objects)


# First tokens that do not name an object: articles, prepositions, conjunctions (a prediction of " the" for
# "the United States" continues the prompt without recalling the fact).
GENERIC_TOKENS = frozenset({"the", "a", "an", "of", "in", "on", "at", "to", "and", "or", "is", "was", "it", "its",
                            "by", "for", "from", "with", "as", "that", "this"})


def spells_object(tokenizer, token: int, obj: str) -> bool:
    """The tracing authors' "known" (the prediction IS the attribute), made a rule: the decoded token, stripped,
    holds a letter or digit, is not a generic word (:data:`GENERIC_TOKENS`, case-insensitive), and is a prefix of
    the object (case-insensitive) that is the whole object or at least two characters long. A bare space, a
    punctuation mark, " the" before "the United States" or " C" before "Canberra" does not count."""
    t = tokenizer.decode([int(token)]).strip()
    o = str(obj).strip()
    if not t or not any(ch.isalnum() for ch in t) or t.lower() in GENERIC_TOKENS:
        return False
    return o.lower().startswith(t.lower()) and (len(t) >= 2 or len(o) == len(t))


KNOWN_RULES = ("spells", "prefix")  # what counts as knowing a fact: the two rules above


def knows(tokenizer, tokens, objects, rule: str = "prefix") -> list[bool]:
    """The known-fact filter: whether each top token (``tokens``) counts as knowing its fact's object
    (``objects``, one per token) under ``rule``.

    ``tokenizer`` None (a fact model, whose objects are single tokens): the top token IS the object token, which
    both rules reduce to. With a tokenizer (objects as text): ``prefix``, the LRE authors' first-token prefix
    (:func:`prefix_match`); ``spells``, the tracing authors' prediction that IS the attribute
    (:func:`spells_object`)."""
    if rule not in KNOWN_RULES:
        raise ValueError(f"known {rule!r}: allowed values are {', '.join(KNOWN_RULES)}")
    if tokenizer is None:
        return [int(t) == int(o) for t, o in zip(tokens, objects)]
    if rule == "spells":
        return [spells_object(tokenizer, int(t), o) for t, o in zip(tokens, objects)]
    return [prefix_match(tokenizer, int(t), [o]) for t, o in zip(tokens, objects)]


def known_indices(model, ps, batch_size: int = 4096) -> list[int]:
    """The facts of the ProbeSet ``ps`` the model knows: :func:`knows` on its top-1 tokens against the object
    tokens (a fact model's queries; a pretrained model's prompts are judged against the objects' text by
    :func:`knows` with its tokenizer)."""
    from .queries import predictions

    top = predictions(model, ps, batch_size=batch_size)
    return [i for i, ok in enumerate(knows(None, top.tolist(), ps.object_tokens.tolist())) if ok]
