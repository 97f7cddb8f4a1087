"""The handle of a pretrained model: :class:`LanguageModel`, a booted transformer-lens bridge plus what the
probes need to know about it, hookable like the bridge itself (``run_with_cache``, ``run_with_hooks``,
``hook_dict``, ``W_U``); and the dtypes a model is loaded in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

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
    def blocks(self):
        """The bridge's transformer blocks (``blocks[i]``; weight probes read their MLP weights)."""
        return self.bridge.blocks

    @property
    def W_U(self) -> torch.Tensor:
        """(d_model, vocab) unembedding."""
        return self.bridge.W_U

    def __call__(self, tokens: torch.Tensor, **kw) -> torch.Tensor:
        return self.bridge(tokens, **kw)

    def final_logits(self, resid: torch.Tensor) -> torch.Tensor:
        """Logits (n, vocab) of last-block residual states (n, d): the final norm, then the unembedding."""
        with torch.no_grad():
            x = resid.to(self.device, self.dtype)[:, None]
            return self.bridge.unembed(self.bridge.ln_final(x))[:, 0]

    def run_with_cache(self, *args, **kw):
        return self.bridge.run_with_cache(*args, **kw)

    def run_with_hooks(self, *args, **kw):
        return self.bridge.run_with_hooks(*args, **kw)

    def parameters(self):
        return self.bridge.parameters()

    def __repr__(self) -> str:
        return (f"LanguageModel({self.name!r}, n_layers={self.n_layers}, d_model={self.d_model}, "
                f"device={self.device}, dtype={self.dtype})")


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
