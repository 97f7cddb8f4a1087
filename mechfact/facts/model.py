"""A one-layer transformer for fact recall, hookable like a transformer-lens model.

``FactModel`` is a transformer-lens ``HookedRootModule``: its hook points carry
the standard names (see :mod:`mechfact.hooks`), so ``run_with_cache`` and
``run_with_hooks`` work exactly as on a pretrained model::

    hook_embed                   (batch, pos, d)    token embeddings
    hook_pos_embed               (batch, pos, d)    only when n_ctx > 0
    blocks.0.hook_resid_pre      (batch, pos, d)
    blocks.0.attn.hook_pattern   (batch, 1, q, k)   one head; uniform or softmax
    blocks.0.hook_attn_out       (batch, pos, d)
    blocks.0.hook_resid_mid      (batch, pos, d)
    blocks.0.mlp.hook_pre        (batch, pos, m)    W_in x + b_in
    blocks.0.mlp.hook_post       (batch, pos, m)    ReLU
    blocks.0.hook_mlp_out        (batch, pos, d)
    blocks.0.hook_resid_post     (batch, pos, d)

Input vocabulary: the :class:`~mechfact.facts.world.FactWorld` layout
(entities, relations, special tokens). Output vocabulary: the N entities, or
(``n_outputs = A``) only the first A: in an attribute-pool world every answer is
one of the attributes ``0 .. A-1``, and scoring only those makes the
unembedding, the loss and the evaluation N / A times cheaper. The A columns
are the first A of the full model's (same initial draws).

Embedding regimes (``FactModelConfig.embeddings``):

* ``trainable``    -- everything learns.
* ``frozen``       -- entity input embeddings AND the entity unembedding stay at
  their random N(0, I/d) initialisation (buffers); attention, MLP and the
  relation / special-token embeddings learn (Nichani, Lee & Bietti regime).
* ``frozen-input`` -- only the entity input embeddings are fixed; the
  unembedding learns and can itself store facts (a separate, weaker control).

Relation and special-token embeddings are always trainable. ``tied`` ties the
entity unembedding to the entity input embedding (``W_U = W_E_ent.T``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn
from transformer_lens import HookedRootModule
from transformer_lens.hook_points import HookPoint

from ..config import DictConfig
from ..seeding import generator

ATTENTION = ("uniform", "learned")
ENTITY_INIT = ("normal", "zero")
EMBEDDINGS = ("trainable", "frozen", "frozen-input")
OUTPUTS = ("auto", "entities", "attributes")
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass
class FactModelConfig(DictConfig):
    """Shape and regime of a :class:`FactModel`."""

    n_entities: int  # N: entity tokens, and the output vocabulary
    n_relations: int  # R: relation tokens
    d: int = 64  # residual stream width
    mlp_width: int = 256  # m: hidden units of the ReLU MLP
    attention: str = "uniform"  # uniform (causal average incl. current position) | learned (softmax, 1 head)
    embeddings: str = "trainable"  # trainable | frozen | frozen-input (see module docstring)
    tied: bool = False  # entity unembedding = entity input embedding (transposed)
    n_special: int = 1  # special tokens after the relations (FactWorld: PAD)
    n_ctx: int = 0  # > 0: learned positional embeddings for up to n_ctx positions; 0: none
    layer_norm: bool = False  # pre-LN before attention, MLP and unembedding
    entity_init: str = "normal"  # entity input embeddings: normal (N(0, I/d) rows) | zero (all written by training)
    entity_init_scale: float = 1.0  # multiplies the normal init's std of the entity input embeddings
    seed: int = 0  # initialisation; each tensor has its own derived stream
    n_outputs: int = 0  # output vocabulary: the first n_outputs entities (an attribute pool); 0 = all N

    @property
    def outputs(self) -> int:
        """Size of the output vocabulary (the first ``outputs`` entities)."""
        return self.n_outputs or self.n_entities

    def __post_init__(self) -> None:
        for name, lo in (("n_entities", 2), ("n_relations", 1), ("d", 1), ("mlp_width", 1),
                         ("n_special", 0), ("n_ctx", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name}={v!r}: must be an integer >= {lo}")
        if isinstance(self.n_outputs, bool) or not isinstance(self.n_outputs, int) or \
                not (self.n_outputs == 0 or 2 <= self.n_outputs <= self.n_entities):
            raise ValueError(f"n_outputs={self.n_outputs!r}: allowed 0 (all {self.n_entities} entities) or 2.."
                             f"{self.n_entities} (the first entities: an attribute pool)")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention={self.attention!r}: allowed values are {', '.join(ATTENTION)}")
        if self.embeddings not in EMBEDDINGS:
            raise ValueError(f"embeddings={self.embeddings!r}: allowed values are {', '.join(EMBEDDINGS)}")
        if isinstance(self.entity_init_scale, bool) or not isinstance(self.entity_init_scale, (int, float)) or \
                not math.isfinite(self.entity_init_scale) or self.entity_init_scale <= 0:
            raise ValueError(f"entity_init_scale={self.entity_init_scale!r}: must be a finite number > 0 (for "
                             "embeddings that start at zero use entity_init='zero')")
        if self.entity_init not in ENTITY_INIT:
            raise ValueError(f"entity_init={self.entity_init!r}: allowed values are {', '.join(ENTITY_INIT)}")
        if self.entity_init == "zero" and (self.tied or self.embeddings != "trainable"):
            raise ValueError(f"entity_init='zero' needs trainable, untied entity embeddings (got embeddings="
                             f"{self.embeddings!r}, tied={self.tied}): frozen or tied zero embeddings carry nothing")
        if self.tied and self.embeddings == "frozen-input":
            raise ValueError("tied=True with embeddings='frozen-input' is contradictory (a tied unembedding "
                             "is the frozen input embedding): use embeddings='frozen'")

    @property
    def vocab_size(self) -> int:
        """Input vocabulary size (entities + relations + special tokens)."""
        return self.n_entities + self.n_relations + self.n_special

    def n_weights(self) -> tuple[int, int]:
        """(all weights, trainable weights) of the model, counted from the config (nothing is allocated)."""
        N, d, m = self.n_entities, self.d, self.mlp_width
        ent, unembed = N * d, (0 if self.tied else d * self.outputs)
        rest = (self.n_relations + self.n_special + self.n_ctx) * d  # relation / special / position embeddings
        rest += (4 if self.attention == "learned" else 2) * d * d + 2 * d * m + m + d  # attention, MLP
        rest += 6 * d if self.layer_norm else 0
        frozen = (0 if self.embeddings == "trainable" else ent) + (unembed if self.embeddings == "frozen" else 0)
        total = ent + unembed + rest
        return total, total - frozen



def _randn(seed: int, tag: str, *shape: int, std: float) -> Tensor:
    return torch.randn(*shape, generator=generator(seed, f"facts.model.{tag}")) * std


class Attention(nn.Module):
    """One causal head of width d. Uniform: fixed averaging pattern, learned OV."""

    def __init__(self, cfg: FactModelConfig):
        super().__init__()
        d, s = cfg.d, cfg.seed
        self.uniform = cfg.attention == "uniform"
        if not self.uniform:
            self.W_Q = nn.Parameter(_randn(s, "W_Q", d, d, std=d**-0.5))
            self.W_K = nn.Parameter(_randn(s, "W_K", d, d, std=d**-0.5))
        self.W_V = nn.Parameter(_randn(s, "W_V", d, d, std=d**-0.5))
        self.W_O = nn.Parameter(_randn(s, "W_O", d, d, std=d**-0.5))
        self.hook_pattern = HookPoint()  # (batch, 1, q, k)

    def forward(self, x: Float[Tensor, "batch pos d"]) -> Float[Tensor, "batch pos d"]:
        pos = x.shape[1]
        causal = torch.ones(pos, pos, dtype=torch.bool, device=x.device).tril()
        if self.uniform:
            pattern = causal.to(x.dtype) / causal.sum(1, keepdim=True).to(x.dtype)
            pattern = pattern.expand(x.shape[0], 1, pos, pos).clone()  # a real tensor: hooks may edit in place
        else:
            q, k = x @ self.W_Q, x @ self.W_K
            scores = (q @ k.transpose(1, 2) / math.sqrt(x.shape[-1])).masked_fill(~causal, float("-inf"))
            pattern = scores.softmax(-1)[:, None]
        pattern = self.hook_pattern(pattern)
        return (pattern[:, 0] @ (x @ self.W_V)) @ self.W_O


class MLP(nn.Module):
    """ReLU(x W_in + b_in) W_out + b_out."""

    def __init__(self, cfg: FactModelConfig):
        super().__init__()
        d, m, s = cfg.d, cfg.mlp_width, cfg.seed
        self.W_in = nn.Parameter(_randn(s, "W_in", d, m, std=d**-0.5))
        self.b_in = nn.Parameter(torch.zeros(m))
        self.W_out = nn.Parameter(_randn(s, "W_out", m, d, std=m**-0.5))
        self.b_out = nn.Parameter(torch.zeros(d))
        self.hook_pre = HookPoint()  # (batch, pos, m)
        self.hook_post = HookPoint()  # (batch, pos, m)

    def forward(self, x: Float[Tensor, "batch pos d"]) -> Float[Tensor, "batch pos d"]:
        pre = self.hook_pre(x @ self.W_in + self.b_in)
        post = self.hook_post(F.relu(pre))
        return post @ self.W_out + self.b_out


class Block(nn.Module):
    def __init__(self, cfg: FactModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d) if cfg.layer_norm else nn.Identity()
        self.ln2 = nn.LayerNorm(cfg.d) if cfg.layer_norm else nn.Identity()
        self.attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.hook_resid_pre = HookPoint()  # (batch, pos, d)
        self.hook_attn_out = HookPoint()  # (batch, pos, d)
        self.hook_resid_mid = HookPoint()  # (batch, pos, d)
        self.hook_mlp_out = HookPoint()  # (batch, pos, d)
        self.hook_resid_post = HookPoint()  # (batch, pos, d)

    def forward(self, x: Float[Tensor, "batch pos d"]) -> Float[Tensor, "batch pos d"]:
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(x + self.hook_attn_out(self.attn(self.ln1(x))))
        return self.hook_resid_post(x + self.hook_mlp_out(self.mlp(self.ln2(x))))


class FactModel(HookedRootModule):
    """Embeddings -> one attention + ReLU-MLP block -> entity logits (no LN by default)."""

    def __init__(self, cfg: FactModelConfig):
        super().__init__()
        self.cfg = cfg
        N, R, d, s = cfg.n_entities, cfg.n_relations, cfg.d, cfg.seed
        std = d**-0.5  # N(0, I/d) rows
        ent = _randn(s, "W_E_ent", N, d, std=std * cfg.entity_init_scale)
        if cfg.entity_init == "zero":
            ent.zero_()
        if cfg.embeddings == "trainable":
            self.W_E_ent = nn.Parameter(ent)
        else:
            self.register_buffer("W_E_ent", ent)
        self.W_E_rel = nn.Parameter(_randn(s, "W_E_rel", R, d, std=std))
        self.W_E_special = nn.Parameter(_randn(s, "W_E_special", cfg.n_special, d, std=std))
        if cfg.n_ctx:
            self.W_pos = nn.Parameter(_randn(s, "W_pos", cfg.n_ctx, d, std=std))
            self.hook_pos_embed = HookPoint()  # (batch, pos, d)
        if not cfg.tied:
            unembed = _randn(s, "W_U", d, N, std=std)  # columns u_e ~ N(0, I/d)
            if cfg.outputs < N:  # the first columns of the same draw
                unembed = unembed[:, :cfg.outputs].clone()
            if cfg.embeddings == "frozen":
                self.register_buffer("W_U_ent", unembed)
            else:
                self.W_U_ent = nn.Parameter(unembed)
        self.hook_embed = HookPoint()  # (batch, pos, d)
        self.blocks = nn.ModuleList([Block(cfg)])
        self.ln_final = nn.LayerNorm(d) if cfg.layer_norm else nn.Identity()
        self.setup()

    # ---- weights -----------------------------------------------------------------
    @property
    def W_E(self) -> Float[Tensor, "vocab d"]:
        """Full input embedding (entities, relations, special tokens)."""
        return torch.cat([self.W_E_ent, self.W_E_rel, self.W_E_special])

    @property
    def W_U(self) -> Float[Tensor, "d n_outputs"]:
        return self.W_E_ent[:self.cfg.outputs].T if self.cfg.tied else self.W_U_ent

    @property
    def device(self) -> torch.device:
        return self.W_E_rel.device

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    def final_logits(self, resid: Float[Tensor, "... d"]) -> Float[Tensor, "... n_outputs"]:
        """Logits of last-block residual states (``blocks.0.hook_resid_post``): final norm, then ``W_U``."""
        return self.ln_final(resid) @ self.W_U

    # ---- forward -----------------------------------------------------------------
    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos n_outputs"]:
        """Logits over the output vocabulary (the N entities, or the first n_outputs) at EVERY position."""
        return self.final_resid(tokens) @ self.W_U

    def _check_tokens(self, tokens: Tensor) -> None:
        if tokens.ndim != 2:
            raise ValueError(f"tokens has shape {tuple(tokens.shape)}: expected (batch, pos)")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.cfg.vocab_size):
            raise ValueError(f"token ids span {int(tokens.min())}..{int(tokens.max())}: allowed 0.."
                             f"{self.cfg.vocab_size - 1} (vocab_size)")
        if self.cfg.n_ctx and tokens.shape[1] > self.cfg.n_ctx:
            raise ValueError(f"sequence length {tokens.shape[1]} exceeds n_ctx={self.cfg.n_ctx}")

    def final_resid(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d"]:
        """The normalised final residual stream; ``forward`` is this times ``W_U``.

        Training and evaluation unembed only the supervised positions with it
        (the unembedding dominates the cost when N is large).
        """
        self._check_tokens(tokens)
        x = self.hook_embed(F.embedding(tokens, self.W_E))
        if self.cfg.n_ctx:
            x = x + self.hook_pos_embed(self.W_pos[: tokens.shape[1]].expand_as(x).clone())
        x = self.blocks[0](x)
        return self.ln_final(x)

    def supervised_resid(self, tokens: Int[Tensor, "batch pos"],
                         supervised: Bool[Tensor, "batch pos"]) -> Float[Tensor, "n_supervised d"]:
        """``final_resid(tokens)[supervised]``, what training and evaluation unembed.

        When only the last position of every query is supervised (single-hop and direct multi-hop queries) and no
        hook is attached, the block runs at that position alone: with one block, the last position reads the
        earlier positions' embeddings through attention and nothing reads their attention or MLP outputs, so
        computing those is wasted (half of a single-hop step's MLP work). The same numbers up to float rounding
        (the attention average is taken before the value map). With a hook attached (an ablation, a patch) the
        full forward runs, so every hook sees every position as usual.
        """
        if not (supervised.shape[1] and bool(supervised[:, -1].all()) and not bool(supervised[:, :-1].any())
                and not self._hooked()):
            return self.final_resid(tokens)[supervised]
        self._check_tokens(tokens)
        blk = self.blocks[0]
        attn = blk.attn
        E, P = self.W_E, tokens.shape[1]
        if attn.uniform and P * E.shape[0] < tokens.shape[0]:
            # fewer (position, token) pairs than queries (a full batch of single-hop facts: N + R tokens against
            # N R queries): the per-token part -- LayerNorm, value and output maps -- runs once per pair on a
            # table, and each query gathers its rows (the average commutes with the linear maps)
            table = E[None] + self.W_pos[:P, None] if self.cfg.n_ctx else E[None].expand(P, -1, -1)
            U = (blk.ln1(table) @ attn.W_V) @ attn.W_O / P  # (P, tokens, d)
            mid = F.embedding(tokens[:, -1], table[-1] + U[-1])
            for p in range(P - 1):
                mid = mid + F.embedding(tokens[:, p], U[p])
            return self.ln_final(mid + blk.mlp(blk.ln2(mid)))
        x = F.embedding(tokens, E)
        if self.cfg.n_ctx:
            x = x + self.W_pos[:P]
        h = blk.ln1(x)
        if attn.uniform:  # the causal average's last row: every position weighs 1 / pos
            mixed = h.mean(1)
        else:
            q = h[:, -1] @ attn.W_Q
            scores = ((h @ attn.W_K) @ q[:, :, None]).squeeze(-1) / math.sqrt(h.shape[-1])
            mixed = (scores.softmax(-1)[:, None, :] @ h).squeeze(1)
        mid = x[:, -1] + (mixed @ attn.W_V) @ attn.W_O
        return self.ln_final(mid + blk.mlp(blk.ln2(mid)))

    def _hooked(self) -> bool:
        """Whether any hook point has a hook attached."""
        return any(hp._forward_hooks or hp._forward_pre_hooks or hp._backward_hooks
                   for hp in self.hook_dict.values())

    # ---- checkpoints ---------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write ``config.json`` then ``model.safetensors`` into directory ``path``, each atomically."""
        from safetensors.torch import save_file

        from ..runs import atomic_path, write_json_atomic

        path = Path(path)
        write_json_atomic(path / CONFIG_FILE, self.cfg.to_dict())
        state = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        with atomic_path(path / WEIGHTS_FILE) as tmp:
            save_file(state, str(tmp), metadata={"config": json.dumps(self.cfg.to_dict())})
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device = "cpu") -> "FactModel":
        """Rebuild a model saved by :meth:`save`; ValueError if the files are corrupt or disagree."""
        from safetensors.torch import load_file

        path = Path(path)
        for f in (CONFIG_FILE, WEIGHTS_FILE):
            if not (path / f).is_file():
                raise ValueError(f"{path}: not a FactModel checkpoint (missing {f})")
        try:
            cfg_dict = json.loads((path / CONFIG_FILE).read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path / CONFIG_FILE}: corrupted config ({e})") from e
        if not isinstance(cfg_dict, dict):
            raise ValueError(f"{path / CONFIG_FILE}: expected a JSON object, got {type(cfg_dict).__name__}")
        cfg = FactModelConfig.from_dict(cfg_dict)
        try:
            state = load_file(str(path / WEIGHTS_FILE))
        except Exception as e:  # safetensors raises its own error types on bad headers / truncation
            raise ValueError(f"{path / WEIGHTS_FILE}: corrupted weights ({e})") from e
        model = cls(cfg)
        model.load_weights(state, source=str(path / WEIGHTS_FILE))
        return model.to(device)

    def load_weights(self, state: dict[str, Tensor], source: str = "state dict") -> None:
        """Strict ``load_state_dict`` with a readable ValueError on any mismatch."""
        own = self.state_dict()
        missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        shapes = [f"{k}: {tuple(state[k].shape)} vs expected {tuple(own[k].shape)}"
                  for k in own if k in state and state[k].shape != own[k].shape]
        if missing or unexpected or shapes:
            raise ValueError(f"{source} does not match the config: missing {missing}, unexpected "
                             f"{unexpected}, shape mismatches {shapes}")
        self.load_state_dict(state)


