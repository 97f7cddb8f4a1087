"""The ``mechfact`` command line.

``main(argv)`` returns an exit code; bad input exits 2 with one line that names
the flag and what is allowed (no traceback).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable, Sequence

from .device import DEVICE_CHOICES

logger = logging.getLogger("mechfact")


class UsageError(Exception):
    """Bad command-line input (exit code 2)."""


def finite_float(text: str) -> float:
    """argparse type: a finite number (NaN and inf are refused with the flag's name by argparse)."""
    import math

    v = float(text)
    if not math.isfinite(v):
        raise ValueError(text)
    return v


finite_float.__name__ = "finite number"  # argparse: "argument --lr: invalid finite number value: 'inf'"


class _Parser(argparse.ArgumentParser):
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
    """The executor a command's flags ask for (the caller closes it)."""
    from .executor import make_executor

    return make_executor(a.executor, workers=a.workers, address=a.ray_address, device=a.device_obj,
                         progress=not a.quiet, desc=desc, gpus_per_task=a.gpus_per_task)


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=5000, help="Adam step budget per run (default 5000)")
    p.add_argument("--lr", type=finite_float, default=1.0, help="Adam learning rate (default 1.0)")
    p.add_argument("--loss", default="ce", choices=("ce", "ce-margin", "hinge2"), help="training loss (default ce)")
    p.add_argument("--patience", type=int, default=1500,
                   help="give up a run after this many steps without fewer errors; 0 = never (default 1500)")
    p.add_argument("--active-set", type=int, default=0,
                   help="train on each input's K strongest competitors, refreshed and checked exactly every 20 steps; "
                        "0 = all competitors (default 0)")


