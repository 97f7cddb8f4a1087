"""Shared matplotlib setup: headless backend, atomic PNG writes."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def save(fig, path: str | os.PathLike) -> Path:
    """Save a figure atomically as PNG and close it."""
    path = Path(path)
    from .runs import atomic_path

    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, bbox_inches="tight", format="png")
    finally:
        plt.close(fig)
    return path


__all__ = ["plt", "save"]
