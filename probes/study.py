"""What every page module of ``probes/`` shares: one set of flags and one order of work.

    python -m probes.results_X [--out runs/X] [--run ...] [--export docs/runs/X] [--doc docs/results_X.md]

``--run`` first runs what is missing into ``--out`` (the module's own run options beside it), ``--export`` copies
the run folders' JSON to a folder a clone rebuilds the page from, ``--doc`` writes the page from ``--out`` alone.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable, Sequence


def parser(description: str, out: str, page: str, models: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The shared flags of a page module: --out, --run, --export, --doc (and --models where ``models``)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", default=out, help=f"the run folders (default {out})")
    ap.add_argument("--run", action="store_true", help="run what is missing first")
    ap.add_argument("--export", default=None, metavar="DIR",
                    help=f"copy the run folders' JSON files to DIR (e.g. docs/runs/{Path(out).name}), where --out DIR "
                         "rebuilds the page")
    ap.add_argument("--doc", default=None, metavar="MD", help=f"write the page there (e.g. {page})")
    if models is not None:
        ap.add_argument("--models", nargs="+", default=list(models), help=f"default: {' '.join(models)}")
    return ap


def parse(ap: argparse.ArgumentParser, argv, models: Sequence[str] | None = None) -> argparse.Namespace:
    """The parsed flags; an unknown model in --models is a usage error naming it and what is allowed."""
    a = ap.parse_args(argv)
    bad = [m for m in getattr(a, "models", ()) if m not in (models or ())]
    if bad:
        ap.error(f"--models {' '.join(bad)}: allowed {', '.join(models)}")
    return a


def finish(a: argparse.Namespace, export: Callable[[Path, Path], int], write_doc: Callable[[Path, Path], None],
           figures: Callable[[], None] | None = None, tables: Callable[[], str] | None = None) -> None:
    """After ``--run``: the export, then the page (with its figures), or the tables printed without --doc."""
    out = Path(a.out)
    if a.export:
        print(f"{export(out, Path(a.export))} files copied from {out} to {a.export}")
    if a.doc:
        write_doc(out, Path(a.doc))
        if figures is not None:
            figures()
        print(f"{a.doc} written from {out}")
    elif tables is not None:
        print(tables())
