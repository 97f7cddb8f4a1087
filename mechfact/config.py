"""Config dataclasses: validation at construction, ``to_dict`` / strict ``from_dict`` round-trip.

Every config validates itself in ``__post_init__`` (also when built from
Python), so the CLI, the ``run_*`` functions and the in-memory API share one set
of checks. Messages name the option as its command-line flag (field ``mlp_width``
is ``--mlp-width``), the bad value and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, fields, is_dataclass
from typing import Any, Iterable, TypeVar

T = TypeVar("T", bound="DictConfig")


def flag(field: str) -> str:
    """The command-line spelling of a config field: ``mlp_width`` -> ``--mlp-width`` (``n_trials`` -> ``--trials``)."""
    return "--" + _FLAGS.get(field, field).replace("_", "-")


_FLAGS = {"n_trials": "trials"}  # fields whose flag is spelled otherwise


def bad(field: str, value: Any, what: str) -> ValueError:
    """``ValueError("--field value: what")``."""
    return ValueError(f"{flag(field)} {value}: {what}")


def check_type(field: str, value: Any, cls: type) -> None:
    """An instance of ``cls`` (e.g. a nested config)."""
    if not isinstance(value, cls):
        raise ValueError(f"{field}: expected a {cls.__name__}, got {type(value).__name__}")


def check_int(field: str, value: Any, lo: int, hi: int | None = None) -> None:
    """An integer (not a bool) in ``lo..hi``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        raise bad(field, value, f"must be an integer >= {lo}" + ("" if hi is None else f" and <= {hi}"))


def check_float(field: str, value: Any, *, lo: float | None = None, hi: float | None = None,
                lo_open: bool = False, hi_open: bool = False) -> None:
    """A finite number in the interval; NaN and inf are refused."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise bad(field, value, "must be a number") from None
    if not math.isfinite(v):
        raise bad(field, value, "must be a finite number")
    lo_ok = lo is None or (v > lo if lo_open else v >= lo)
    hi_ok = hi is None or (v < hi if hi_open else v <= hi)
    if not (lo_ok and hi_ok):
        left = "" if lo is None else f"{'>' if lo_open else '>='} {lo:g}"
        right = "" if hi is None else f"{'<' if hi_open else '<='} {hi:g}"
        raise bad(field, value, "must be " + " and ".join(x for x in (left, right) if x))


def check_int_list(field: str, values: Any, lo: int, empty: str = "give at least one value") -> None:
    """A non-empty list of integers >= ``lo`` (``--layers``, ``--ranks``)."""
    if not values:
        raise ValueError(f"{flag(field)}: {empty}")
    for v in values:
        check_int(field, v, lo)


def check_choice(field: str, value: Any, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise bad(field, value, f"allowed values are {', '.join(allowed)}")


class DictConfig:
    """Mixin for ``@dataclass`` configs: ``to_dict`` / ``from_dict`` (nested configs rebuilt from their dicts)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[T], d: dict[str, Any]) -> T:
        if not isinstance(d, dict):
            raise ValueError(f"{cls.__name__}: expected a dict, got {type(d).__name__}")
        known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
        unknown = set(d) - set(known)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} keys {sorted(unknown)}; allowed: {sorted(known)}")
        kw = dict(d)
        for name, value in kw.items():  # nested configs: their type is the type of the field's default
            f = known[name]
            sub = f.default_factory() if f.default_factory is not MISSING else f.default
            if is_dataclass(sub) and isinstance(sub, DictConfig) and isinstance(value, dict):
                kw[name] = type(sub).from_dict(value)
        return cls(**kw)
