"""Probes written once for every model with the transformer-lens hook interface.

The same functions take the one-layer fact models of :mod:`mechfact.facts` and
pretrained models (:class:`mechfact.llm.models.loading.LanguageModel`, or a bare
``TransformerBridge``): a hooked model plus a
:class:`~mechfact.probes.queries.ProbeSet` of queries (a FactWorld is accepted
wherever queries are). This package imports only the base layer (hooks, config,
runs, seeding, stats, plotting, randmat), never a model package: what it needs
of a model, a world and a trainer is written down in :mod:`.protocols`, and a
probe that trains (freeze-and-swap) takes the trainer as an argument
(:mod:`mechfact.targets` joins the probes to the fact models and pretrained models).

* :mod:`.protocols`     -- HookedModel, FactWorldLike, Retrainer: what the probes use of what they are given
* :mod:`.queries`       -- ProbeSet, Site (hook@position, one position vocabulary), ``collect`` (the one
  activation collector: batching, padding, disk cache)
* :mod:`.readout`       -- linear readouts (classifier / vector regression), held-out subjects
* :mod:`.superposition` -- subject embedding ~ superposition of attribute vectors; maps that build embeddings
* :mod:`.patching`      -- interventions as data, one patching engine, selectivity, ablation, relation swap
* :mod:`.swap`          -- freeze-and-swap transfer (zero-shot, retrained, relearn control)
* :mod:`.weights`       -- logit score distributions (EVT line) and spectra of effective maps
* :mod:`.experiments`   -- in-memory ``superposition``, ``intervene``, ``probe_all``; the configs of ``mechfact probe``
  (its run directories: :mod:`mechfact.probe_runs`)
"""
