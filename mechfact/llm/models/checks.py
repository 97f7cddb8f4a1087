"""Checks of the files a pretrained model is loaded from, before or as it is loaded.

Every problem is one :class:`~mechfact.runs.CorruptFile` (a ValueError) "<path>: <what is wrong>; <what to
do>": a Hugging Face folder (:func:`check_hf_folder`: config, small JSON files, weight files by their
headers, tokenizer), single weight files (:func:`check_safetensors`, :func:`check_torch_file`), a ``.gguf``
file (:func:`check_gguf`), the memory a folder needs (:func:`check_model_memory`), and :func:`_diagnose`: the
file at fault when loading failed anyway.
"""

from __future__ import annotations

import errno
import json
import math
import struct
import zipfile
from pathlib import Path
from typing import Any

import torch

from ...runs import CorruptFile

FOLDER_FIX = "re-download the model or save it again (save_pretrained)"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model")
HF_JSON = ("generation_config.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
           "tokenizer.json", "vocab.json")
_SMALL_JSON = 1 << 20  # JSON files up to this size are parsed before loading (larger ones are checked on failure)


def _line(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _system_error(exc: BaseException) -> bool:
    """Errors of the machine, not of the files (out of memory, disk full, permissions): never re-labelled."""
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOMEM,
                                                   errno.EIO):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text


def _kind(v: Any) -> str:
    return "object" if isinstance(v, dict) else "list" if isinstance(v, list) else type(v).__name__


def _json_file(path: Path, fix: str) -> Any:
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CorruptFile(f"{path}: not valid JSON (not UTF-8 text at byte {exc.start}); {fix}") from None
    except json.JSONDecodeError as exc:
        what = "empty" if path.stat().st_size == 0 else f"not valid JSON ({_line(exc, 120)})"
        raise CorruptFile(f"{path}: {what}; {fix}") from None


def check_safetensors(path: Path, fix: str = FOLDER_FIX) -> None:
    """The header of a ``.safetensors`` file is readable and its tensors cover the file exactly (a truncated
    or padded file, or another format, is refused); reads only the header."""
    size = path.stat().st_size
    bad = lambda what: CorruptFile(f"{path}: {what}; {fix}")  # noqa: E731
    if size < 8:
        raise bad(f"{'empty' if size == 0 else f'only {size} bytes'}, not a safetensors file")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > 100_000_000:
            raise bad(f"not a safetensors file (its first 8 bytes are not a header length: {n})")
        if n > size - 8:
            raise bad(f"truncated: its header alone needs {8 + n} bytes, the file has {size}")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
        if not isinstance(header, dict):
            raise ValueError(f"a JSON {_kind(header)}")
        end = 0
        for name, info in header.items():
            if name == "__metadata__":
                continue
            lo, hi = info["data_offsets"]
            if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi):
                raise ValueError(f"tensor {name}: data_offsets {info['data_offsets']}")
            end = max(end, hi)
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise bad(f"unreadable safetensors header ({_line(exc, 120)}): not a safetensors file, or damaged") from None
    if 8 + n + end != size:
        what = "truncated" if 8 + n + end > size else "longer than its tensors"
        raise bad(f"{what}: its header describes {8 + n + end} bytes, the file has {size}")


