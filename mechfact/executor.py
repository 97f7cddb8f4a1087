"""A small executor interface for lists of independent jobs.

A sweep is a list of :class:`Job` objects (a key and a callable). Executors
run them and hand each result to ``on_result`` as soon as it is ready, so the
caller can append it to disk. ``LocalExecutor`` runs in-process; a distributed
backend only has to implement :meth:`Executor.map`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from tqdm.auto import tqdm

logger = logging.getLogger(__name__)


@dataclass
class Job:
    key: str  # unique id, used to skip finished work on resume
    fn: Callable[[], Any]  # returns a list of JSON-able records
    cost: float = 1.0  # relative cost, for progress display


class Executor:
    def map(self, jobs: Iterable[Job], on_result: Callable[[Job, Any], None]) -> None:  # pragma: no cover
        raise NotImplementedError


class LocalExecutor(Executor):
    """Runs jobs one after another in this process, with a progress bar."""

    def __init__(self, progress: bool = True, desc: str = "jobs"):
        self.progress = progress
        self.desc = desc

    def map(self, jobs: Iterable[Job], on_result: Callable[[Job, Any], None]) -> None:
        jobs = list(jobs)
        total = sum(j.cost for j in jobs)
        disable = not self.progress or bool(os.environ.get("TQDM_DISABLE"))
        with tqdm(total=total, desc=self.desc, disable=disable, unit="cost") as bar:
            for job in jobs:
                bar.set_postfix_str(job.key[:60])
                result = job.fn()
                on_result(job, result)
                bar.update(job.cost)

