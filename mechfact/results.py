"""The one shape of a probe's or a trainer's result.

Every result is a frozen dataclass with

* ``records``: flat dicts, one row per measured item (relation, site, layer, problem, ...), in one key
  vocabulary across probes (``relation``, ``layer``, ``site``, ``accuracy``, ``n``, ...), ready for
  ``pandas.DataFrame(result.records)``;
* ``to_dict()``: everything, JSON-ready (what run directories store).

Trainer results (:class:`MappingResult`) also read like the dicts they replaced: ``res["accuracy"]``,
``{**res}`` and ``"steps" in res`` work on their fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields
from typing import Any, Iterator


class Result:
    """Base of every probe's and trainer's result (each a dataclass): ``to_dict()`` (default: every field),
    ``summary(seed)`` (default: ``to_dict()``; results with per-item rows give their means with intervals) and
    ``records`` (every subclass: a property, or a field of flat rows)."""

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self, seed: int = 0) -> dict:
        return self.to_dict()


class MappingResult(Result, Mapping):
    """Mixin for a frozen dataclass result: read-only mapping access to its fields, ``to_dict()`` as a dict."""

    def __getitem__(self, key: str) -> Any:
        if key in self._field_names():
            return getattr(self, key)
        raise KeyError(f"{key!r}: a {type(self).__name__} has {', '.join(self._field_names())}")

    def __iter__(self) -> Iterator[str]:
        return iter(self._field_names())

    def __len__(self) -> int:
        return len(self._field_names())

    @classmethod
    def _field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def to_dict(self) -> dict:
        return asdict(self)


def scalar_row(result) -> dict:
    """The scalar entries of ``result.to_dict()``: the one record of a result that measures one thing."""
    return {k: v for k, v in result.to_dict().items() if isinstance(v, (int, float, str, bool)) or v is None}


__all__ = ["Result", "MappingResult", "scalar_row"]
