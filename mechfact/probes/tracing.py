"""Causal tracing (Meng et al., NeurIPS 2022) on any hooked model: where does restoring one clean state bring a
corrupted fact back? (The protocol, its batched runner and its result in one module of ~470 lines.)

Per query (its tokens, subject span ``[s0, s1]``, answer position, target token ``y`` = the clean run's top-1):

1. **Clean run**: the probability of ``y`` (``p_clean``) and the states a restoration copies back.
2. **Corrupted runs**: ``noise`` -- Gaussian noise of scale ``nu`` added to the subject tokens' embeddings
   (at ``hook_embed``), ``n_draws`` draws shared by every restoration of the query; ``nu`` = ``noise_factor``
   (3, as the authors) x the standard deviation of subject-token embeddings measured at that hook
   (:func:`noise_scale`). ``replace`` -- the subject's tokens replaced by another subject's of the same token
   length (Zhang & Nanda 2024), one run per replacement. ``p_corrupt``: the mean over the corrupted runs.
3. **Restorations**: per (token ``t``, layer ``l``) the corrupted runs again with ONE clean piece copied back:
   ``state`` -- the residual stream after block ``l`` (``l = -1``: the embedding, i.e. before block 0);
   ``mlp`` / ``attn`` -- the MLP / attention outputs of a window of ``window`` layers around ``l`` (the
   authors' window: ``max(0, l - w // 2) .. min(L, l - (-w // 2))``), at token ``t``. ``sever="mlp"|"attn"``
   (with ``state``): the restored state's later MLP (attention) outputs at token ``t`` are held at their
   corrupted values, so the path through them is cut.
4. **Score**: the mean over corrupted runs of the metric at the answer position: ``prob`` (p(y)) or
   ``logit_diff`` (``logit y - logit y'``, ``y'`` each corrupted run's own top-1; ``replace`` only). The
   indirect effect of a cell is ``score(restored) - score(corrupted)``.

Tokens before the subject are the same in the clean and corrupted runs, hence so are their states: restoring
them changes nothing, and their cells are filled with the corrupted score without running (exactly what a run
would give). Every other cell is run: cells are batched (``batch_rows`` rows of queries per forward pass, each
row a (cell, corrupted run) pair), and the forward pass stops after the last block: only the answer position
is unembedded (``model.final_logits``). On a transformer-lens bridge a restored run computes only the tokens from
the restored one on and the blocks after its first difference (:mod:`mechfact.probes.trace_suffix`; the same scores).

Buckets (the authors' averaging): first subject token, middle subject tokens, last subject token, first token
after the subject, further tokens, last token; a one-token subject is both first and last, and a subject right
before the last token makes "first after" the last token, as in their figures. A query's bucket score is the
mean over the bucket's tokens (empty buckets: NaN, left out of the means).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import hooks, stats
from ..results import Result
from ..seeding import derive_seed
from .queries import StopForward, model_device
from .trace_suffix import Suffix, _block_list

KINDS = ("state", "mlp", "attn")
SEVER = ("mlp", "attn")
CORRUPTIONS = ("noise", "replace")
METRICS = ("prob", "logit_diff")
BUCKETS = ("first_subject", "middle_subject", "last_subject", "first_after", "further", "last")


def _n_layers(model, what: str = "causal tracing") -> int:
    n = getattr(model, "n_layers", None)
    if n is None or not hasattr(model, "final_logits"):
        raise TypeError(f"{type(model).__name__} has no n_layers: {what} needs a hooked model with "
                        "n_layers and final_logits (a LanguageModel or a FactModel)")
    return int(n)


def check_options(model, kind: str, corruption: str, metric: str, window: int, sever: str | None) -> None:
    """ValueError naming the bad value and what is allowed."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: allowed {', '.join(KINDS)}")
    if corruption not in CORRUPTIONS:
        raise ValueError(f"corruption {corruption!r}: allowed {', '.join(CORRUPTIONS)}")
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r}: allowed {', '.join(METRICS)}")
    if metric == "logit_diff" and corruption != "replace":
        raise ValueError("metric 'logit_diff' needs corruption 'replace' (the corrupted runs' own answers)")
    if sever is not None and (sever not in SEVER or kind != "state"):
        raise ValueError(f"sever {sever!r}: allowed {', '.join(SEVER)}, with kind 'state'")
    L = _n_layers(model)
    if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= L:
        raise ValueError(f"window {window!r}: must be an integer in 1..{L} (the model's {L} layers)")


