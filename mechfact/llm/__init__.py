"""Pretrained LLMs probed with the same readouts as the synthetic models (paper C).

* :mod:`.loading` -- the one module that boots models (transformer-lens bridge); embedded default SmolLM2-135M.
* :mod:`.relations` -- the relational facts format and loader (``mechfact/data/relations``).
* :mod:`.prompts` -- zero-/k-shot prompts with subject token positions.
* :mod:`.extract` -- batched, padded, cached hidden-state extraction.
* :mod:`.probe` -- layer-wise linear readouts (``mechfact.probes.readout``), ``run_llm_probe``.
* :mod:`.lre` -- linear relational embeddings: faithfulness and causality, ``run_llm_lre``.
"""

from .loading import LoadedModel, load_model
from .lre import LreConfig, run_llm_lre
from .probe import ProbeConfig, run_llm_probe
from .relations import Relation, load_relations

__all__ = ["LoadedModel", "load_model", "Relation", "load_relations", "ProbeConfig", "run_llm_probe", "LreConfig",
           "run_llm_lre"]
