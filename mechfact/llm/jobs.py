"""One task per relation: the relations of a pretrained-model command in this process, or on a Ray executor."""

from __future__ import annotations

import functools

from .models.loading import LanguageModel, check_remote
from .relations import Relation


def map_relations(todo: list[Relation], executor, lm: LanguageModel, local, job, on_result) -> None:
    """Each relation of ``todo`` once, ``on_result(name, value)`` as it finishes: ``local(rel)`` in this process,
    or, with a Ray executor, ``job(rel)(rel, lm's device)`` as one task per relation, the largest relations
    first. ``job(rel)`` returns that relation's task function (picklable: a partial of a module-level function
    holding only what the relation needs), which loads the model through :func:`worker_model`."""
    map_units([(rel.name, rel, float(len(rel))) for rel in todo], executor, lm, lambda key, rel: local(rel),
              lambda key, rel: job(rel), on_result)


def map_units(units: list[tuple[str, Relation, float]], executor, lm: LanguageModel, local, job, on_result) -> None:
    """:func:`map_relations` over finer units: each ``(key, relation, cost)`` once (e.g. one per relation and
    kind), ``on_result(key, value)`` as it finishes: ``local(key, rel)`` in this process, in the given order, or
    ``job(key, rel)(rel, lm's device)`` as one Ray task per unit, the costliest first."""
    if check_remote(executor, None):
        from ..executor import Job

        dev = str(lm.device)
        executor.map([Job(key=key, fn=functools.partial(job(key, rel), rel, dev), cost=cost)
                      for key, rel, cost in units],
                     lambda j, value: on_result(j.key, value))
        return
    for key, rel, _ in units:
        on_result(key, local(key, rel))
