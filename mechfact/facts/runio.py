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


def _remedy(run: Path) -> str:
    """What to do about a damaged file of run directory ``run``: rewrite it by rerunning the command."""
    import json

    try:
        kind = json.loads((run / "config.json").read_text()).get("kind", "")
    except (OSError, ValueError, AttributeError):
        kind = ""
    cmd = {"facts.train": "`mechfact facts train`", "facts.construct": "`mechfact facts construct`"}.get(
        kind, "the `mechfact facts train|construct` command that made it")
    opts = f" and the options recorded in {run / 'config.json'}" if kind else ""
    return f"rerun {cmd} with --out {run}{opts} to rewrite it"


def _load_model(model_dir: Path, fix: str, device) -> FactModel:
    """The FactModel of ``model_dir``; every problem one CorruptFile naming the file and ``fix``."""
    import json

    from safetensors import safe_open

    from ..runs import CorruptFile
    from .model import CONFIG_FILE, WEIGHTS_FILE, FactModelConfig

    cfg_file, weights = model_dir / CONFIG_FILE, model_dir / WEIGHTS_FILE
    for f in (cfg_file, weights):
        if not f.is_file():
            raise CorruptFile(f"{f}: missing (not a complete fact-model checkpoint); {fix}")
    try:
        cfg_dict = json.loads(cfg_file.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        what = "empty" if cfg_file.stat().st_size == 0 else f"not valid JSON ({' '.join(str(e).split())[:100]})"
        raise CorruptFile(f"{cfg_file}: {what}; {fix}") from None
    if not isinstance(cfg_dict, dict):
        raise CorruptFile(f"{cfg_file}: a JSON {type(cfg_dict).__name__}, expected the FactModelConfig object; {fix}")
    try:
        cfg = FactModelConfig.from_dict(cfg_dict)
    except (ValueError, TypeError, KeyError) as e:
        raise CorruptFile(f"{cfg_file}: not a valid fact-model config ({' '.join(str(e).split())[:200]}); {fix}") \
            from None
    try:
        with safe_open(str(weights), framework="pt") as f:
            state = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types on bad headers / truncation
        if isinstance(e, (MemoryError, OSError)):
            raise
        what = "empty" if weights.stat().st_size == 0 else "truncated or not a safetensors file"
        raise CorruptFile(f"{weights}: {what} ({' '.join(str(e).split())[:120]}); {fix}") from None
    model = FactModel(cfg)
    own = model.state_dict()
    wrong = [f"{k} is missing" for k in own if k not in state]
    wrong += [f"{k} is {tuple(state[k].shape)} there, {CONFIG_FILE} makes it {tuple(own[k].shape)}"
              for k in own if k in state and state[k].shape != own[k].shape]
    wrong += [f"{k} is not a tensor of this model" for k in state if k not in own]
    if wrong:
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise CorruptFile(f"{weights}: does not match {cfg_file}: {wrong[0]}{more}; {fix}")
    model.load_weights(state, source=str(weights))
    return model.to(device)


def load_fact_run(path: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[FactModel, FactWorld]:
    """``(model, world)`` from a run directory; every problem one ValueError (``CorruptFile`` for a damaged file)
    naming the file and how to rewrite it."""
    from ..runs import CorruptFile
    from .world import FILE_FIX

    p = Path(path)
    if not p.is_dir():
        raise ValueError(f"{p}: no such run directory")
    model_dir = p / MODEL_DIR if (p / MODEL_DIR).is_dir() else p
    run = model_dir.parent if model_dir.name == MODEL_DIR and model_dir != p else p
    fix = _remedy(run)
    world_file = next((f for f in (p / WORLD_FILE, model_dir.parent / WORLD_FILE) if f.is_file()), None)
    if world_file is None:
        raise CorruptFile(f"{p}: not a complete fact-model run directory (missing {WORLD_FILE}); expected the output "
                          f"of `mechfact facts train` or `mechfact facts construct`: {fix}")
    try:
        world = FactWorld.load_json(world_file)
    except CorruptFile as e:
        raise CorruptFile(str(e).removesuffix(FILE_FIX) + fix) from None
    model = _load_model(model_dir, fix, device)
    if (model.cfg.n_entities, model.cfg.n_relations) != (world.n_entities, world.n_relations):
        raise CorruptFile(f"{p}: model has N={model.cfg.n_entities}, R={model.cfg.n_relations} but {world_file} "
                          f"has N={world.n_entities}, R={world.n_relations}; {fix}")
    return model, world
