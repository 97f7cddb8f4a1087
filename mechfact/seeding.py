"""Explicit, reproducible randomness.

Randomness enters through a ``seed`` argument; :func:`derive_seed` turns a base
seed plus a tag and block indices into an independent stream, so data can be
regenerated block by block (nested instances, chunked decoupled candidates).
"""

from __future__ import annotations

import random
import zlib

import numpy as np
import torch


def derive_seed(seed: int, tag: str, *indices: int) -> int:
    """A 63-bit seed that depends only on (seed, tag, indices)."""
    entropy = [int(seed) & 0xFFFFFFFF, zlib.crc32(tag.encode()), *[int(i) for i in indices]]
    hi, lo = (int(x) for x in np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32))
    return ((hi << 32) | lo) & ((1 << 63) - 1)


def generator(seed: int, tag: str, *indices: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded by :func:`derive_seed`."""
    g = torch.Generator(device="cpu")
    g.manual_seed(derive_seed(seed, tag, *indices))
    return g


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch global RNGs (call once, at an entry point)."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
