"""Exact Jacobians ``J = d o / d s`` of a language model's residual stream, fast.

``s`` = ``resid_post`` of block ``layer`` at token ``pos``; ``o`` = ``resid_post`` of the last block at the
prompt's last token (before the final norm); ``J[i, j] = d o_i / d s_j`` (``d_model x d_model``): the Jacobian
of the linear relational embedding (:mod:`mechfact.llm.lre`).

Where the pieces live:

* here: :func:`jacobian` and :func:`fast_path_problem` (which path a model takes, the fallback remembered per
  bridge), the per-block self-check, the linearised block (:class:`_Linearised`) and the forward-mode pass;
* :mod:`mechfact.llm.jacobian.blocks`: the model's blocks read as plain tensors and Hugging Face modules, and the
  one captured forward pass (block outputs, rotary tables, attention masks);
* :mod:`mechfact.llm.jacobian.linear`: the linear maps of a block's parts (norms, rotary embedding);
* :mod:`mechfact.llm.jacobian.batched`: the batched-copies method, :func:`jacobian_copies`, and its prefix cache
  helpers (also used by :mod:`mechfact.llm.lre.operator`).

:func:`jacobian` computes it in forward mode, all ``d_model`` input directions at once, from ONE forward pass
of the model (batch 1) for the primal values:

* the bridge runs the prompt once; hooks keep every block's output from ``layer`` on (all tokens) and the
  rotary tables and attention mask each attention layer receives;
* blocks ``layer+1 ..`` are then linearised one at a time at those captured inputs: only tangents (``d_model``
  directions x the tokens from ``pos`` on) move; the prompt before ``pos`` enters as constant keys and values;
* the gated MLP of each token is linearised as one explicit matrix,
  ``K = W_down (diag(act'(g) * u) W_gate + diag(act(g)) W_up)``: one ``d x m x d`` product per token, where
  pushing ``d`` tangents through the MLP costs three;
* attention scores take tangents either by forming query and key tangents (one large product per key/value
  head against the whole prompt: no copies of a cache, no repeated grouped keys) or, when the prompt has fewer
  tokens than a head has features, by pulling every key back to a ``d_model`` vector that meets the tangents
  in one product (:class:`_Linearised`; the cheaper way is picked per block);
* in the first block only the subject token carries a tangent, in the last block only the last token's output
  is formed.

Each block's primal output is compared with the bridge's own output: a block this module does not reproduce
(another attention variant, another residual layout) is found there, logged once, and that model's Jacobians
come from :func:`jacobian_copies` -- the batched-copies autograd method (prefix key/value cache, the suffix as
copies through the bridge, one backward per chunk of rows), which works for any model the bridge runs.

Blocks: an ``input_layernorm``, rotary attention with ``q/k/v/o`` (or fused ``qkv``) projections, optional
per-head q/k norms, a query scale, soft-capping and sliding windows, and a gated MLP (separate or fused
gate/up), in the Llama layout (two pre-norms) or Gemma's (norms before and after attention and MLP). Tested
against the batched copies and finite differences on Llama, Qwen2, Qwen3, Phi-3 (with partial rotary) and
Gemma-3 (``tests/test_jacobian.py``); timed by ``benchmarks/jacobian_bench.py``.
"""

from __future__ import annotations

import logging
import operator
import weakref
from typing import Any

import torch
import torch.nn.functional as F

from .batched import jacobian_copies
from .blocks import _CFG_FLAGS, _Block, _block, _capture, _mask, _Mismatch
from .linear import _as, _lin, _norm, _NormLin, _rope, _rope_t

__all__ = ["jacobian", "jacobian_copies", "fast_path_problem", "SELF_CHECK_TOL", "SELF_CHECK_TOL_LOW",
           "ATTENTION_PATHS", "ATTENTION_PATH"]

logger = logging.getLogger(__name__)

# relative error allowed between a linearised block's primal output and the bridge's (the bridge takes the
# attention softmax in float32 for every dtype)
SELF_CHECK_TOL = {torch.float32: 1e-4, torch.float64: 1e-6}
SELF_CHECK_TOL_LOW = 3e-2  # bfloat16 / float16 models (the linearisation runs in float32 from their states)
_UNSUPPORTED: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()  # bridge -> why not