def window_layers(layer: int, window: int, n_layers: int) -> list[int]:
    """The layers a window restoration around ``layer`` covers (the authors' rule)."""
    return list(range(max(0, layer - window // 2), min(n_layers, layer - (-window // 2))))


def default_window(n_layers: int) -> int:
    """10 of GPT-2 XL's 48 layers, scaled to the depth (at least 1)."""
    return max(1, round(10 * n_layers / 48))


@torch.no_grad()
def noise_scale(model, tokens: list[torch.Tensor], spans: list[tuple[int, int]], factor: float = 3.0) -> float:
    """``factor`` x the standard deviation of the subject tokens' embeddings at ``hook_embed`` (all coordinates
    of all subject tokens of these queries pooled, as the authors measure it)."""
    vals = []
    for toks, (s0, s1) in zip(tokens, spans):
        def grab(x, hook=None, s0=s0, s1=s1):
            vals.append(x[0, s0:s1 + 1].detach().float().reshape(-1).cpu())
            raise StopForward  # only the embedding is needed: no block runs
        try:
            model.run_with_hooks(toks[None].to(model_device(model)), fwd_hooks=[(hooks.embed(), grab)])
        except StopForward:
            pass
    return float(factor * torch.cat(vals).std())


@dataclass(frozen=True)
class FactTrace:
    """One query's trace: ``scores[t, k]`` at token ``t`` and layer ``layers[k]``."""

    index: int  # the query's index in the probe set
    target: int  # the clean run's top-1 token
    subject: tuple[int, int]  # first and last subject token
    answer_pos: int
    clean: float  # the metric on the clean run
    corrupt: float  # the metric averaged over the corrupted runs
    scores: np.ndarray = field(repr=False)  # (answer_pos + 1, n_layers_traced)

    def buckets(self) -> np.ndarray:
        """(6, n_layers_traced): the mean score of each bucket's tokens (NaN: empty bucket)."""
        s0, s1 = self.subject
        a = self.answer_pos
        groups = [[s0], list(range(s0 + 1, s1)), [s1], [s1 + 1] if s1 + 1 <= a else [], list(range(s1 + 2, a)),
                  [a]]
        return np.stack([self.scores[g].mean(0) if g else np.full(self.scores.shape[1], np.nan) for g in groups])


@dataclass(frozen=True)
class TraceResult(Result):
    """Traces of many queries with one setting; ``layers``: the traced layers (``-1``: the embedding)."""

    kind: str
    corruption: str
    metric: str
    window: int
    sever: str | None
    layers: tuple[int, ...]
    noise: float | None  # nu (noise corruption)
    facts: tuple[FactTrace, ...]

    def indirect_effects(self) -> np.ndarray:
        """(n_facts, 6 buckets, n_layers): restored minus corrupted score."""
        if not self.facts:
            return np.zeros((0, len(BUCKETS), len(self.layers)))
        return np.stack([f.buckets() - f.corrupt for f in self.facts])

    @property
    def total_effect(self) -> np.ndarray:
        return np.array([f.clean - f.corrupt for f in self.facts])

    def summary(self, seed: int = 0) -> dict:
        """Average indirect effect per bucket and layer with 95% bootstrap intervals over facts, the average total
        effect, and the peak cell of the last-subject-token and last-token buckets."""
        ie = self.indirect_effects()
        out = {"n_facts": len(self.facts), **stats.fields("total_effect", stats.bootstrap(self.total_effect,
                                                                                       seed=seed)),
               "clean": float(np.mean([f.clean for f in self.facts])) if self.facts else None,
               "corrupt": float(np.mean([f.corrupt for f in self.facts])) if self.facts else None}
        aie = {}
        for b, name in enumerate(BUCKETS):
            rows = []
            for k, layer in enumerate(self.layers):
                v = ie[:, b, k]
                v = v[np.isfinite(v)]
                est = stats.bootstrap(v, seed=seed) if len(v) else None
                rows.append({"layer": layer, "aie": None if est is None else est.value,
                             "aie_ci": None if est is None else [est.low, est.high], "aie_n": int(len(v))})
            aie[name] = rows
            scored = [r for r in rows if r["aie"] is not None]
            if scored:
                peak = max(scored, key=lambda r: r["aie"])
                out[f"peak_{name}"] = {"layer": peak["layer"], "aie": peak["aie"], "aie_ci": peak["aie_ci"]}
        out["aie"] = aie
        return out

    @property
    def records(self) -> list[dict]:
        """One flat row per (fact, bucket, layer): the indirect effect."""
        ie = self.indirect_effects()
        return [{"fact": f.index, "bucket": name, "layer": layer, "indirect_effect": _f(ie[i, b, k]),
                 "kind": self.kind, "corruption": self.corruption, "metric": self.metric}
                for i, f in enumerate(self.facts) for b, name in enumerate(BUCKETS)
                for k, layer in enumerate(self.layers)]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "corruption": self.corruption, "metric": self.metric, "window": self.window,
                "sever": self.sever, "layers": list(self.layers), "noise": self.noise,
                "facts": [{"index": f.index, "target": f.target, "subject": list(f.subject),
                           "answer_pos": f.answer_pos, "clean": f.clean, "corrupt": f.corrupt,
                           "scores": np.round(f.scores, 6).tolist()} for f in self.facts]}


def _f(x) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


class _Restorer:
    """Hooks for one batch: writes (rows, position) <- values at named hook points, stops after the last block
    and keeps the answer position's residual state."""

    def __init__(self, answer_pos: int, last_hook: str):
        self.sets: dict[str, list[tuple[int, int, int, torch.Tensor]]] = {}
        self.answer_pos, self.last_hook = answer_pos, last_hook
        self.final = None

    def add(self, name: str, r0: int, r1: int, pos: int, values: torch.Tensor) -> None:
        self.sets.setdefault(name, []).append((r0, r1, pos, values))

    def apply(self, name: str, x: torch.Tensor) -> torch.Tensor:
        for r0, r1, pos, v in self.sets.get(name, ()):
            if r0 < x.shape[0]:  # (a suffix run's rows grow as its cells join: later ones are not there yet)
                x[r0:r1, pos] = v.to(x.dtype)
        return x

    def hooks(self, extra=(), skip=()) -> list:
        out = list(extra)
        for name in set(self.sets) - {self.last_hook} - set(skip):
            out.append((name, lambda x, hook=None, name=name: self.apply(name, x)))

        def stop(x, hook=None):
            x = self.apply(self.last_hook, x)
            self.final = x[:, self.answer_pos].clone()
            raise StopForward
        return out + [(self.last_hook, stop)]


def _run(model, tokens: torch.Tensor, restorer: _Restorer, extra=()) -> torch.Tensor:
    """Logits (rows, vocab) at the answer position."""
    try:
        model.run_with_hooks(tokens, fwd_hooks=restorer.hooks(extra))
    except StopForward:
        pass
    return model.final_logits(restorer.final).float()


@contextlib.contextmanager
def _blocks_from(model, first: int):
    """Run only blocks ``first..L-1``. A bridge's ``start_at_layer`` still runs the blocks before ``first`` and
    discards their output; here the decoder's layer list is cut to the suffix for the duration (each layer keeps
    its own index; the per-cell reference test checks the scores). Not on a decoder whose layers differ in type
    (e.g. Gemma-3's sliding and full attention layers): its forward hands layer ``i`` of the list the mask and
    rotary embedding of type ``i``, so there the earlier blocks run (and are discarded) instead."""
    owner, name, layers = None, None, _block_list(model)
    types = getattr(getattr(getattr(getattr(model, "bridge", None), "original_model", None), "config", None),
                    "layer_types", None)
    if types is not None and len(set(types)) > 1:
        # the decoder picks each layer's mask and rotary embedding by its place in the list (Gemma-3's sliding /
        # full layers): a cut list would hand block k the arguments of block k - first
        layers = None
    if layers is not None and first > 0:
        hf = model.bridge.original_model
        for mod in hf.modules():
            for n, child in mod.named_children():
                if child is layers:
                    owner, name = mod, n
    if owner is None:
        yield
        return
    setattr(owner, name, torch.nn.ModuleList(list(layers)[first:]))
    try:
        yield
    finally:
        setattr(owner, name, layers)


def _run_from(model, resid: torch.Tensor, layer: int, restorer: _Restorer, start_hook: str) -> torch.Tensor:
    """Logits at the answer position of a run that starts from ``resid``, the residual stream after block
    ``layer`` (the restorations at ``start_hook``, that very state, already written into it): only the blocks
    after ``layer`` run (``start_at_layer``)."""
    resid = restorer.apply(start_hook, resid)
    if layer + 1 == _n_layers(model):
        return model.final_logits(resid[:, restorer.answer_pos]).float()
    try:
        with _blocks_from(model, layer + 1):
            model.run_with_hooks(resid, start_at_layer=layer + 1, fwd_hooks=restorer.hooks(skip=[start_hook]))
    except StopForward:
        pass
    return model.final_logits(restorer.final).float()


def answer_position(tokens: torch.Tensor, subject: tuple[int, int]) -> int:
    """The answer position of a query (its last token); ValueError unless the subject lies before it."""
    s0, s1 = subject
    a = tokens.shape[0] - 1
    if not 0 <= s0 <= s1 < a:
        raise ValueError(f"subject tokens {s0}..{s1} must lie inside the prompt before its last token "
                         f"(positions 0..{a - 1})")
    return a


def corrupted_inputs(tokens: torch.Tensor, subject: tuple[int, int], d_model: int, *, corruption: str,
                     noise: float | None, n_draws: int, replacements: torch.Tensor | None, seed: int,
                     index: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(rows of corrupted prompts, the noise added to their subject embeddings or None): ``noise`` -- the prompt
    ``n_draws`` times and (n_draws, subject length, d_model) Gaussian draws of scale ``noise``, seeded by the query
    ``index``; ``replace`` -- the replacement prompts, unchanged."""
    n = tokens.shape[0]
    s0, s1 = subject
    if corruption == "noise":
        if noise is None:
            raise ValueError("corruption 'noise' needs noise (nu); see noise_scale")
        g = torch.Generator().manual_seed(derive_seed(seed, "probes.tracing.noise", index))
        return tokens[None].expand(n_draws, n), torch.randn(n_draws, s1 - s0 + 1, d_model, generator=g) * noise
    if replacements is None or replacements.ndim != 2 or replacements.shape[1] != n:
        raise ValueError(f"corruption 'replace' needs replacements of shape (K, {n}): prompts with the subject "
                         f"swapped for another of the same token length")
    return replacements.to(tokens.device), None


@torch.no_grad()
def trace_query(model, tokens: torch.Tensor, subject: tuple[int, int], *, kind: str = "state",
                corruption: str = "noise", metric: str = "prob", window: int = 1, sever: str | None = None,
                noise: float | None = None, n_draws: int = 10, replacements: torch.Tensor | None = None,
                seed: int = 0, batch_rows: int = 256, index: int = 0, layers: list[int] | None = None,
                exclude: tuple[int, ...] = (), progress: bool = False, suffix: bool = True) -> FactTrace:
    """One query's trace (module docstring). ``tokens``: (n,) the clean prompt, its last token the answer
    position; ``subject``: (first, last) subject token; ``replacements``: (K, n) corrupted prompts (``replace``);
    ``noise``: nu (``noise``); ``layers``: the layers traced (default all; ``-1``, the embedding, with
    ``state``); ``exclude``: layers whose MLP / attention output a window restoration never copies back (``(0,)``:
    the MLP-0-excluded check -- a window that holds only excluded layers restores nothing); ``suffix``: on a
    bridge, restored runs compute only the tokens and blocks a restoration can change
    (:mod:`mechfact.probes.trace_suffix`; ``False``: every token of every block after the first difference)."""
    dev = model_device(model)
    L = _n_layers(model)
    tokens = tokens.to(dev)
    n = tokens.shape[0]
    s0, s1 = subject
    a = answer_position(tokens, subject)
    last_hook = hooks.resid(L - 1, "post")
    # clean run: the states restorations copy back
    names = {"state": [hooks.embed()] + [hooks.resid(l, "post") for l in range(L)],
             "mlp": [hooks.mlp_out(l) for l in range(L)], "attn": [hooks.attn_out(l) for l in range(L)]}[kind]
    fast = Suffix.of(model) if suffix else None
    with fast.recording("clean") if fast else contextlib.nullcontext():
        logits, cache = model.run_with_cache(tokens[None], names_filter=lambda nm: nm in names)
    if fast is not None and not fast.usable:
        fast = None
    clean_logits = logits[0, a].float()
    y = int(clean_logits.argmax())
    # corrupted runs
    base, eps = corrupted_inputs(tokens, subject, cache[names[0]].shape[-1], corruption=corruption, noise=noise,
                                 n_draws=n_draws, replacements=replacements, seed=seed, index=index)
    D = base.shape[0]

    def noise_hook(rows: int):
        if eps is None:
            return []
        e = eps.to(dev).repeat(rows // D, 1, 1)

        def fn(x, hook=None):
            x[:, s0:s1 + 1] = x[:, s0:s1 + 1] + e.to(x.dtype)
            return x
        return [(hooks.embed(), fn)]

    # one pass of the corrupted runs: their residual stream after every block (where restored runs start; the last
    # block's gives their logits) and, to sever, their MLP / attention outputs
    sn = [hooks.resid(l, "post") for l in range(L)]
    if sever is not None:
        sn += [hooks.mlp_out(l) if sever == "mlp" else hooks.attn_out(l) for l in range(L)]
    box = {}

    def grab(name):  # keyed by the name asked for (a bridge reports an alias's canonical name)
        def fn(x, hook=None):
            box[name] = x.detach().clone()
            if name == last_hook and all(nm in box for nm in sn):
                raise StopForward  # nothing after the last block is needed
            return x
        return fn
    try:
        with fast.recording("corrupt") if fast else contextlib.nullcontext():
            model.run_with_hooks(base, fwd_hooks=noise_hook(D) + [(nm, grab(nm)) for nm in sn])
    except StopForward:
        pass
    corrupt_logits = model.final_logits(box[last_hook][:, a]).float()

    def score(lg: torch.Tensor, rows: int) -> torch.Tensor:  # (rows,) metric per row
        if metric == "prob":
            return torch.softmax(lg, -1)[:, y]
        own = corrupt_logits.argmax(-1).repeat(rows // D)
        return lg[:, y] - lg.gather(1, own[:, None].to(lg.device))[:, 0]

    corrupt = float(score(corrupt_logits, D).mean())
    clean = float(torch.softmax(clean_logits, -1)[y]) if metric == "prob" else float(
        (clean_logits[y] - clean_logits[corrupt_logits.argmax(-1)]).mean())
    layers = traced_layers(L, kind, layers)
    scores = np.full((n, len(layers)), corrupt)
    if kind != "state" and exclude:
        bad = [l for l in exclude if not 0 <= l < L]
        if bad:
            raise ValueError(f"exclude {bad}: layers must lie in 0..{L - 1}")

    def restored(layer: int) -> list[int]:  # the layers whose outputs a window cell copies back
        return [l2 for l2 in window_layers(layer, window, L) if l2 not in exclude]

    def first_block(k: int) -> int:  # the block after which a cell's run first differs from the corrupted run
        return layers[k] if kind == "state" else restored(layers[k])[0] - 1

    def start(k: int) -> str:  # that state's hook
        return hooks.embed() if first_block(k) < 0 else hooks.resid(first_block(k), "post")

    # a window whose layers are all excluded restores nothing: its cells keep the corrupted score
    cells = sorted(((t, k) for t in range(s0, n) for k in range(len(layers))
                    if kind == "state" or restored(layers[k])), key=lambda c: (c[1], c[0]))
    per = max(1, batch_rows // D)
    if fast is not None:
        for t, chunk, s in _suffix_scores(fast, cells, per, first_block, kind, sever, layers, restored, names, cache, box,
                                          a, L, D, lambda lg, rows: score(lg, rows), progress):
            for c, k in enumerate(chunk):
                scores[t, k] = s[c]
        cells = []
    chunks = []
    for c in cells:  # cells with the same first difference share a batch
        if chunks and len(chunks[-1]) < per and start(chunks[-1][0][1]) == start(c[1]):
            chunks[-1].append(c)
        else:
            chunks.append([c])
    for chunk in tqdm(chunks, desc="trace", leave=False, disable=not progress):
        rows = len(chunk) * D
        rs = _Restorer(a, last_hook)
        for c, (t, k) in enumerate(chunk):
            r0, r1 = c * D, (c + 1) * D
            layer = layers[k]
            if kind == "state":
                name = hooks.embed() if layer < 0 else hooks.resid(layer, "post")
                rs.add(name, r0, r1, t, cache[name][0, t])
                if sever is not None:
                    for l2 in range(layer + 1, L):
                        nm = hooks.mlp_out(l2) if sever == "mlp" else hooks.attn_out(l2)
                        rs.add(nm, r0, r1, t, box[nm][:, t])
            else:
                for l2 in restored(layer):
                    nm = names[l2]
                    rs.add(nm, r0, r1, t, cache[nm][0, t])
        first = start(chunk[0][1])
        if first == hooks.embed():  # the whole run differs: every block runs on every row
            lg = _run(model, base.repeat(len(chunk), 1), rs, noise_hook(rows))
        else:  # from the corrupted runs' state after the block before the first restored piece
            layer = int(first.split(".")[1])
            lg = _run_from(model, box[first].repeat(len(chunk), 1, 1), layer, rs, first)
        s = score(lg, rows).view(len(chunk), D).mean(1).cpu().numpy()
        for c, (t, k) in enumerate(chunk):
            scores[t, k] = s[c]
    return FactTrace(index=index, target=y, subject=(s0, s1), answer_pos=a, clean=clean, corrupt=corrupt,
                     scores=scores)


def _suffix_scores(fast: Suffix, cells, per, first, kind, sever, layers, restored, names, cache, box, a, L, D, score,
                   progress):
    """The restored runs on the fast path: per token ``t``, its cells sorted by the block where they start, ``per``
    cells a batch; yields (t, the batch's layer indices, their scores)."""
    by_t: dict[int, list[int]] = {}
    for t, k in cells:
        by_t.setdefault(t, []).append(k)
    batches = [(t, ks[i:i + per]) for t, ks in by_t.items()
               for ks in [sorted(ks, key=first)] for i in range(0, len(ks), per)]
    for t, chunk in tqdm(batches, desc="trace", leave=False, disable=not progress):
        rs = _Restorer(a, "")
        init = []
        for c, k in enumerate(chunk):
            r0, r1 = c * D, (c + 1) * D
            s = first(k)
            x = (fast.entry["corrupt"] if s < 0 else box[hooks.resid(s, "post")])[:, t:].clone()
            if kind == "state":  # the restored state itself is where the cell's run starts
                x[:, 0] = (fast.entry["clean"] if s < 0 else cache[hooks.resid(s, "post")])[0, t].to(x.dtype)
                if sever is not None:
                    for l2 in range(layers[k] + 1, L):
                        nm = hooks.mlp_out(l2) if sever == "mlp" else hooks.attn_out(l2)
                        rs.add(nm, r0, r1, 0, box[nm][:, t])
            else:
                for l2 in restored(layers[k]):
                    rs.add(names[l2], r0, r1, 0, cache[names[l2]][0, t])
            init.append(x)
        fwd = [(nm, lambda x, hook=None, nm=nm: rs.apply(nm, x)) for nm in rs.sets]
        final = fast.run(t, [first(k) for k in chunk], init, fwd, a)
        rows = len(chunk) * D
        yield t, chunk, score(fast.model.final_logits(final).float(), rows).view(len(chunk), D).mean(1).cpu().numpy()


def traced_layers(n_layers: int, kind: str, layers: list[int] | None = None) -> list[int]:
    """The layers a trace covers: ``layers`` checked, or every layer (and ``-1``, the embedding, for ``state``)."""
    every = ([-1] if kind == "state" else []) + list(range(n_layers))
    if layers is None:
        return every
    bad = [l for l in layers if l not in every]
    if bad or not layers:
        raise ValueError(f"layers {bad or layers}: allowed {every[0]}..{n_layers - 1} for kind {kind!r}"
                         + (" (-1: the embedding)" if kind == "state" else ""))
    return sorted(set(int(l) for l in layers))


def causal_trace_queries(model, queries: list[dict], *, kind: str = "state", corruption: str = "noise",
                         metric: str = "prob", window: int | None = None, sever: str | None = None,
                         noise: float | None = None, noise_factor: float = 3.0, n_draws: int = 10, seed: int = 0,
                         batch_rows: int = 256, layers: list[int] | None = None, exclude: tuple[int, ...] = (),
                         progress: bool = False, suffix: bool = True) -> TraceResult:
    """:func:`trace_query` over ``queries`` (dicts with ``tokens`` (n,), ``subject`` (first, last), and for
    ``replace`` ``replacements`` (K, n)); ``noise`` defaults to :func:`noise_scale` over the queries."""
    L = _n_layers(model)
    window = default_window(L) if window is None else window
    check_options(model, kind, corruption, metric, window, sever)
    traced_layers(L, kind, layers)
    if not queries:
        raise ValueError("no queries to trace (no known facts?)")
    if corruption == "noise" and noise is None:
        noise = noise_scale(model, [q["tokens"] for q in queries], [q["subject"] for q in queries], noise_factor)
    facts = []
    for i, q in enumerate(tqdm(queries, desc=f"trace {kind}", disable=not progress)):
        facts.append(trace_query(model, q["tokens"], tuple(q["subject"]), kind=kind, corruption=corruption,
                                 metric=metric, window=window, sever=sever, noise=noise, n_draws=n_draws,
                                 replacements=q.get("replacements"), seed=seed, batch_rows=batch_rows,
                                 index=q.get("index", i), layers=layers, exclude=tuple(exclude), suffix=suffix))
    layers = traced_layers(L, kind, layers)
    return TraceResult(kind=kind, corruption=corruption, metric=metric, window=window, sever=sever,
                       layers=tuple(layers), noise=noise if corruption == "noise" else None, facts=tuple(facts))


def fact_queries(ps, index=None) -> list[dict]:
    """Queries of a :class:`~mechfact.probes.queries.ProbeSet` (each cut at its answer position)."""
    idx = range(len(ps)) if index is None else index
    first = ps.positions("subject_first")
    return [{"tokens": ps.tokens[i, :int(ps.answer_pos[i]) + 1], "subject": (int(first[i]), int(ps.subject_pos[i])),
             "index": int(i)} for i in idx]


__all__ = ["KINDS", "SEVER", "CORRUPTIONS", "METRICS", "BUCKETS", "FactTrace", "TraceResult", "trace_query",
           "causal_trace_queries", "fact_queries", "noise_scale", "corrupted_inputs", "answer_position", "window_layers", "default_window", "traced_layers"]

