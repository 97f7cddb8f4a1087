"""Cost checks before allocation: a command refuses, in one line, work that cannot fit in memory.

The limit is this machine's physical memory unless raised or lowered with ``--max-memory GB`` (CLI) or
:func:`set_max_memory` (Python). It is not part of any run's config: it never changes a result.
"""

from __future__ import annotations

import math
import os

_LIMIT: float | None = None  # bytes; None = this machine's memory


def machine_memory() -> int:
    """Physical memory of this machine in bytes (0 when unknown)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def set_max_memory(gb: float | None) -> None:
    """Set the memory limit in GB (None: back to this machine's memory)."""
    global _LIMIT
    if gb is not None and (not isinstance(gb, (int, float)) or not math.isfinite(gb) or gb <= 0):
        raise ValueError(f"--max-memory {gb}: must be a positive number of GB")
    _LIMIT = None if gb is None else float(gb) * 1e9


def max_memory() -> float:
    """The limit in bytes (``inf`` when the machine's memory is unknown and no limit was set)."""
    if _LIMIT is not None:
        return _LIMIT
    return float(machine_memory() or math.inf)


def fmt_bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def check_memory(need: float, what: str) -> None:
    """Refuse (ValueError, one line) when ``need`` bytes exceed the limit.

    ``what`` names the flags that make the cost, e.g. ``"--d 100000 (W: d x d float32 per instance)"``.
    """
    limit = max_memory()
    if need > limit:
        src = "set with --max-memory" if _LIMIT is not None else "this machine's memory"
        raise ValueError(f"{what}: needs about {fmt_bytes(need)} of memory, over the limit of {fmt_bytes(limit)} "
                         f"({src}); use smaller sizes, or raise the limit with --max-memory GB")
