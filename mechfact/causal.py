"""The causal experiments with one call on a fact model or a pretrained model: causal tracing
(:mod:`mechfact.probes.tracing`), attention knockout, attribute rate and extraction events
(:mod:`mechfact.probes.knockout`, :mod:`mechfact.probes.extraction`), attribution patching
(:mod:`mechfact.probes.attribution`), subject-state transfer (:mod:`mechfact.probes.state_transfer`) and relation
selectivity (:mod:`mechfact.probes.selectivity`). Those modules do the work on any hooked model; this one turns a
world or relations into the facts they run on.

* a :class:`~mechfact.facts.world.FactWorld` (with its :class:`~mechfact.facts.model.FactModel`): the single-hop
  queries ``[s, r]`` the model answers correctly; ``replace`` swaps in other subjects (one token each);
* relations (a :class:`~mechfact.llm.relations.Relation`, a list, a file or folder; with a
  :class:`~mechfact.llm.models.loading.LanguageModel`): the facts the model knows, zero-shot by default
  (:func:`mechfact.llm.trace.relation_queries`).
"""

from __future__ import annotations

import numpy as np
import torch

from .probes import tracing
from .probes.known import known_indices
from .probes.queries import ProbeSet
from .seeding import derive_seed


def _world_queries(model, world, *, max_facts: int | None, n_replace: int, seed: int,
                   all_known: list | None = None) -> tuple[list[dict], list]:
    ps = ProbeSet.from_world(world)
    right = known_indices(model, ps)
    if all_known is not None:  # every known fact, traced or not (the noise scale is measured over them)
        all_known += [(q["tokens"], q["subject"]) for q in tracing.fact_queries(ps, right)]
    rng = np.random.default_rng(derive_seed(seed, "causal.world"))
    chosen = sorted(rng.permutation(right)[:max_facts].tolist()) if max_facts is not None else right
    queries = tracing.fact_queries(ps, chosen)
    if n_replace:
        for q in queries:
            s = int(q["tokens"][0])
            others = [e for e in rng.permutation(world.n_entities).tolist() if e != s][:n_replace]
            reps = q["tokens"][None].repeat(len(others), 1)
            reps[:, 0] = torch.tensor(others)
            q["replacements"] = reps
    counts = [{"relation": "all", "n_samples": len(ps), "n_known": len(right), "n_traced": len(chosen)}]
    return queries, counts


def trace_queries(model, source, *, corruption: str = "noise", max_facts: int | None = None, k_shot: int = 0,
                  template: int = 0, n_replace: int = 5, seed: int = 0, known: str = "prefix",
                  all_known: list | None = None) -> tuple[list[dict], list[dict]]:
    """(queries, per-relation counts of samples, known and traced facts) of ``source`` for ``model``. ``known``
    (relations): which facts count as known (:func:`mechfact.llm.trace.relation_queries`); ``all_known`` receives
    (tokens, subject span) of every known fact, traced or not."""
    from .facts.world import FactWorld

    reps = n_replace if corruption == "replace" else 0
    if isinstance(source, FactWorld):
        return _world_queries(model, source, max_facts=max_facts, n_replace=reps, seed=seed, all_known=all_known)
    from .llm.trace import relation_queries

    queries, counts = relation_queries(model, source, k_shot=k_shot, template=template, seed=seed,
                                       max_facts=max_facts, n_replace=reps, known=known, all_known=all_known)
    if corruption == "replace":
        queries = [q for q in queries if "replacements" in q]
    return queries, counts