def check_torch_file(path: Path, fix: str = FOLDER_FIX) -> None:
    """A ``.bin`` / ``.pt`` checkpoint is a complete zip archive (torch.save) or a legacy pickle."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(2)
    if size == 0:
        raise CorruptFile(f"{path}: empty; {fix}")
    if head == b"PK":
        try:
            with zipfile.ZipFile(path) as z:
                z.namelist()
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            if isinstance(exc, OSError) and _system_error(exc):
                raise
            raise CorruptFile(f"{path}: truncated or damaged PyTorch checkpoint ({_line(exc, 120)}); {fix}") from None
    elif head[:1] != b"\x80":  # a legacy (pre-zip) torch file is a pickle
        raise CorruptFile(f"{path}: not a PyTorch checkpoint (neither a zip archive nor a pickle); {fix}")


def _weight_files(folder: Path, fix: str) -> list[Path]:
    """The weight files a Hugging Face folder loads from (sharded through an index, or one file)."""
    for index, single in (("model.safetensors.index.json", "model.safetensors"),
                          ("pytorch_model.bin.index.json", "pytorch_model.bin")):
        if (folder / index).is_file():
            data = _json_file(folder / index, fix)
            wmap = data.get("weight_map") if isinstance(data, dict) else None
            if not isinstance(wmap, dict) or not wmap or not all(isinstance(v, str) for v in wmap.values()):
                raise CorruptFile(f"{folder / index}: no 'weight_map' of tensor names to shard files; {fix}")
            shards = [folder / v for v in dict.fromkeys(wmap.values())]
            missing = [p.name for p in shards if not p.is_file()]
            if missing:
                raise CorruptFile(f"{folder}: shard {missing[0]} listed in {index} is missing"
                                  f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; {fix}")
            return shards
        if (folder / single).is_file():
            return [folder / single]
    raise CorruptFile(f"{folder}: no weights (model.safetensors or pytorch_model.bin); {fix}")


def model_bytes(folder: Path, dtype: torch.dtype) -> float:
    """Estimated peak memory of loading a Hugging Face folder in ``dtype``: twice its parameters (the loaded
    weights and the bridge's working copy of the largest pieces), counted from the safetensors headers (for
    ``.bin`` weights: from their file size)."""
    n = 0.0
    for f in _weight_files(folder, FOLDER_FIX):
        if f.suffix == ".safetensors":
            n += sum(math.prod(shape) for shape in _safetensors_shapes(f).values())
        else:
            n += f.stat().st_size / 2  # pytorch_model.bin: assume 16-bit storage
    return 2 * n * torch.tensor([], dtype=dtype).element_size()


def check_model_memory(folder: Path, dtype: torch.dtype, what: str) -> None:
    """Refuse (one line) a model whose load cannot fit under the memory limit (``--max-memory``)."""
    from ...limits import check_memory

    check_memory(model_bytes(folder, dtype), f"{what} (its weights in {str(dtype).replace('torch.', '')})")


def check_hf_folder(folder: Path, fix: str = FOLDER_FIX) -> None:
    """Cheap checks of a local Hugging Face model folder before it is loaded: ``config.json`` is a JSON object
    with a ``model_type``, every small JSON file parses, the weight files are there and complete (headers
    only), a tokenizer is there. Each problem is one :class:`CorruptFile` naming the file and ``fix``."""
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise CorruptFile(f"{folder}: no config.json (not a Hugging Face model folder); {fix}")
    cfg = _json_file(cfg_file, fix)
    if not isinstance(cfg, dict):
        raise CorruptFile(f"{cfg_file}: a JSON {_kind(cfg)}, expected an object with the model's config; {fix}")
    if not isinstance(cfg.get("model_type"), str) or not cfg["model_type"]:
        raise CorruptFile(f"{cfg_file}: no 'model_type' (e.g. \"llama\"): not a Hugging Face model config; {fix}")
    for name in HF_JSON:  # the JSON files loading reads (tokenizer.json: its own check when loading fails)
        f = folder / name
        if f.is_file() and f.stat().st_size <= _SMALL_JSON:
            _json_file(f, fix)
    for f in _weight_files(folder, fix):
        (check_safetensors if f.suffix == ".safetensors" else check_torch_file)(f, fix)
    if not any((folder / t).is_file() for t in TOKENIZER_FILES):
        raise CorruptFile(f"{folder}: no tokenizer ({', '.join(TOKENIZER_FILES[:3])}, ...); copy the model's "
                          "tokenizer files into the folder (tokenizer.save_pretrained)")


def _diagnose(folder: Path, exc: BaseException, fix: str, what: str) -> ValueError:
    """One line for a folder whose loading failed with ``exc``: the file at fault where it can be found."""
    from transformers import AutoConfig

    try:
        check_hf_folder(folder, fix)  # already passed for a local folder; a hub snapshot is checked only now
    except CorruptFile as found:
        return found
    try:
        AutoConfig.from_pretrained(str(folder))
    except Exception as cfg_exc:  # noqa: BLE001 - any config problem names config.json
        if not _system_error(cfg_exc):
            return CorruptFile(f"{folder / 'config.json'}: not a usable model config ({_line(cfg_exc)}); {fix}")
    tok = folder / "tokenizer.json"
    if tok.is_file():
        try:
            from tokenizers import Tokenizer

            Tokenizer.from_file(str(tok))
        except Exception as tok_exc:  # noqa: BLE001
            return CorruptFile(f"{tok}: not a readable tokenizer ({_line(tok_exc, 120)}); {fix}")
    text = _line(exc)
    if "size mismatch" in text or "mismatched_sizes" in text or "shape" in text.lower():
        detail = _shape_mismatch(folder) or "tensor shapes differ"
        return CorruptFile(f"{folder}: the weights do not match config.json ({detail}); {fix}")
    if isinstance(exc, ValueError):  # the loader's own one-line refusal (e.g. an unsupported architecture)
        return exc
    return CorruptFile(f"{what}: could not be loaded ({type(exc).__name__}: {text}); {fix}")


def _safetensors_shapes(path: Path) -> dict[str, tuple]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
    return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}


def _shape_mismatch(folder: Path) -> str | None:
    """The first tensor whose shape in the weight files differs from what config.json builds (best effort)."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM

        with torch.device("meta"):
            want = {k: tuple(v.shape) for k, v in
                    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(folder))).state_dict().items()}
        for f in _weight_files(folder, ""):
            if f.suffix != ".safetensors":
                continue
            for k, shape in _safetensors_shapes(f).items():
                if k in want and want[k] != shape:
                    return f"{k} is {list(shape)} in {f.name}, config.json makes it {list(want[k])}"
    except Exception:  # noqa: BLE001 - only a better message is at stake
        return None
    return None


def check_gguf(path: Path) -> None:
    """A ``.gguf`` file is not empty and starts with the GGUF magic bytes (cheap; the rest is read by the loader)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(4)
    if size == 0:
        raise CorruptFile(f"{path}: empty file, not a GGUF model; download it again")
    if head != b"GGUF":
        raise CorruptFile(f"{path}: not a GGUF file (it does not start with the GGUF magic bytes); pass a .gguf "
                          "model file or a Hugging Face model folder")
