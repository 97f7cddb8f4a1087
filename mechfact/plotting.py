"""Shared matplotlib helpers: figures without pyplot, atomic PNG writes.

Figures are built as ``matplotlib.figure.Figure`` objects, never through
``pyplot``: drawing a result touches no global state, so importing mechfact in
a notebook leaves its matplotlib backend and open figures alone, and plotting
works headless without choosing a backend.
"""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib.figure import Figure


def subplots(nrows: int = 1, ncols: int = 1, *, figsize=None, layout=None, **kw):
    """``(fig, axes)`` like ``pyplot.subplots``, on a detached :class:`~matplotlib.figure.Figure`."""
    fig = Figure(figsize=figsize, layout=layout)
    return fig, fig.subplots(nrows, ncols, **kw)


def save(fig, path: str | os.PathLike) -> Path:
    """Save a figure atomically as PNG."""
    path = Path(path)
    from .runs import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")
    return path


__all__ = ["subplots", "save"]
