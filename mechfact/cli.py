"""The ``mechfact`` command line.

``main(argv)`` returns an exit code; bad input exits 2 with one line that names
the flag and what is allowed (no traceback).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable, Sequence

from .commands._args import (Parser, UsageError, common_args, executor_args, finite_float, make_executor_from,
                             quiet_progress)

__all__ = ["main", "build_parser", "UsageError", "common_args", "executor_args", "finite_float", "make_executor_from"]

logger = logging.getLogger("mechfact")


COMMANDS: dict[str, Callable] = {}  # command -> handler, filled by build_parser from the command modules


def build_parser() -> argparse.ArgumentParser:
    from .commands import facts, llm, memory, probe, quickstart

    ap = Parser(prog="mechfact", description="Mechanistic interpretability of factual recall.")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in (memory, facts, probe, llm, quickstart):  # the order of `mechfact --help`
        COMMANDS.update(group.register(sub))
    return ap


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
            from .llm.models.loading import set_placement

            set_placement(args.device_map, args.offload_folder)
        flush_denormals()  # confident softmaxes and L2-decayed weights are denormal: ~10x slower on CPU
        with quiet_progress(args.quiet):  # --quiet: no progress bars while the command runs
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
