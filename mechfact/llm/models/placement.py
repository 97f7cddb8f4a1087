"""Where a pretrained model's weights go when it is larger than one device: accelerate device maps
(``--device-map``, ``--offload-folder``), the process-wide default the command line sets, and the device the
inputs of a spread model go to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from .checks import _line

DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
_PLACEMENT: dict[str, Any] = {}  # the command line's --device-map / --offload-folder (set_placement)


def check_device_map(device_map: Any) -> str | dict | None:
    """``auto|balanced|balanced_low_0|sequential``, a dict of module name -> device (``cpu``, ``disk``, a GPU
    index or ``cuda:i``), or a JSON file holding such a dict; a clear error for anything else."""
    if device_map is None or isinstance(device_map, dict):
        return device_map
    text = str(device_map)
    if text in DEVICE_MAPS:
        return text
    if text.endswith(".json") or Path(text).is_file():
        try:
            m = json.loads(Path(text).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"--device-map {text}: not a readable JSON file ({_line(exc)})") from None
        if not isinstance(m, dict) or not all(isinstance(v, (str, int)) for v in m.values()):
            raise ValueError(f"--device-map {text}: the file must hold one JSON object of module name -> device "
                             "('cpu', 'disk', 0, 'cuda:1', ...)")
        return m
    raise ValueError(f"--device-map {text!r}: allowed values are {', '.join(DEVICE_MAPS)} or a JSON file of "
                     "module name -> device")


def set_placement(device_map: Any = None, offload_folder: str | None = None) -> None:
    """Process-wide default placement for models loaded by name or path (the CLI's --device-map and
    --offload-folder); ``load_model``'s own arguments win."""
    _PLACEMENT.clear()
    if device_map is not None:
        _PLACEMENT["device_map"] = check_device_map(device_map)
    if offload_folder is not None:
        _PLACEMENT["offload_folder"] = str(offload_folder)


def _embedding_device(bridge) -> torch.device:
    emb = bridge.original_model.get_input_embeddings()
    hook = getattr(emb, "_hf_hook", None)  # offloaded modules hold meta tensors; accelerate's hook knows where
    where = getattr(hook, "execution_device", None)
    if where is not None:
        return torch.device(where if not isinstance(where, int) else f"cuda:{where}")
    p = next(emb.parameters())
    return torch.device("cpu") if p.device.type == "meta" else p.device
