"""Probes written once for every model with the transformer-lens hook interface.

The same functions take the one-layer fact models of :mod:`mechfact.facts` and
pretrained models booted through ``TransformerBridge`` (:mod:`mechfact.llm`):
a hooked model plus a :class:`~mechfact.probes.queries.ProbeSet` of queries.

* :mod:`.queries`       -- ProbeSet, sites (hook@position), activation collection
* :mod:`.readout`       -- linear readouts (classifier / vector regression), held-out subjects
* :mod:`.superposition` -- subject embedding ~ superposition of attribute vectors; maps that build embeddings
* :mod:`.patching`      -- interventions as data, one patching engine, selectivity, ablation, relation swap
* :mod:`.swap`          -- freeze-and-swap transfer (zero-shot, retrained, relearn control)
* :mod:`.weights`       -- logit score distributions (EVT line) and spectra of effective maps
* :mod:`.fit`           -- small trainer (chosen tensors, coupled L2) for swaps and regime studies
* :mod:`.regimes`       -- named training regimes of the regime study
* :mod:`.experiments`   -- ``run_*`` (run directories for ``mechfact probe ...``), ``probe_all``, ``quick``
"""
