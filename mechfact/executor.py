"""Executors for lists of independent jobs: in this process, or as Ray tasks on every core or a cluster.

A sweep is a list of :class:`Job` objects (a key and a callable). An executor runs them and hands each
result to ``on_result`` in the driver as soon as it is ready; only the driver writes ``result.json``, so
resume and atomic writes work the same whatever runs the jobs, and a sweep whose ``on_result`` keeps its
records sorted writes byte-identical results in any completion order.

- :class:`LocalExecutor` runs the jobs one after another in this process (``in_process``: a job may
  share live state with the driver, e.g. a memo that is saved after every evaluation).
- :class:`RayExecutor` runs each job as a Ray task with one CPU and one intra-op thread (plus
  ``gpus_per_task`` GPUs on CUDA), at most ``workers`` at a time, on a local Ray runtime it starts or on a
  running cluster (``address="auto"`` or ``"HOST:PORT"``). Jobs are pickled with cloudpickle and must not
  capture driver-only state (open files, the run directory); their return value comes back by value.

``make_executor`` builds one from the command-line flags (``--executor``, ``--workers``, ``--ray-address``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from tqdm.auto import tqdm

logger = logging.getLogger(__name__)

EXECUTORS = ("local", "ray")
MAX_WORKERS = 4096


@dataclass
class Job:
    key: str  # unique id, used to skip finished work on resume
    fn: Callable[[], Any]  # returns JSON-able records
    cost: float = 1.0  # relative cost: progress display, and the largest jobs start first on Ray


class JobFailed(Exception):
    """A job raised; the message names the job. ``cause`` is the original exception."""

    def __init__(self, key: str, cause: BaseException):
        self.key, self.cause = key, cause
        super().__init__(f"job {key}: {type(cause).__name__}: {' '.join(str(cause).split())}")


class Executor:
    in_process = True  # jobs run in the driver's process and may share live objects with it
    workers_used = 1  # jobs at once in the last map: a run's wall time times this bounds its CPU time

    def map(self, jobs: Iterable[Job], on_result: Callable[[Job, Any], None]) -> None:  # pragma: no cover
        raise NotImplementedError

    def close(self) -> None:
        """Release what the executor started (a local Ray runtime); a no-op for the local executor."""

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc_info) -> None:  # closes, and lets an exception of the block through
        self.close()


def _bar(total: float, desc: str, progress: bool):
    disable = not progress or bool(os.environ.get("TQDM_DISABLE"))
    return tqdm(total=total, desc=desc, disable=disable, unit="cost")


class LocalExecutor(Executor):
    """Runs jobs one after another in this process, with a progress bar."""

    def __init__(self, progress: bool = True, desc: str = "jobs"):
        self.progress = progress
        self.desc = desc

    def map(self, jobs: Iterable[Job], on_result: Callable[[Job, Any], None]) -> None:
        jobs = list(jobs)
        with _bar(sum(j.cost for j in jobs), self.desc, self.progress) as bar:
            for job in jobs:
                bar.set_postfix_str(job.key[:60])
                on_result(job, job.fn())
                bar.update(job.cost)


def _run_job(fn: Callable[[], Any], threads: int) -> Any:
    """The body of every Ray task: one intra-op thread unless told otherwise, denormals flushed as in the CLI."""
    import torch

    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    return fn()


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """``os.environ`` with ``values`` set inside the block, as it was after it."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _check_workers(workers: int | None) -> int | None:
    if workers is None:
        return None
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"--workers {workers!r}: must be a whole number from 1 to {MAX_WORKERS}")
    return workers


