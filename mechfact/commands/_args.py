"""What every command module shares: the parser class, the usage error, argument helpers, quiet progress.

``mechfact.cli`` builds its parser from the command modules and dispatches; the command modules import
their helpers from here (never from ``mechfact.cli``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os

from ..device import DEVICE_CHOICES


class UsageError(Exception):
    """Bad command-line input (exit code 2)."""


def finite_float(text: str) -> float:
    """argparse type: a finite number (NaN and inf are refused with the flag's name by argparse)."""
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(text)
    return v


finite_float.__name__ = "finite number"  # argparse: "argument --lr: invalid finite number value: 'inf'"


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        raise UsageError(f"{self.prog}: error: {message}")


def common_args(p: argparse.ArgumentParser, out_required: bool = True) -> None:
    """--device, --seed, --out, --threads, --quiet: every command has them."""
    p.add_argument("--device", default="auto", choices=DEVICE_CHOICES, help="auto picks CUDA when present (default auto)")
    p.add_argument("--seed", type=int, default=0, help="base seed; seeds are seed, seed+1, ... (default 0)")
    p.add_argument("--out", required=out_required, help="run directory (created; reused to resume)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--max-memory", type=finite_float, default=None, metavar="GB",
                   help="refuse work whose estimated memory exceeds this (default: this machine's memory)")


def executor_args(p: argparse.ArgumentParser) -> None:
    """--executor, --workers, --ray-address: sweeps whose jobs are independent (docs/scaling.md)."""
    p.add_argument("--executor", default="local", choices=("local", "ray"),
                   help="local: one job at a time in this process; ray: one Ray task per job (default local)")
    p.add_argument("--workers", type=int, default=None,
                   help="jobs run at once with --executor ray, one CPU and one thread each (default: every core)")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="join a running Ray cluster ('auto' or HOST:PORT); default: start one on this machine")
    p.add_argument("--gpus-per-task", type=finite_float, default=None,
                   help="GPUs each Ray task reserves when the device is CUDA (default 1; 0.5 shares one GPU by two)")


def make_executor_from(a, desc: str):
    """The executor a command's flags ask for; a context manager that closes it (``with make_executor_from(...)``)."""
    from ..executor import make_executor

    return make_executor(a.executor, workers=a.workers, address=a.ray_address, device=a.device_obj,
                         progress=not a.quiet, desc=desc, gpus_per_task=a.gpus_per_task)


@contextlib.contextmanager
def quiet_progress(quiet: bool = True):
    """``--quiet``: no progress bars while the block runs, in this process and in the processes it starts.

    ``TQDM_DISABLE=1`` for child processes (Ray workers import tqdm after it is set). tqdm reads that variable
    once, when it is imported, and torch has imported it by the time the arguments are parsed; so in this
    process the class's own default is switched off too (an explicit ``disable=`` still wins). Both are
    restored when the block ends.
    """
    if not quiet:
        yield
        return
    import functools

    import tqdm

    cls = tqdm.std.tqdm
    env, init = os.environ.get("TQDM_DISABLE"), cls.__dict__["__init__"]
    os.environ["TQDM_DISABLE"] = "1"
    cls.__init__ = functools.partialmethod(init, disable=True)
    try:
        yield
    finally:
        cls.__init__ = init
        if env is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = env