def _solver_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", default="trained", choices=("hebb", "trained", "separable"))
    p.add_argument("--problem", default="original", choices=("original", "decoupled"))
    p.add_argument("--kappa", type=finite_float, default=1.0, help="rank fraction m/d in (0, 1] (default 1)")
    _train_args(p)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="mechfact", description="Mechanistic interpretability of factual recall.")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)

    mem = sub.add_parser("memory", help="linear associative memories (paper A)")
    msub = mem.add_subparsers(dest="sub", required=True, parser_class=_Parser)

    p = msub.add_parser("sweep", help="accuracy vs load alpha = p ln p / d^2")
    p.add_argument("--d", type=int, nargs="+", default=[32, 64])
    p.add_argument("--alpha-min", type=finite_float, default=0.05)
    p.add_argument("--alpha-max", type=finite_float, default=1.2)
    p.add_argument("--points", type=int, default=12)
    p.add_argument("--seeds", type=int, default=3)
    _solver_args(p)
    common_args(p)
    executor_args(p)

    p = msub.add_parser("capacity", help="perfect-recall capacity p_c per (d, seed) by bisection")
    p.add_argument("--d", type=int, nargs="+", default=[24, 32, 48, 64])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--alpha-lo", type=finite_float, default=0.02, help="initial lower bracket on alpha (default 0.02)")
    p.add_argument("--alpha-hi", type=finite_float, default=1.5, help="initial upper bracket on alpha (default 1.5)")
    p.add_argument("--rel-tol", type=finite_float, default=0.01, help="bisection resolution on p_c, relative (default 0.01)")
    _solver_args(p)
    common_args(p)
    executor_args(p)

    p = msub.add_parser("scores", help="target vs competitor score distributions, Hebb vs trained")
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--alpha", type=finite_float, default=0.5)
    p.add_argument("--problem", default="original", choices=("original", "decoupled"))
    p.add_argument("--kappa", type=finite_float, default=1.0)
    _train_args(p)
    common_args(p)

    p = msub.add_parser("spectrum", help="singular values of trained (OP, DP), Hebb and initial W")
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--alpha", type=finite_float, default=0.8)
    p.add_argument("--seeds", type=int, default=3, help="instances pooled (default 3)")
    p.add_argument("--kappa", type=finite_float, default=1.0)
    _train_args(p)
    p.set_defaults(steps=3000)
    common_args(p)

    p = msub.add_parser("rank", help="capacity of rank-constrained W = Q R^T against kappa")
    p.add_argument("--d", type=int, nargs="+", default=[24, 32])
    p.add_argument("--kappas", type=finite_float, nargs="+", default=[0.25, 0.5, 0.75, 1.0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--problem", default="original", choices=("original", "decoupled"))
    _train_args(p)
    common_args(p)
    executor_args(p)

    from .commands import facts, llm, probe

    for group in (facts, probe, llm):
        COMMANDS.update(group.register(sub))

    q = sub.add_parser("quickstart", help="small versions of every capability and one HTML report")
    q.add_argument("--fast", action="store_true", help="smoke-sized version (used by the tests)")
    q.add_argument("--families", nargs="*", default=None, metavar="NAME",
                   help="also run the readout and superposition on other packaged models and add a side-by-side "
                        "section: no NAME = every installed one (`mechfact llm models`), else the NAMEs given")
    common_args(q, out_required=False)
    q.set_defaults(out="mechfact_quickstart")
    return ap


def _train_cfg(a, **over):
    from .memory.solvers import MemoryTrainConfig

    return MemoryTrainConfig(lr=a.lr, steps=a.steps, loss=a.loss, patience=a.patience, active_set=a.active_set, **over)


def _run_memory(a) -> None:
    from .memory import experiments as ex

    device = a.device_obj
    if a.sub in ("sweep", "capacity"):
        solver = ex.SolverConfig(method=a.method, problem=a.problem, kappa=a.kappa, train=_train_cfg(a))
        if a.sub == "sweep":
            cfg = ex.SweepConfig(d=a.d, alpha_min=a.alpha_min, alpha_max=a.alpha_max, points=a.points, seeds=a.seeds, solver=solver)
            run = ex.run_sweep
        else:
            cfg = ex.CapacityConfig(d=a.d, seeds=a.seeds, solver=solver, alpha_lo=a.alpha_lo, alpha_hi=a.alpha_hi,
                                    rel_tol=a.rel_tol)
            run = ex.run_capacity
        executor = make_executor_from(a, f"memory {a.sub}")
        try:
            run(cfg, a.out, device=device, seed=a.seed, executor=executor)
        finally:
            executor.close()
    elif a.sub == "scores":
        ex.run_scores(ex.ScoresConfig(d=a.d, alpha=a.alpha, problem=a.problem, kappa=a.kappa, train=_train_cfg(a)),
                      a.out, device=device, seed=a.seed)
    elif a.sub == "spectrum":
        ex.run_spectrum(ex.SpectrumConfig(d=a.d, alpha=a.alpha, kappa=a.kappa, seeds=a.seeds, train=_train_cfg(a, early_stop=False)),
                        a.out, device=device, seed=a.seed)
    elif a.sub == "rank":
        cfg = ex.RankConfig(d=a.d, kappas=a.kappas, seeds=a.seeds, problem=a.problem, train=_train_cfg(a))
        executor = make_executor_from(a, "memory rank")
        try:
            ex.run_rank(cfg, a.out, device=device, seed=a.seed, executor=executor)
        finally:
            executor.close()
    print(f"results written to {a.out}")


def _run_quickstart(a) -> None:
    from .quickstart import run_quickstart

    families = False if a.families is None else (a.families or True)
    if families is not True and families:
        from .llm.registry import MODELS

        bad = [f for f in families if f not in MODELS]
        if bad:
            raise ValueError(f"--families {' '.join(bad)}: unknown model; packaged models: {', '.join(sorted(MODELS))}")
    path = run_quickstart(a.out, device=a.device_obj, seed=a.seed, fast=a.fast, families=families)
    print(f"report: {path}")


COMMANDS: dict[str, Callable] = {"memory": _run_memory, "quickstart": _run_quickstart}


def _silence_progress() -> None:
    """--quiet: no progress bars anywhere in this process or its children.

    tqdm reads TQDM_DISABLE once, when it is imported, and torch has imported it
    by the time the arguments are parsed; so the default of the class itself is
    switched off too (an explicit ``disable=`` still wins).
    """
    import functools
    import os

    import tqdm

    os.environ["TQDM_DISABLE"] = "1"
    tqdm.std.tqdm.__init__ = functools.partialmethod(tqdm.std.tqdm.__init__, disable=True)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line. Exit 0: done; 2: bad input or a file that is not what it should be (one line);
    1: the system refused (disk full, permission, out of memory) or an internal error (one line; the traceback
    with ``MECHFACT_DEBUG=1``); 130: interrupted. Finished work is kept and a rerun with the same --out resumes."""
    import os

    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    debug = os.environ.get("MECHFACT_DEBUG", "") not in ("", "0")
    try:
        import torch

        from .device import flush_denormals, resolve_device
        from .limits import set_max_memory
        from .runs import check_writable

        if args.threads is not None:
            if args.threads < 1:
                raise UsageError(f"--threads {args.threads}: must be at least 1")
            torch.set_num_threads(args.threads)
        set_max_memory(args.max_memory)
        if getattr(args, "device_map", None) is not None or getattr(args, "offload_folder", None) is not None:
            from .llm.loading import set_placement

            set_placement(args.device_map, args.offload_folder)
        flush_denormals()  # confident softmaxes and L2-decayed weights are denormal: ~10x slower on CPU
        if args.quiet:
            _silence_progress()
        args.device_obj = resolve_device(args.device)
        if args.out is not None:  # commands that only print (llm models) have no run directory
            check_writable(args.out)
        COMMANDS[args.command](args)
    except (UsageError, ValueError) as exc:
        if debug:
            raise
        print(f"mechfact: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mechfact: interrupted; rerun with the same --out to resume", file=sys.stderr)
        return 130
    except (OSError, MemoryError) as exc:
        if debug:
            raise
        what = "out of memory" if isinstance(exc, MemoryError) else _os_error(exc)
        print(f"mechfact: error: {what}; finished work is kept: rerun the same command to resume", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - one line for the user; MECHFACT_DEBUG=1 shows the traceback
        if debug:
            raise
        if "out of memory" in str(exc).lower() or "can't allocate memory" in str(exc).lower():
            print(f"mechfact: error: out of memory ({_one_line(exc)[:200]}); use smaller sizes; finished work is "
                  "kept", file=sys.stderr)
            return 1
        print(f"mechfact: internal error: {type(exc).__name__}: {_one_line(exc)[:300]} (please report it; "
              "MECHFACT_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
    return 0


def _os_error(exc: OSError) -> str:
    import errno

    where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
    if exc.errno == errno.ENOSPC:
        return f"no space left on the device{where}"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"permission denied{where}"
    return f"{exc.strerror or _one_line(exc)}{where}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