class RayExecutor(Executor):
    """Each job a Ray task (1 CPU, ``threads`` intra-op threads, ``gpus_per_task`` GPUs); at most ``workers``
    in flight; results handed to ``on_result`` in the driver as they complete.

    ``address``: None starts a local runtime with ``workers`` CPUs (default: every core) and shuts it down
    in :meth:`close`; ``"auto"`` or ``"HOST:PORT"`` joins a running cluster (``ray start --head``), whose
    CPUs bound the parallelism when ``workers`` is None. A job that raises stops the sweep after the jobs
    already running have finished and been handed over (nothing computed is lost); the error names the job.
    """

    in_process = False

    def __init__(self, workers: int | None = None, address: str | None = None, gpus_per_task: float = 0.0,
                 threads: int = 1, progress: bool = True, desc: str = "jobs"):
        self.workers = _check_workers(workers)
        if address is not None and not str(address).strip():
            raise ValueError("--ray-address '': give 'auto' or HOST:PORT of a running Ray cluster")
        if not (gpus_per_task >= 0):
            raise ValueError(f"--gpus-per-task {gpus_per_task}: must be >= 0")
        self.address, self.gpus_per_task, self.threads = address, float(gpus_per_task), int(threads)
        self.progress, self.desc = progress, desc
        self._started = False
        self._remote = None

    def _ray(self):
        try:
            import ray
        except ImportError:  # pragma: no cover - ray is a dependency
            raise ValueError("--executor ray: the ray package is not installed (pip install ray)") from None
        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report to the network
            env = {"OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads),
                   "OMP_WAIT_POLICY": "PASSIVE", "TQDM_DISABLE": "1"}
            kw: dict[str, Any] = dict(include_dashboard=False, log_to_driver=True, logging_level=logging.ERROR,
                                      configure_logging=True)
            if self.address is None:
                # a local runtime's workers inherit the environment its daemons start with: the variables go in
                # there (no runtime environment to build, so the workers Ray starts ahead are used at once:
                # benchmarks/ray_bench.py) and the driver's own environment is restored after the start
                kw.update(num_cpus=self.workers or os.cpu_count() or 1, object_store_memory=200 * 2**20)
            else:
                kw.update(address=self.address, runtime_env={"env_vars": env})
            try:
                with _environment(env if self.address is None else {}):
                    ray.init(**kw)
            except ConnectionError as exc:
                raise ValueError(f"--ray-address {self.address}: no Ray cluster there ({' '.join(str(exc).split())[:200]})") from None
            self._started = self.address is None
        if self._remote is None:
            self._remote = ray.remote(num_cpus=1, num_gpus=self.gpus_per_task)(_run_job)
        return ray

    def _slots(self, ray) -> int:
        if self.workers is not None:
            return self.workers
        return max(1, int(ray.cluster_resources().get("CPU", 1)))

    def map(self, jobs: Iterable[Job], on_result: Callable[[Job, Any], None]) -> None:
        jobs = list(jobs)
        if not jobs:
            return
        ray = self._ray()
        slots = self.workers_used = self._slots(ray)
        queue = sorted(jobs, key=lambda j: -j.cost)  # largest first: the last job to finish is a small one
        running: dict[Any, Job] = {}
        failure: JobFailed | None = None
        with _bar(sum(j.cost for j in jobs), self.desc, self.progress) as bar:
            while queue or running:
                while queue and failure is None and len(running) < slots:
                    job = queue.pop(0)
                    running[self._remote.remote(job.fn, self.threads)] = job
                if not running:
                    break
                (ref,), _ = ray.wait(list(running), num_returns=1)
                job = running.pop(ref)
                try:
                    value = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - handed over with the job's name once the rest is in
                    if failure is None:
                        failure = JobFailed(job.key, _cause(exc))
                    continue
                on_result(job, value)
                bar.update(job.cost)
                bar.set_postfix_str(job.key[:60])
        if failure is not None:
            cause = failure.cause
            if isinstance(cause, (ValueError, MemoryError, OSError, KeyboardInterrupt)):
                try:  # keep the kind (bad input / the system refused) the CLI maps to its exit code
                    raise type(cause)(str(failure)) from cause
                except TypeError:
                    pass
            raise failure

    def close(self) -> None:
        if self._started:
            import ray

            ray.shutdown()
            self._started = False
        self._remote = None


def _cause(exc: BaseException) -> BaseException:
    """The user's exception inside a Ray task error (or the Ray error itself: a worker that died)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


SPILLS = "evaluations"  # a run folder's subfolder: each unfinished Ray search's evaluations so far, a file a job


def spill_file(folder, key: str):
    """The file in which the job ``key`` of the run in ``folder`` keeps its evaluations while it runs."""
    from pathlib import Path

    return Path(folder) / SPILLS / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")


def _spilled(f) -> dict:
    """One spill file's evaluations ({} for a torn or foreign file, left out: its evaluations are trained again)."""
    from .runs import read_json

    try:
        return read_json(f)
    except Exception:  # noqa: BLE001
        logger.warning("%s: unreadable, left out", f)
        return {}