def causal_trace(model, source, *, kind: str = "state", corruption: str = "noise", metric: str = "prob",
                 window: int | None = None, sever: str | None = None, n_draws: int = 10, noise_factor: float = 3.0,
                 max_facts: int | None = None, k_shot: int = 0, template: int = 0, n_replace: int = 5,
                 seed: int = 0, batch_rows: int = 256, known: str = "spells", exclude: tuple[int, ...] = (),
                 progress: bool = False) -> tracing.TraceResult:
    """Causal tracing (Meng et al. 2022) of the facts ``model`` knows in ``source`` (a FactWorld, or relations).

    Relations: a fact is known when the model's top-1 token spells the object (``known="spells"``, the tracing
    authors' setting; ``"prefix"``: the LRE authors' first-token prefix); the noise scale is measured over the
    subjects of EVERY known fact (not only the ``max_facts`` traced). ``exclude``: layers whose MLP / attention
    outputs a window restoration never copies back (``(0,)``: the MLP-0-excluded check).

    ``kind``: ``state`` (the residual stream after each block; ``-1``: the embedding), ``mlp`` or ``attn`` (a
    window of ``window`` layers, default 10 of 48 scaled to the depth); ``sever``: ``mlp`` / ``attn`` with
    ``state`` (the later MLP / attention outputs at the restored token held at their corrupted values);
    ``corruption``: ``noise`` (``n_draws`` Gaussian draws of ``noise_factor`` x the subject embeddings' std)
    or ``replace`` (``n_replace`` other subjects of the same token length); ``metric``: ``prob`` or
    ``logit_diff`` (``replace`` only). ``result.summary()``: the average indirect effects per token bucket and
    layer with bootstrap intervals over facts; ``result.records``: one row per (fact, bucket, layer).
    """
    tracing.check_options(model, kind, corruption, metric,
                          tracing.default_window(tracing._n_layers(model)) if window is None else window, sever)
    every: list = []
    queries, _ = trace_queries(model, source, corruption=corruption, max_facts=max_facts, k_shot=k_shot,
                               template=template, n_replace=n_replace, seed=seed, known=known, all_known=every)
    if not queries:
        raise ValueError("no known facts to trace: the model answers none of the queries correctly"
                         + (" with a same-length replacement subject" if corruption == "replace" else ""))
    noise = tracing.noise_scale(model, [t for t, _ in every], [sp for _, sp in every], noise_factor) \
        if corruption == "noise" else None
    return tracing.causal_trace_queries(model, queries, kind=kind, corruption=corruption, metric=metric,
                                        window=window, sever=sever, noise=noise, noise_factor=noise_factor,
                                        n_draws=n_draws, seed=seed, batch_rows=batch_rows, exclude=exclude,
                                        progress=progress)


# ---- attribute extraction, attribution patching and the geometric-recall tests, with the same sources --------------

def _needs_lm(model, source) -> None:
    if not hasattr(model, "tokenizer"):
        raise ValueError(f"source of type {type(source).__name__} with a {type(model).__name__}: relations need a "
                         "LanguageModel; a fact model takes its FactWorld")


def _known_queries(model, source, *, max_facts: int | None, seed: int, corruption: str = "noise", k_shot: int = 0,
                   template: int = 0, n_replace: int = 5) -> list[dict]:
    queries, _ = trace_queries(model, source, corruption=corruption, max_facts=max_facts, k_shot=k_shot,
                               template=template, n_replace=n_replace, seed=seed)
    if not queries:
        raise ValueError("no known facts: the model answers none of the queries correctly"
                         + (" with a same-length replacement subject" if corruption == "replace" else ""))
    return queries


def attention_knockout(model, source, *, window: int | None = None, targets=("subject", "relation", "last"),
                       layers=None, max_facts: int | None = None, k_shot: int = 0, template: int = 0, seed: int = 0,
                       progress: bool = False):
    """Attention knockout (Geva et al. 2023) on the facts ``model`` knows in ``source`` (a FactWorld, or
    relations): the last position's attention to the subject / relation / last position blocked over a window of
    layers; the relative change of the answer's probability (:mod:`mechfact.probes.knockout`)."""
    from .probes import knockout

    queries = _known_queries(model, source, max_facts=max_facts, seed=seed, k_shot=k_shot, template=template)
    return knockout.attention_knockout(model, queries, window=window, targets=targets, layers=layers,
                                         progress=progress)


def _with_attributes(model, source, queries: list[dict]) -> list[dict]:
    from .facts.world import FactWorld
    from .probes import extraction

    if isinstance(source, FactWorld):
        return extraction.world_attributes(source, queries)
    from .llm.relations import as_relations

    return extraction.relation_attributes(model.tokenizer, queries, as_relations(source))


