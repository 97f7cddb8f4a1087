"""Fact-model run directories: what ``facts train`` / ``facts construct`` write and every probe reads.

Layout of a run directory (besides the usual ``config.json`` / ``result.json`` /
``meta.json`` of :class:`mechfact.runs.RunDir`)::

    world.json               the FactWorld (N, R, seed, the permutations)
    model/config.json        FactModelConfig
    model/model.safetensors  the weights

:func:`load_fact_run` accepts such a run directory or a bare ``model/`` folder
that has a ``world.json`` next to it or inside it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from .model import FactModel
from .world import FactWorld

MODEL_DIR = "model"
WORLD_FILE = "world.json"


def save_fact_run(out: str | os.PathLike, model: FactModel, world: FactWorld) -> Path:
    """Write ``world.json`` and ``model/`` into run directory ``out`` (each file atomically)."""
    out = Path(out)
    world.save_json(out / WORLD_FILE)
    model.save(out / MODEL_DIR)
    return out


def is_fact_run(path: str | os.PathLike) -> bool:
    p = Path(path)
    return (p / MODEL_DIR / "model.safetensors").is_file() or (p / "model.safetensors").is_file()


def load_fact_run(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[FactModel, FactWorld]:
    """``(model, world)`` from a run directory; ValueError naming what is missing or corrupt."""
    p = Path(path)
    if not p.is_dir():
        raise ValueError(f"{p}: no such run directory")
    model_dir = p / MODEL_DIR if (p / MODEL_DIR).is_dir() else p
    world_file = next((f for f in (p / WORLD_FILE, model_dir.parent / WORLD_FILE) if f.is_file()), None)
    if world_file is None:
        raise ValueError(f"{p}: not a fact-model run directory (missing {WORLD_FILE}); "
                         "expected the output of `mechfact facts train` or `mechfact facts construct`")
    try:
        world = FactWorld.load_json(world_file)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{world_file}: corrupted fact world ({e})") from e
    model = FactModel.load(model_dir, device=device)
    if (model.cfg.n_entities, model.cfg.n_relations) != (world.n_entities, world.n_relations):
        raise ValueError(f"{p}: model has N={model.cfg.n_entities}, R={model.cfg.n_relations} but {world_file} "
                         f"has N={world.n_entities}, R={world.n_relations}")
    return model, world
