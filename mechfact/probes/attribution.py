"""Attribution patching (AtP; Nanda 2023, Kramar et al. 2024): a gradient estimate of every activation patch of a
causal trace (:mod:`.tracing`) from two forward passes and one backward pass per query.

Exact patching (:func:`.tracing.trace_query`) runs the corrupted prompt again for every (token, layer) cell with
the clean activation copied back there, and scores the metric. AtP replaces each of those runs by the first-order
Taylor expansion of the metric ``m`` around the corrupted run::

    m(restore a_clean at site s) - m(corrupted)  ~  (a_clean(s) - a_corrupt(s)) . dm/da(s)  [at the corrupted run]

Per query (the query format, the sites, the corruption and the metric are those of :mod:`.tracing`):

1. **Clean run** (with cache): the clean activations at every site and the target ``y`` (the clean top-1).
2. **Corrupted run** (with cache, gradients on): all corrupted runs in one batch -- ``noise``: the ``n_draws``
   Gaussian draws of :func:`.tracing.trace_query`, the very same ones (same ``seed`` and query ``index``), added
   to the subject embeddings at ``hook_embed``; ``replace``: one row per replacement prompt. The metric at the
   answer position of each row (``prob``: p(y); ``logit_diff``: logit y minus the logit of the row's own top-1,
   ``replace`` only), as in tracing.
3. **Backward pass**: the gradient of the summed per-row metric with respect to every site's activation (rows
   are independent, so each row gets its own gradient); no parameter accumulates ``.grad``.
4. **Estimate** of cell (t, l): ``(a_clean[t] - a_corrupt[row, t]) . grad[row, t]`` averaged over the rows
   (draws or replacements), i.e. the estimate of tracing's indirect effect ``score(restored) - score(corrupted)``.

Sites and cells are those of a trace with ``window = 1``: ``state`` -- the residual stream after block ``l``
(``l = -1``: the embedding); ``mlp`` / ``attn`` -- the MLP / attention output of the single layer ``l``. AtP
estimates single-site patches; a window restores several sites at once, and the sum of their single-site
estimates is the linear estimate of that too, but the comparison here (:func:`atp_agreement`) is with exact
single-layer patching. Tokens before the subject's first token have the same activations in the clean and
corrupted runs: their estimate is exactly 0 (exact patching gives exactly 0 there too).

The approximation is exact where the metric is linear in the patched activation (e.g. ``logit_diff`` at the last
block's output of a model without a final norm) and worst where something saturates: with ``prob``, a corrupted
run whose p(y) sits near 0 or 1 has a vanishing gradient, so large restorations are underestimated (the same
mechanism as the attention-saturation failure Kramar et al. describe inside the model). :func:`atp_agreement` runs
both methods on the same queries, draws and metric and reports how well AtP ranks the cells exact patching ranks
(Spearman's rho per prompt, the top-k overlap) and the time each took.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import hooks, stats
from ..results import Result
from . import tracing
from .queries import logits_of, model_device

TOP_K = 10
TIE_TOL = 1e-6  # relative: effects closer than this are ties when ranked


def _site_names(kind: str, layers: list[int]) -> list[str]:
    if kind == "state":
        return [hooks.embed() if l < 0 else hooks.resid(l, "post") for l in layers]
    return [hooks.mlp_out(l) if kind == "mlp" else hooks.attn_out(l) for l in layers]


def check_options(model, kind: str, corruption: str, metric: str) -> None:
    """ValueError naming the bad value and what is allowed (the options of :func:`.tracing.check_options`)."""
    tracing.check_options(model, kind, corruption, metric, 1, None)


def attribute_query(model, tokens: torch.Tensor, subject: tuple[int, int], *, kind: str = "state",
                    corruption: str = "noise", metric: str = "prob", noise: float | None = None, n_draws: int = 10,
                    replacements: torch.Tensor | None = None, seed: int = 0, index: int = 0,
                    layers: list[int] | None = None) -> tracing.FactTrace:
    """One query's attribution patching (module docstring): a :class:`~.tracing.FactTrace` whose ``scores[t, k]``
    are the ESTIMATED INDIRECT EFFECTS (not restored scores) at token ``t`` and layer ``layers[k]``; ``clean`` and
    ``corrupt`` are the measured metric of the clean and corrupted runs. Arguments as :func:`.tracing.trace_query`.
    """
    dev = model_device(model)
    L = tracing._n_layers(model)
    tokens = tokens.to(dev)
    n = tokens.shape[0]
    s0, s1 = subject
    a = tracing.answer_position(tokens, subject)
    layers = tracing.traced_layers(L, kind, layers)
    names = _site_names(kind, layers)
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens[None], names_filter=lambda nm: nm in names)
    clean_logits = logits_of(logits)[0, a].float()
    y = int(clean_logits.argmax())
    base, eps = tracing.corrupted_inputs(tokens, (s0, s1), cache[names[0]].shape[-1], corruption=corruption,
                                         noise=noise, n_draws=n_draws, replacements=replacements, seed=seed,
                                         index=index)
    acts: dict[str, torch.Tensor] = {}

    def embed_hook(x, hook=None):
        x = x.detach().clone()
        if eps is not None:
            x[:, s0:s1 + 1] = x[:, s0:s1 + 1] + eps.to(x.device, x.dtype)
        x.requires_grad_(True)
        if hooks.embed() in names:
            acts[hooks.embed()] = x
        return x

    def keep(name):
        def fn(x, hook=None):
            acts[name] = x
            return x
        return fn

    fwd = [(hooks.embed(), embed_hook)] + [(nm, keep(nm)) for nm in names if nm != hooks.embed()]
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        for p in params:
            p.requires_grad_(False)
        with torch.enable_grad():
            lg = logits_of(model.run_with_hooks(base, fwd_hooks=fwd))[:, a].float()
            own = lg.detach().argmax(-1)
            if metric == "prob":
                m = torch.softmax(lg, -1)[:, y]
            else:
                m = lg[:, y] - lg.gather(1, own[:, None])[:, 0]
            missing = [nm for nm in names if nm not in acts or not acts[nm].requires_grad]
            if missing:
                raise RuntimeError(f"no gradient reaches the hook point(s) {missing}: attribution patching needs "
                                   "hooks whose returned tensors the forward pass uses")
            grads = torch.autograd.grad(m.sum(), [acts[nm] for nm in names], allow_unused=True)
    finally:
        for p in params:
            p.requires_grad_(True)
    corrupt = float(m.detach().mean())
    clean = float(torch.softmax(clean_logits, -1)[y]) if metric == "prob" else float(
        (clean_logits[y] - clean_logits[own]).mean())
    scores = np.zeros((n, len(layers)))
    for k, nm in enumerate(names):
        if grads[k] is None:  # the site does not reach the answer position's logits
            continue
        diff = cache[nm][0, s0:].float()[None] - acts[nm].detach()[:, s0:].float()
        est = (diff * grads[k][:, s0:].float()).sum(-1).mean(0)
        scores[s0:, k] = est.cpu().numpy()
    return tracing.FactTrace(index=index, target=y, subject=(s0, s1), answer_pos=a, clean=clean, corrupt=corrupt,
                             scores=scores)


@dataclass(frozen=True)
class AttributionResult(Result):
    """Attribution patching of many queries with one setting; ``layers``: the layers (``-1``: the embedding).

    ``facts[i].scores[t, k]``: the estimated indirect effect of restoring the clean activation at token ``t``,
    layer ``layers[k]`` (the quantity :class:`~.tracing.TraceResult` gets by restoring and subtracting the
    corrupted score); ``clean`` / ``corrupt``: the measured metric."""

    kind: str
    corruption: str
    metric: str
    layers: tuple[int, ...]
    noise: float | None  # nu (noise corruption)
    n_draws: int | None  # noise draws per query (noise corruption)
    facts: tuple[tracing.FactTrace, ...]

    @property
    def scores(self) -> list[np.ndarray]:
        """Per fact, (answer_pos + 1, n_layers) estimated indirect effects."""
        return [f.scores for f in self.facts]

    def indirect_effects(self) -> np.ndarray:
        """(n_facts, 6 buckets, n_layers): the estimated indirect effect per ROME bucket (NaN: empty bucket)."""
        if not self.facts:
            return np.zeros((0, len(tracing.BUCKETS), len(self.layers)))
        return np.stack([f.buckets() for f in self.facts])

    def as_trace(self) -> tracing.TraceResult:
        """The estimates as a window-1 :class:`~.tracing.TraceResult` (scores = corrupted score + estimate), for
        whatever reads or plots traces."""
        facts = tuple(tracing.FactTrace(index=f.index, target=f.target, subject=f.subject, answer_pos=f.answer_pos,
                                        clean=f.clean, corrupt=f.corrupt, scores=f.corrupt + f.scores)
                      for f in self.facts)
        return tracing.TraceResult(kind=self.kind, corruption=self.corruption, metric=self.metric, window=1,
                                   sever=None, layers=self.layers, noise=self.noise, facts=facts)

    def summary(self, seed: int = 0) -> dict:
        """As :meth:`.tracing.TraceResult.summary` (``aie``: the mean ESTIMATED indirect effect per bucket and
        layer with 95% bootstrap intervals over facts; ``total_effect``: measured), plus ``method``."""
        return {"method": "attribution_patching", **self.as_trace().summary(seed=seed)}

    @property
    def records(self) -> list[dict]:
        """One flat row per (fact, bucket, layer): the estimated indirect effect."""
        ie = self.indirect_effects()
        return [{"fact": f.index, "bucket": name, "layer": layer, "estimate": tracing._f(ie[i, b, k]),
                 "kind": self.kind, "corruption": self.corruption, "metric": self.metric}
                for i, f in enumerate(self.facts) for b, name in enumerate(tracing.BUCKETS)
                for k, layer in enumerate(self.layers)]

    def to_dict(self) -> dict:
        return {"method": "attribution_patching", "kind": self.kind, "corruption": self.corruption,
                "metric": self.metric, "window": 1, "layers": list(self.layers), "noise": self.noise,
                "n_draws": self.n_draws,
                "facts": [{"index": f.index, "target": f.target, "subject": list(f.subject),
                           "answer_pos": f.answer_pos, "clean": f.clean, "corrupt": f.corrupt,
                           "estimates": np.round(f.scores, 6).tolist()} for f in self.facts]}


def _prepare(model, queries: list[dict], kind: str, corruption: str, metric: str, noise: float | None,
             noise_factor: float, layers: list[int] | None) -> float | None:
    check_options(model, kind, corruption, metric)
    tracing.traced_layers(tracing._n_layers(model), kind, layers)
    if not queries:
        raise ValueError("no queries to attribute (no known facts?)")
    if corruption == "noise" and noise is None:
        noise = tracing.noise_scale(model, [q["tokens"] for q in queries], [q["subject"] for q in queries],
                                    noise_factor)
    return noise if corruption == "noise" else None


def attribution_patching(model, queries: list[dict], *, kind: str = "state", corruption: str = "noise",
                         metric: str = "prob", noise: float | None = None, noise_factor: float = 3.0,
                         n_draws: int = 10, seed: int = 0, layers: list[int] | None = None,
                         progress: bool = False) -> AttributionResult:
    """Attribution patching (module docstring) of ``queries`` (the dicts of :func:`.tracing.causal_trace_queries`:
    ``tokens`` (n,), ``subject`` (first, last), optional ``index``, and for ``replace`` ``replacements`` (K, n)).
    ``noise`` defaults to :func:`.tracing.noise_scale` over the queries; ``layers``: default all (and ``-1``, the
    embedding, with ``state``). The sites are single layers (a window of 1)."""
    noise = _prepare(model, queries, kind, corruption, metric, noise, noise_factor, layers)
    facts = []
    for i, q in enumerate(tqdm(queries, desc=f"atp {kind}", disable=not progress)):
        facts.append(attribute_query(model, q["tokens"], tuple(q["subject"]), kind=kind, corruption=corruption,
                                     metric=metric, noise=noise, n_draws=n_draws, replacements=q.get("replacements"),
                                     seed=seed, index=q.get("index", i), layers=layers))
    return AttributionResult(kind=kind, corruption=corruption, metric=metric,
                             layers=tuple(tracing.traced_layers(tracing._n_layers(model), kind, layers)), noise=noise,
                             n_draws=n_draws if corruption == "noise" else None, facts=tuple(facts))


def _snap(x: np.ndarray, tol: float) -> np.ndarray:
    """``x`` on a grid of ``tol`` x its largest magnitude: values that differ by rounding error become ties."""
    scale = float(np.abs(x).max()) if x.size else 0.0
    return x if tol <= 0 or scale == 0 else np.round(x / (tol * scale))


def rank_correlation(x: np.ndarray, y: np.ndarray, tol: float = 0.0) -> float:
    """Spearman's rho (average ranks for ties); NaN when either side is constant or has fewer than 2 values.
    ``tol`` > 0: values of one side within ``tol`` x its largest magnitude of each other count as ties (exact
    patching gives equal effects -- e.g. restoring a whole prompt's corrupted information at two places --
    that differ only by floating-point error, which would otherwise decide their order)."""
    from scipy.stats import rankdata

    x, y = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if x.shape != y.shape:
        raise ValueError(f"rank_correlation: {x.size} values against {y.size}")
    if x.size < 2:
        return float("nan")
    rx, ry = rankdata(_snap(x, tol)), rankdata(_snap(y, tol))
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def top_k_overlap(estimate: np.ndarray, exact: np.ndarray, k: int = TOP_K) -> float:
    """The fraction of the exact top-``k`` cells (largest indirect effect, ``k`` capped at the number of cells)
    that are also in the estimate's top-``k``."""
    estimate, exact = np.asarray(estimate, dtype=float).ravel(), np.asarray(exact, dtype=float).ravel()
    k = min(k, exact.size)
    if k == 0:
        return float("nan")
    a = set(np.argsort(-estimate, kind="stable")[:k].tolist())
    b = set(np.argsort(-exact, kind="stable")[:k].tolist())
    return len(a & b) / k


