"""Pretrained LLMs probed with the same readouts as the synthetic models (paper C).

* :mod:`.loading` -- the one module that boots models (transformer-lens bridge): ``load_model`` returns a
  :class:`~.loading.LanguageModel`; embedded default SmolLM2-135M; in-memory Hugging Face models.
* :mod:`.relations` -- :class:`~.relations.Relation` (in memory or from the JSON format of ``mechfact/data/relations``).
* :mod:`.prompts` -- zero-/k-shot prompts with subject token positions; ``probe_set`` for the shared probes.
* :mod:`.probe` -- layer-wise linear readouts: ``layer_readout`` (in memory), ``run_llm_probe`` (run directory).
* :mod:`.lre` -- linear relational embeddings, faithfulness and causality: ``lre``, ``run_llm_lre``.
"""

from .loading import LanguageModel, load_model
from .lre import LreConfig, LreResult, run_llm_lre  # the function lre: mechfact.lre (the name is the module here)
from .probe import LayerReadoutResult, ProbeConfig, layer_readout, run_llm_probe
from .prompts import probe_set
from .relations import Relation, load_relations

__all__ = ["LanguageModel", "load_model", "Relation", "load_relations", "probe_set", "ProbeConfig", "layer_readout",
           "LayerReadoutResult", "run_llm_probe", "LreConfig", "LreResult", "run_llm_lre"]