def attribute_rate(model, source, *, k: int = 50, positions=("subject_last", "last"), layers=None,
                   max_facts: int | None = None, k_shot: int = 0, template: int = 0, seed: int = 0,
                   progress: bool = False):
    """Attribute rate (Geva et al. 2023): the share of the top-``k`` logit-lens tokens at each position and layer
    that are attributes of the subject (its objects under every relation of ``source``), beside the rate of
    another subject's attributes."""
    from .probes import extraction

    queries = _known_queries(model, source, max_facts=max_facts, seed=seed, k_shot=k_shot, template=template)
    return extraction.attribute_rate(model, _with_attributes(model, source, queries), k=k, positions=positions,
                                     layers=layers, seed=seed, progress=progress)


def extraction_events(model, source, *, max_facts: int | None = None, k_shot: int = 0, template: int = 0,
                      seed: int = 0, progress: bool = False):
    """Extraction events (Geva et al. 2023): per layer, the share of known facts whose attention or MLP update at
    the last position has the answer as its logit-lens top-1 token."""
    from .probes import extraction

    queries = _known_queries(model, source, max_facts=max_facts, seed=seed, k_shot=k_shot, template=template)
    return extraction.extraction_events(model, queries, progress=progress)


def attribution_patching(model, source, *, kind: str = "state", corruption: str = "noise", metric: str = "prob",
                         n_draws: int = 10, noise_factor: float = 3.0, layers=None, max_facts: int | None = None,
                         k_shot: int = 0, template: int = 0, n_replace: int = 5, seed: int = 0,
                         agreement: bool = False, progress: bool = False):
    """Attribution patching (AtP): the linear estimate of every single-site restoration of a causal trace from two
    forward passes and one backward pass. ``agreement=True``: also the exact trace (window 1) and their rank
    correlation per prompt (:class:`mechfact.probes.attribution.Agreement`)."""
    from .probes import attribution

    queries = _known_queries(model, source, max_facts=max_facts, seed=seed, corruption=corruption, k_shot=k_shot,
                             template=template, n_replace=n_replace)
    fn = attribution.atp_agreement if agreement else attribution.attribution_patching
    return fn(model, queries, kind=kind, corruption=corruption, metric=metric, noise_factor=noise_factor,
              n_draws=n_draws, seed=seed, layers=layers, progress=progress)


def state_transfer(model, source, *, layers=None, max_facts: int | None = None, template: int = 0, seed: int = 0,
                   batch_size: int = 64, progress: bool = False):
    """Subject-state transfer: a subject's state read from a neutral context, patched into another subject's
    relation prompt, makes the model give the first subject's attribute? (:mod:`mechfact.probes.state_transfer`;
    ``source``: a FactWorld, or relations of a pretrained model: a Relation, a list, a file or folder)."""
    from .facts.world import FactWorld
    from .probes import state_transfer as st

    if not isinstance(source, FactWorld):
        from .llm.transfer import transfer_facts

        _needs_lm(model, source)
        source = transfer_facts(model, source, template=template)
    return st.state_transfer(model, source, layers=layers, max_facts=max_facts, seed=seed, progress=progress,
                             batch_size=batch_size)


def relation_selectivity(model, source, *, layer: int | None = None, n_units: int | None = None, template: int = 0,
                         seed: int = 0, held_out: bool = True):
    """Relation selectivity of the last-position MLP units: ablate the units most selective for one relation and
    measure every relation, against as many random units (:mod:`mechfact.probes.selectivity`); ``held_out``: units
    chosen on one half of the facts, scored on the other (both ways)."""
    from .facts.world import FactWorld
    from .probes import selectivity as sel

    if not isinstance(source, FactWorld):
        from .llm.transfer import known_facts

        _needs_lm(model, source)
        source = known_facts(model, source, template=template)
    return sel.relation_selectivity(model, source, layer=layer, n_units=n_units, seed=seed, held_out=held_out)