@dataclass(frozen=True)
class Agreement(Result):
    """AtP against exact single-layer patching on the same queries, draws and metric. Per prompt, over its cells
    from the subject's first token on (the cells before it are exactly 0 in both): ``spearman`` (rho; NaN where
    one side is constant) and ``top_k`` (:func:`top_k_overlap`)."""

    atp: AttributionResult
    exact: tracing.TraceResult
    spearman: np.ndarray  # (n_facts,)
    top_k: np.ndarray  # (n_facts,)
    k: int
    seconds_atp: float
    seconds_exact: float
    threads: int  # torch threads both ran with

    @property
    def records(self) -> list[dict]:
        """One row per fact: its query index, rho and top-k overlap."""
        return [{"index": f.index, "spearman": tracing._f(r), f"top{self.k}_overlap": tracing._f(t)}
                for f, r, t in zip(self.atp.facts, self.spearman, self.top_k)]

    @property
    def speedup(self) -> float:
        """Exact patching's time over AtP's."""
        return self.seconds_exact / self.seconds_atp if self.seconds_atp > 0 else float("inf")

    def pairs(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per fact, (estimated, exact) indirect effects of the compared cells (flattened)."""
        out = []
        for fa, fe in zip(self.atp.facts, self.exact.facts):
            s0 = fa.subject[0]
            out.append((fa.scores[s0:].ravel(), (fe.scores[s0:] - fe.corrupt).ravel()))
        return out

    def summary(self, seed: int = 0) -> dict:
        """Mean Spearman's rho and top-k overlap with 95% bootstrap intervals over prompts, the pooled rho over
        all (prompt, cell) pairs, the largest absolute error, and the times."""
        rho = self.spearman[np.isfinite(self.spearman)]
        top = self.top_k[np.isfinite(self.top_k)]
        est = np.concatenate([p[0] for p in self.pairs()]) if self.atp.facts else np.zeros(0)
        ex = np.concatenate([p[1] for p in self.pairs()]) if self.atp.facts else np.zeros(0)
        return {"kind": self.atp.kind, "corruption": self.atp.corruption, "metric": self.atp.metric,
                "n_facts": len(self.atp.facts),
                **stats.fields("spearman", stats.bootstrap(rho, seed=seed)),
                **stats.fields(f"top{self.k}_overlap", stats.bootstrap(top, seed=seed)),
                "spearman_pooled": rank_correlation(est, ex, TIE_TOL) if est.size else None,
                "max_abs_error": float(np.abs(est - ex).max()) if est.size else None,
                "seconds_atp": self.seconds_atp, "seconds_exact": self.seconds_exact, "speedup": self.speedup,
                "threads": self.threads}

    def to_dict(self, seed: int = 0) -> dict:
        return {**self.summary(seed=seed), "spearman_per_fact": [tracing._f(x) for x in self.spearman],
                "top_k_per_fact": [tracing._f(x) for x in self.top_k], "k": self.k,
                "atp": self.atp.to_dict(), "exact": self.exact.to_dict()}


def atp_agreement(model, queries: list[dict], *, kind: str = "state", corruption: str = "noise",
                  metric: str = "prob", noise: float | None = None, noise_factor: float = 3.0, n_draws: int = 10,
                  seed: int = 0, layers: list[int] | None = None, top_k: int = TOP_K, batch_rows: int = 256,
                  progress: bool = False) -> Agreement:
    """:func:`attribution_patching` and exact patching (:func:`.tracing.causal_trace_queries`, window 1) on the
    same queries, noise scale, draws and metric, timed one after the other with the caller's thread count."""
    noise = _prepare(model, queries, kind, corruption, metric, noise, noise_factor, layers)
    t0 = time.perf_counter()
    atp = attribution_patching(model, queries, kind=kind, corruption=corruption, metric=metric, noise=noise,
                               n_draws=n_draws, seed=seed, layers=layers, progress=progress)
    t1 = time.perf_counter()
    exact = tracing.causal_trace_queries(model, queries, kind=kind, corruption=corruption, metric=metric, window=1,
                                         noise=noise, n_draws=n_draws, seed=seed, batch_rows=batch_rows,
                                         layers=layers, progress=progress)
    t2 = time.perf_counter()
    rho, top = [], []
    for fa, fe in zip(atp.facts, exact.facts):
        s0 = fa.subject[0]
        est, ex = fa.scores[s0:].ravel(), (fe.scores[s0:] - fe.corrupt).ravel()
        rho.append(rank_correlation(est, ex, TIE_TOL))
        top.append(top_k_overlap(est, ex, top_k))
    return Agreement(atp=atp, exact=exact, spearman=np.array(rho), top_k=np.array(top), k=top_k,
                     seconds_atp=t1 - t0, seconds_exact=t2 - t1, threads=torch.get_num_threads())


__all__ = ["AttributionResult", "Agreement", "attribution_patching", "attribute_query", "atp_agreement",
           "rank_correlation", "top_k_overlap", "check_options"]
