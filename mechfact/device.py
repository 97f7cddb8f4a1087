"""Device selection: ``auto`` picks CUDA when present, else CPU."""

from __future__ import annotations

import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(name: str = "auto") -> torch.device:
    """Map ``auto|cpu|cuda[:i]`` to a ``torch.device``; clear error otherwise."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: CUDA is not available on this machine (use auto or cpu)")
        return torch.device(name)
    raise ValueError(f"--device {name!r}: allowed values are {', '.join(DEVICE_CHOICES)}")