def jacobian(lm, tokens: list[int], pos: int, layer: int, chunk: int | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(J, s, o): J = d o / d s (d_model, d_model) float32 CPU, s = resid_post[layer] at ``pos``, o = the last
    block's resid_post at the prompt's last token (float32 CPU vectors).

    ``chunk``: at most this many input directions per tangent product (memory); None = all ``d_model`` at
    once. The model's parameters are never differentiated (no autograd graph is built).
    """
    tokens = [int(t) for t in tokens]
    n = len(tokens)
    pos, layer = _index("pos", pos, n), _index("layer", layer, lm.n_layers)
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"chunk={chunk!r}: must be a positive integer or None")
    why = _UNSUPPORTED.get(lm.bridge)
    if why is None:
        plan = _plan(lm)
        if isinstance(plan, str):
            why = plan
        else:
            try:
                return _forward_mode(lm, plan, tokens, pos, layer, chunk)
            except _Mismatch as exc:
                why = str(exc)
            except (RuntimeError, IndexError, ValueError, TypeError, AttributeError, KeyError) as exc:
                why = f"{type(exc).__name__} in the forward-mode path: {' '.join(str(exc).split())[:200]}"
        _UNSUPPORTED[lm.bridge] = why
        logger.warning("%s: Jacobians by batched copies (slower): %s", getattr(lm, "name", "model"), why)
    return jacobian_copies(lm, tokens, pos, layer, 96 if chunk is None else chunk)


def _index(name: str, v, n: int) -> int:
    try:
        if isinstance(v, bool):
            raise TypeError
        i = operator.index(v)
    except TypeError:
        raise ValueError(f"{name}={v!r}: must be an integer") from None
    if not 0 <= i < n:
        raise ValueError(f"{name}={i}: out of range 0..{n - 1}")
    return i


def fast_path_problem(lm) -> str | None:
    """Why :func:`jacobian` computes ``lm``'s Jacobians by :func:`jacobian_copies`, or None when it does not (as
    far as known: a block that does not reproduce the bridge's is found at the first call)."""
    why = _UNSUPPORTED.get(lm.bridge)
    if why is None:
        plan = _plan(lm)
        why = plan if isinstance(plan, str) else None
    return why


def _plan(lm) -> list[_Block] | str:
    """Every block as a :class:`_Block`, or a one-line reason why this module cannot linearise them."""
    b = lm.bridge
    cfg = getattr(b, "cfg", None)
    for flag in _CFG_FLAGS:
        if getattr(cfg, flag, False):
            return f"the bridge's {flag} is set"
    try:
        plan = [_block(blk) for blk in b.blocks]
    except (_Mismatch, AttributeError, TypeError, ValueError) as exc:
        return f"unsupported block ({exc})"
    dev = torch.device(lm.device)
    for blk in plan:
        for w in (blk.wq, blk.wk, blk.wv, blk.wo, blk.wg, blk.wu, blk.wd):
            if w.device.type != dev.type or (dev.index is not None and w.device.index != dev.index):
                return f"weights on {w.device}, inputs on {dev} (a model spread over devices)"
    return plan


ATTENTION_PATHS = ("direct", "scores")
ATTENTION_PATH: str | None = None  # None: per block, whichever needs fewer multiplications (tests force each)


class _Linearised:
    """One block's primal values at the suffix tokens (from its captured input) and its tangent map.

    The suffix is the tokens from ``pos`` on (T of them); the block's outputs are formed at the suffix rows
    ``r0..T-1``; tangents enter at the suffix tokens ``0..n_tan-1`` (the later ones have none yet).

    Attention scores take tangents two ways, whichever needs fewer multiplications: ``direct`` forms the
    tangents of the queries and keys (B x d x heads x head_dim per token) and multiplies them with the keys and
    queries; ``scores`` pulls each key back through the query's rotation, norm and projection to a vector of
    ``d_model`` (and each query back through the key's), so a tangent meets the scores in one product of
    B x d x (heads x keys) -- fewer when there are fewer keys than head features (short prompts, wide heads).
    """

    def __init__(self, blk: _Block, h_in: torch.Tensor, pos: int, r0: int, n_tan: int,
                 cos: torch.Tensor, sin: torch.Tensor, fill, add):
        n, d = h_in.shape
        H, KV, hd = blk.n_heads, blk.n_kv, blk.head_dim
        g = H // KV
        R = n - pos - r0
        dt = self.dt = h_in.dtype  # the computation's dtype (float32, or float64 for a float64 model)
        self.blk, self.pos, self.r0, self.R, self.n_tan, self.g = blk, pos, r0, R, n_tan, g
        self.nq = max(0, min(R, n_tan - r0))  # output rows whose own token carries a tangent: the first nq
        half = cos.shape[-1] // 2
        self.cos, self.sin = cos.to(dt), torch.cat((-sin[:, :half], sin[:, half:]), -1).to(dt)
        qi = slice(pos + r0, n)  # the output rows' positions
        ti = slice(pos, pos + n_tan)  # the positions of the tokens that carry tangents
        self.h_in = h_in
        a = _norm(blk.norm_in, h_in)  # (n, d)
        q = F.linear(a[qi], _as(blk.wq, dt), _as(blk.bq, dt)).view(R, H, hd)
        k = F.linear(a, _as(blk.wk, dt), _as(blk.bk, dt)).view(n, KV, hd)
        v = F.linear(a, _as(blk.wv, dt), _as(blk.bv, dt)).view(n, KV, hd)
        self.n_in = _NormLin(blk.norm_in, h_in[ti])
        self.n_q = _lin(blk.q_norm, q[:self.nq])
        self.n_k = _lin(blk.k_norm, k[ti])
        if blk.q_norm is not None:
            q = _norm(blk.q_norm, q)
        if blk.k_norm is not None:
            k = _norm(blk.k_norm, k)
        q = _rope(q, self.cos[qi, None], self.sin[qi, None])
        k = _rope(k, self.cos[:, None], self.sin[:, None])
        raw = torch.einsum("rkge,nke->krgn", q.view(R, KV, g, hd), k) * blk.scaling  # (KV, R, g, n)
        # for the score tangents (dq . k + q . dk): each term meets one of these, so both carry the scale
        self.q, self.k, self.v = q * blk.scaling, k * blk.scaling, v
        if blk.softcap is not None:
            th = torch.tanh(raw / blk.softcap)
            self.dcap = (1 - th * th)[:, :, None]
            raw = th * blk.softcap
        if fill is not None:
            raw = raw.masked_fill(fill[qi][None, :, None, :], torch.finfo(dt).min)
        if add is not None:
            am = add[:, qi]  # (heads or 1, R, n)
            am = am.view(KV, g, R, n).permute(0, 2, 1, 3) if am.shape[0] == H else am[:, :, None, :]
            raw = raw + am.to(dt)
        self.P = torch.softmax(raw, -1)  # (KV, R, g, n)
        o = torch.einsum("krgn,nke->rkge", self.P, v).reshape(R, H * hd)
        attn = F.linear(o, _as(blk.wo, dt), _as(blk.bo, dt))
        self.n_attn = _lin(blk.norm_attn_out, attn)
        if blk.norm_attn_out is not None:
            attn = _norm(blk.norm_attn_out, attn)
        self.h_mid = h_in[qi] + attn
        self.n_mlp = _NormLin(blk.norm_mlp_in, self.h_mid)
        a2 = _norm(blk.norm_mlp_in, self.h_mid)
        gate = F.linear(a2, _as(blk.wg, dt), _as(blk.bg, dt))
        up = F.linear(a2, _as(blk.wu, dt), _as(blk.bu, dt))
        act, dact = torch.func.jvp(lambda z: blk.act(z).to(dt), (gate,), (torch.ones_like(gate),))
        mlp = F.linear(act * up, _as(blk.wd, dt), _as(blk.bd, dt))
        self.n_out = _lin(blk.norm_mlp_out, mlp)
        if blk.norm_mlp_out is not None:
            mlp = _norm(blk.norm_mlp_out, mlp)
        self.h_out = self.h_mid + mlp
        # the MLP's Jacobian at each output row, as one matrix: W_down (diag(act'(g) u) W_gate + diag(act(g)) W_up)
        wg, wu, wd = _as(blk.wg, dt), _as(blk.wu, dt), _as(blk.wd, dt)
        c1, c2 = dact * up, act
        self.K = torch.empty(R, d, d, device=h_in.device, dtype=dt)
        M = torch.empty_like(wg)  # one buffer, written in place (a fresh m x d tensor per token costs page faults)
        for r in range(R):
            torch.mul(wg, c1[r, :, None], out=M).addcmul_(wu, c2[r, :, None])
            torch.mm(wd, M, out=self.K[r])
        # the norms around the MLP folded in, K <- N_out K N_in (the rows of K pulled back through N_in, its
        # columns pushed through N_out): the tangents meet one matrix per token
        self.K = self.n_mlp.vjp(self.K)
        if self.n_out is not None:
            self.K = self.n_out.jvp(self.K.transpose(1, 2)).transpose(1, 2)
        self.Uq = self.Uk = None

    def _paths(self) -> tuple[str, str]:
        """(queries' path, keys' path): the fewest multiplications for all d_model directions (the pulled-back
        vectors are formed once per block, whatever the chunks) unless ATTENTION_PATH forces one."""
        if ATTENTION_PATH is not None:
            return ATTENTION_PATH, ATTENTION_PATH
        blk, (n, d), R = self.blk, self.h_in.shape, self.R
        H, KV, hd, B = blk.n_heads, blk.n_kv, blk.head_dim, d
        q = "scores" if H * n * hd * d + B * d * H * n < B * d * H * hd + B * H * hd * n else "direct"
        k = "scores" if R * H * hd * d + B * d * R * H < B * d * KV * hd + B * H * R * hd else "direct"
        return q, k

    def _query_pullback(self) -> torch.Tensor:
        """(nq, H * n, d): row r, head h, key j -> the vector u with (query tangent of r, h) . k_j = A_r . u."""
        if self.Uq is None:
            blk, pos, r0, nq, g = self.blk, self.pos, self.r0, self.nq, self.g
            n, d = self.h_in.shape
            H, KV, hd = blk.n_heads, blk.n_kv, blk.head_dim
            qi = slice(pos + r0, pos + r0 + nq)
            w = _rope_t(self.k[None], self.cos[qi, None, None], self.sin[qi, None, None])  # (nq, n, KV, hd)
            w = w[:, :, :, None].expand(nq, n, KV, g, hd).reshape(nq, n, H, hd)
            if self.n_q is not None:
                w = self.n_q.vjp(w)
            self.Uq = torch.einsum("rjhe,hed->rhjd", w, _as(blk.wq, self.dt).view(H, hd, d)).reshape(nq, H * n, d)
        return self.Uq

    def _key_pullback(self) -> torch.Tensor:
        """(n_tan, R * H, d): key j, row r, head h -> the vector u with q_{r,h} . (key tangent of j) = A_j . u."""
        if self.Uk is None:
            blk, pos, n_tan, R, g = self.blk, self.pos, self.n_tan, self.R, self.g
            d = self.h_in.shape[1]
            H, KV, hd = blk.n_heads, blk.n_kv, blk.head_dim
            ti = slice(pos, pos + n_tan)
            z = _rope_t(self.q[None], self.cos[ti, None, None], self.sin[ti, None, None])  # (n_tan, R, H, hd)
            z = z.view(n_tan, R, KV, g, hd).permute(0, 1, 3, 2, 4).reshape(n_tan, R * g, KV, hd)
            if self.n_k is not None:
                z = self.n_k.vjp(z)
            z = z.view(n_tan, R, g, KV, hd).permute(0, 1, 3, 2, 4)  # (n_tan, R, KV, g, hd)
            self.Uk = torch.einsum("jrkge,ked->jrkgd", z, _as(blk.wk, self.dt).view(KV, hd, d)).reshape(
                n_tan, R * H, d)
        return self.Uk

    def tangent(self, X: torch.Tensor) -> torch.Tensor:
        """Tangents (R, B, d) of the block's outputs at the output rows from tangents X (n_tan, B, d) of its
        inputs at the suffix tokens 0..n_tan-1."""
        blk, pos, r0, R, n_tan, nq, g = self.blk, self.pos, self.r0, self.R, self.n_tan, self.nq, self.g
        B, dt = X.shape[1], self.dt
        H, KV, hd = blk.n_heads, blk.n_kv, blk.head_dim
        n = self.h_in.shape[0]
        ti = slice(pos, pos + n_tan)
        q_path, k_path = self._paths()
        A = self.n_in.jvp(X)  # (n_tan, B, d)
        dS = torch.zeros(KV, R, B, g, n, device=X.device, dtype=dt) if nq < R or q_path == "scores" else None
        # scores: (the output rows' query tangents) x (all keys)
        if nq and q_path == "scores":
            s1 = torch.bmm(A[r0:r0 + nq], self._query_pullback().transpose(1, 2))  # (nq, B, H * n)
            dS[:, :nq] = s1.view(nq, B, KV, g, n).permute(2, 0, 1, 3, 4)
        elif nq:
            dq = F.linear(A[r0:r0 + nq], _as(blk.wq, dt)).view(nq, B, H, hd)
            if self.n_q is not None:
                dq = self.n_q.jvp(dq)
            qi = slice(pos + r0, pos + r0 + nq)
            dq = _rope(dq, self.cos[qi, None, None], self.sin[qi, None, None])
            dqk = dq.view(nq, B, KV, g, hd).permute(2, 0, 1, 3, 4).reshape(KV, nq * B * g, hd)
            s1 = torch.bmm(dqk, self.k.permute(1, 2, 0)).view(KV, nq, B, g, n)
            if dS is None:
                dS = s1
            else:
                dS[:, :nq] = s1
        # + (queries) x (the keys' tangents)
        if k_path == "scores":
            s2 = torch.bmm(A, self._key_pullback().transpose(1, 2))  # (n_tan, B, R * H)
            dS[..., ti] += s2.view(n_tan, B, R, KV, g).permute(3, 2, 1, 4, 0)
        else:
            dk = F.linear(A, _as(blk.wk, dt)).view(n_tan, B, KV, hd)
            if self.n_k is not None:
                dk = self.n_k.jvp(dk)
            dk = _rope(dk, self.cos[ti, None, None], self.sin[ti, None, None])
            dS[..., ti] += torch.einsum("rkge,jbke->krbgj", self.q.view(R, KV, g, hd), dk)
        if blk.softcap is not None:
            dS.mul_(self.dcap)
        P = self.P[:, :, None]  # (KV, R, 1, g, n)
        dS.sub_((P * dS).sum(-1, keepdim=True)).mul_(P)  # softmax: dP = P (dS - sum(P dS))
        do = torch.bmm(dS.view(KV, -1, n), self.v.permute(1, 0, 2)).view(KV, R, B, g, hd)
        dv = F.linear(A, _as(blk.wv, dt)).view(n_tan, B, KV, hd)
        do += torch.einsum("krgj,jbke->krbge", self.P[..., ti], dv)
        do = do.permute(1, 2, 0, 3, 4).reshape(R, B, H * hd)
        dattn = F.linear(do, _as(blk.wo, dt))  # (R, B, d)
        if self.n_attn is not None:
            dattn = self.n_attn.jvp(dattn)
        if nq:  # residual: the rows whose token carried a tangent keep it
            dattn[:nq] += X[r0:r0 + nq]
        return torch.baddbmm(dattn, dattn, self.K.transpose(1, 2))  # + the MLP (between its norms)


def _check(k: int, mine: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    tol = SELF_CHECK_TOL.get(dtype, SELF_CHECK_TOL_LOW)
    err = float((mine - ref).norm() / ref.norm().clamp_min(1e-30))
    if not err <= tol:
        raise _Mismatch(f"block {k}: linearised block's output differs from the bridge's by {err:.2e} "
                        f"(relative; allowed {tol:.0e})")


def _forward_mode(lm, plan: list[_Block], tokens: list[int], pos: int, layer: int, chunk: int | None):
    dev = lm.device
    toks = torch.tensor([tokens], device=dev)
    n = len(tokens)
    last = lm.n_layers - 1
    resid, attn_in = _capture(lm, toks, layer)
    dt = torch.float64 if lm.dtype == torch.float64 else torch.float32  # the linearisation's dtype
    s = resid[layer][pos].float()
    o = resid[last][n - 1].float()
    d = s.shape[0]
    if layer == last:  # o and s are the same block's output
        J = torch.eye(d) if pos == n - 1 else torch.zeros(d, d)
        return J, s.cpu(), o.cpu()
    T = n - pos
    B = d if chunk is None else min(chunk, d)
    with torch.no_grad():
        X = torch.eye(d, device=dev, dtype=dt)[None]  # (1 token, d directions, d): only the subject token moves
        for k in range(layer + 1, lm.n_layers):
            if k not in attn_in or attn_in[k].get("position_embeddings") is None:
                raise _Mismatch(f"block {k}: no rotary tables reached the attention")
            cos, sin = attn_in[k]["position_embeddings"]
            cos, sin = cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1])
            if cos.shape[0] != n:
                raise _Mismatch(f"block {k}: rotary tables of shape {tuple(cos.shape)}")
            fill, add = _mask(attn_in[k], n, dev)
            r0 = 0 if k < last else T - 1  # the last block: the last token's output only
            lin = _Linearised(plan[k], resid[k - 1].to(dt), pos, r0, X.shape[0], cos, sin, fill, add)
            _check(k, lin.h_out, resid[k][pos + r0:].to(dt), lm.dtype)
            X = lin.tangent(X) if B >= d else torch.cat([lin.tangent(X[:, c:c + B]) for c in range(0, d, B)], 1)
    J = X[-1].T.contiguous()
    return J.float().cpu(), s.cpu(), o.cpu()
