"""Pretrained LLMs probed with the same readouts as the synthetic models, and the LRE (Hernandez et al. 2024).

* :mod:`.models` -- the models: ``load_model`` (:mod:`.models.loading`, the one module that boots a
  transformer-lens bridge) returns a :class:`~.models.language_model.LanguageModel`; the packaged models as data
  (:mod:`.models.registry`); embedded default SmolLM2-135M-Instruct (Q4_1); in-memory Hugging Face models.
* :mod:`.relations` -- :class:`~.relations.Relation` (in memory or from the JSON format of ``mechfact/data/relations``).
* :mod:`.prompts` -- zero-/k-shot prompts with subject token positions; ``probe_set`` for the shared probes.
* :mod:`.readout` -- layer-wise linear readouts: ``layer_readout`` (in memory), ``run_llm_probe`` (run directory).
* :mod:`.lre` -- linear relational embeddings, faithfulness and causality: ``lre``, ``run_llm_lre``; the two
  protocols (:mod:`.lre.protocol_authors`, :mod:`.lre.protocol_mechfact`), the operator (:mod:`.lre.operator`),
  prompts that share a prefix run once (:mod:`.lre.shared_prefix`).
* :mod:`.jacobian` -- the Jacobian of a block stack at the subject state, batched and block by block.
* :mod:`.superposition`, :mod:`.trace`, :mod:`.transfer` -- the superposition test, causal tracing and state
  transfer on relation files; :mod:`.jobs` -- one task per relation, here or on Ray.

The names below are imported on first use, so ``import mechfact.llm.relations`` does not import
transformer-lens.
"""

from __future__ import annotations

import importlib

# public name -> module (the function lre is mechfact.lre: the name is the module here)
_EXPORTS = {
    "LanguageModel": "models.language_model", "load_model": "models.loading",
    "LreConfig": "lre", "LreResult": "lre", "run_llm_lre": "lre",
    "LayerReadoutResult": "readout", "ProbeConfig": "readout", "layer_readout": "readout", "run_llm_probe": "readout",
    "probe_set": "prompts",
    "Relation": "relations", "load_relations": "relations",
}

__all__ = ["LanguageModel", "load_model", "Relation", "load_relations", "probe_set", "ProbeConfig", "layer_readout",
           "LayerReadoutResult", "run_llm_probe", "LreConfig", "LreResult", "run_llm_lre"]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
