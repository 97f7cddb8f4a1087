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


def flush_denormals() -> None:
    """Flush denormal floats to zero on CPU (a no-op where unsupported).

    Once a model is confident, a large share of its softmax probabilities over
    N candidates underflow into the denormal range (< 1.2e-38), and L2 decay
    drives unused weights there too; CPU arithmetic on denormals is ~10x slower
    (measured: softmax * scale @ W on a (1024, 1024) block with 21% denormals,
    0.038 s vs 0.0037 s flushed), so training slows down exactly when it nears
    100%. Flushing changes values by less than 1.2e-38. Called by the CLI and
    by the trainers.
    """
    torch.set_flush_denormal(True)