def scores_attributes(outputs: str, n_entities: int, n_attributes: int | None, hops: int = 1) -> bool:
    """Whether a model of ``outputs`` (auto | entities | attributes) predicts over the attribute pool: only in a
    pool world (A < N); ``auto`` (the default) for single-hop queries, where every answer is an attribute, while
    multi-hop queries keep the entity vocabulary (their intermediate answers become subjects)."""
    if outputs not in OUTPUTS:
        raise ValueError(f"outputs={outputs!r}: allowed values are {', '.join(OUTPUTS)}")
    pool = n_attributes is not None and n_attributes < n_entities
    return pool and (outputs == "attributes" or (outputs == "auto" and hops == 1))


def build_fact_model(world, d: int = 32, mlp_width: int = 64, *, attention: str = "uniform",
                     embeddings: str = "trainable", tied: bool = False, layer_norm: bool = False,
                     entity_init: str = "normal", entity_init_scale: float = 1.0, hops: int = 1,
                     cot: bool = False, seed: int = 0, outputs: str = "auto") -> FactModel:
    """A freshly initialised :class:`FactModel` for the vocabulary of ``world`` (a FactWorld).

    ``seed`` is the INITIALISATION seed (independent of the world's seed). Queries of k > 1 hops get learned
    positions for their length (``hops + 1`` direct, ``2 hops`` with chain of thought). ``outputs``:
    ``entities`` (all N), ``attributes`` (the world's attribute pool ``0 .. A-1``, where every answer lies) or
    ``auto`` (attributes for single-hop queries of a pool world, else entities: :func:`scores_attributes`).
    """
    n_ctx = 0 if hops == 1 else (2 * hops if cot else hops + 1)
    n_out = world.n_attributes if scores_attributes(outputs, world.n_entities, world.n_attributes, hops) else 0
    return FactModel(FactModelConfig(world.n_entities, world.n_relations, d=d, mlp_width=mlp_width,
                                     attention=attention, embeddings=embeddings, tied=tied, layer_norm=layer_norm,
                                     entity_init=entity_init, entity_init_scale=entity_init_scale,
                                     n_special=world.n_special, n_ctx=n_ctx, seed=seed,
                                     n_outputs=n_out))