def read_spills(folder) -> dict:
    """The evaluations kept by the searches of the run in ``folder`` that did not finish (an unreadable file, one
    being replaced, left out)."""
    from pathlib import Path

    got = {}
    for f in sorted((Path(folder) / SPILLS).glob("*.json")):
        got.update(_spilled(f))
    return got


def read_spill(folder, key: str) -> dict:
    """The evaluations the job ``key`` of the run in ``folder`` kept before it was stopped ({} where there are
    none or the file is unreadable)."""
    f = spill_file(folder, key)
    return _spilled(f) if f.is_file() else {}


def spills_here(executor) -> bool:
    """Whether ``executor``'s searches keep their evaluations in spill files: tasks outside this process (the
    in-process searches write the run's result.json themselves) that see this machine's run folders."""
    return on_this_machine(executor) and not executor.in_process


def clear_spills(folder) -> None:
    """Every search of the run in ``folder`` finished: what stopped ones kept is in its result.json now."""
    import shutil
    from pathlib import Path

    if (Path(folder) / SPILLS).is_dir():
        shutil.rmtree(Path(folder) / SPILLS)


def memo_job(executor, search: Callable[[dict, Any], Any], memo: dict, mine: Callable[[str], bool], key: str,
             on_eval=None, spill=None) -> Callable[[], dict]:
    """One memoised search as a job's function. In this process it shares the live ``memo`` (``on_eval`` runs after
    every evaluation, e.g. to save it); elsewhere (a Ray task) it gets a copy of its own evaluations (the keys
    ``mine`` accepts) and returns them beside its result, ``{key: search(...), "evaluations": ...}``, for
    :func:`merge_evaluations`; with ``spill`` (a path the task can write: :func:`spill_file`) it also writes
    them there after every evaluation, so a search stopped part way loses only the training in flight."""
    if executor.in_process:
        return lambda: {key: search(memo, on_eval), "evaluations": {}}
    own = {k: v for k, v in memo.items() if mine(k)}
    if spill is None:
        return lambda: {key: search(own, None), "evaluations": own}

    def save() -> None:
        from .runs import write_json_atomic

        write_json_atomic(spill, own)
    return lambda: {key: search(own, save), "evaluations": own}


def merge_evaluations(memo: dict, evaluations: dict) -> None:
    """Fold a job's evaluations into ``memo`` and keep it in natural key order ("d=8" before "d=16"), so a
    result file does not depend on the order in which jobs finished."""
    memo.update(evaluations)
    items = sorted(memo.items(), key=lambda kv: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", kv[0])])
    memo.clear()
    memo.update(items)


def on_this_machine(executor: Executor | None) -> bool:
    """Whether ``executor``'s jobs run on this machine and so can write its run folders (a training checkpoint):
    the local executor and a Ray runtime it starts; not a cluster joined with ``--ray-address``, whose workers
    may not see these paths."""
    return not isinstance(executor, RayExecutor) or executor.address is None


def make_executor(kind: str = "local", *, workers: int | None = None, address: str | None = None,
                  device: Any = None, progress: bool = True, desc: str = "jobs", gpus_per_task: float | None = None) -> Executor:
    """The executor the flags ask for. ``local`` runs one job at a time (``--workers`` above 1 needs
    ``ray``); ``ray`` uses ``workers`` CPUs (default: every core, or the cluster's) and, when ``device`` is
    CUDA, one GPU per task unless ``gpus_per_task`` says otherwise (e.g. 0.5 to share a GPU by two tasks)."""
    if kind not in EXECUTORS:
        raise ValueError(f"--executor {kind!r}: allowed values are {', '.join(EXECUTORS)}")
    _check_workers(workers)
    if kind == "local":
        if workers not in (None, 1):
            raise ValueError(f"--workers {workers}: the local executor runs one job at a time; add --executor ray "
                             "to run jobs on several cores")
        if address is not None:
            raise ValueError("--ray-address needs --executor ray")
        if gpus_per_task is not None:
            raise ValueError("--gpus-per-task needs --executor ray")
        return LocalExecutor(progress=progress, desc=desc)
    cuda = getattr(device, "type", str(device)) == "cuda"
    if gpus_per_task is None:
        gpus_per_task = 1.0 if cuda else 0.0
    return RayExecutor(workers=workers, address=address, gpus_per_task=gpus_per_task, progress=progress, desc=desc)
