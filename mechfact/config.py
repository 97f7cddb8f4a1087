"""Config dataclasses: ``to_dict`` / strict ``from_dict`` round-trip."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any, TypeVar

T = TypeVar("T", bound="DictConfig")


class DictConfig:
    """Mixin for ``@dataclass`` configs."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[T], d: dict[str, Any]) -> T:
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown {cls.__name__} keys {sorted(unknown)}; allowed: {sorted(known)}")
        return cls(**d)
