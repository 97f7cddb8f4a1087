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
    if check_remote(executor, None):
        from ..executor import Job

        dev = str(lm.device)
        executor.map([Job(key=rel.name, fn=functools.partial(job(rel), rel, dev), cost=float(len(rel)))
                      for rel in todo],
                     lambda j, value: on_result(j.key, value))
        return
    for rel in todo:
        on_result(rel.name, local(rel))
