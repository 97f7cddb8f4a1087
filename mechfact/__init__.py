"""mechfact: mechanistic interpretability of factual recall.

Synthetic memories (linear associative memories, one-layer transformers) and
pretrained LLMs are probed with the same hook-based analyses. Everything a
notebook needs is here, in memory (no run directory, no progress bars unless
``progress=True``); ``docs/api.md`` walks through it::

    import mechfact

    lm = mechfact.load_model("default")                      # or a hub name, folder, .gguf, in-memory HF model
    rel = mechfact.Relation("capital", ["The capital of {} is"], [("France", "Paris"), ("Japan", "Tokyo"), ...])
    mechfact.layer_readout(lm, [rel], layers=[0, 10, 20]).records
    mechfact.lre(lm, rel, layer=15).faithfulness

    world = mechfact.FactWorld(256, 4, seed=0)
    model = mechfact.build_fact_model(world, d=32, mlp_width=64, seed=1)
    mechfact.train(model, world, mechfact.TrainConfig(lr=3e-2, steps=1000))
    mechfact.superposition(model, world).r2_heldout

Names are imported on first use, so ``import mechfact`` stays light.
"""

from __future__ import annotations

import importlib
import os

# OpenMP threads that wait for work spin by default: on a machine that is also running other jobs, torch's
# default thread count then made a sweep 7x slower than one thread (benchmarks/threads_bench.py). Passive
# waiting (threads sleep) keeps the default thread count within ~10% of one thread under load. OpenMP reads
# this once, when torch is imported: set here, before any mechfact module imports torch. A value the user
# set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"

# public name -> (module, attribute)
_EXPORTS: dict[str, tuple[str, str]] = {
    # pretrained models and relations
    "load_model": ("mechfact.llm.models.loading", "load_model"),
    "LanguageModel": ("mechfact.llm.models.language_model", "LanguageModel"),
    "Relation": ("mechfact.llm.relations", "Relation"),
    "load_relations": ("mechfact.llm.relations", "load_relations"),
    "probe_set": ("mechfact.llm.prompts", "probe_set"),
    "as_queries": ("mechfact.targets", "as_queries"),
    "layer_readout": ("mechfact.llm.readout", "layer_readout"),
    "lre": ("mechfact.llm.lre", "lre"),
    "lre_sweep": ("mechfact.llm.lre", "lre_sweep"),
    "causal_trace": ("mechfact.causal", "causal_trace"),
    "attention_knockout": ("mechfact.causal", "attention_knockout"),
    "attribute_rate": ("mechfact.causal", "attribute_rate"),
    "extraction_events": ("mechfact.causal", "extraction_events"),
    "attribution_patching": ("mechfact.causal", "attribution_patching"),
    "state_transfer": ("mechfact.causal", "state_transfer"),
    "relation_selectivity": ("mechfact.causal", "relation_selectivity"),
    "llm_superposition": ("mechfact.llm.superposition", "llm_superposition"),
    # synthetic facts: worlds, one-layer models, training, constructions
    "FactWorld": ("mechfact.facts.world", "FactWorld"),
    "FactModel": ("mechfact.facts.model", "FactModel"),
    "FactModelConfig": ("mechfact.facts.model", "FactModelConfig"),
    "build_fact_model": ("mechfact.facts.model", "build_fact_model"),
    "TrainConfig": ("mechfact.facts.train", "TrainConfig"),
    "train": ("mechfact.facts.train", "train"),
    "evaluate": ("mechfact.facts.evaluate", "evaluate"),
    "construct": ("mechfact.facts.construct", "construct"),
    "Regime": ("mechfact.facts.regimes", "Regime"),
    "REGIMES": ("mechfact.facts.regimes", "REGIMES"),
    # linear associative memories
    "MemoryProblem": ("mechfact.memory.problems", "MemoryProblem"),
    "MemoryTrainConfig": ("mechfact.memory.solvers", "MemoryTrainConfig"),
    "hebb": ("mechfact.memory.solvers", "hebb"),
    "train_memory": ("mechfact.memory.solvers", "train"),
    "separable": ("mechfact.memory.solvers", "separable"),
    # what probes consume
    "hooks": ("mechfact.hooks", ""),
    "ProbeSet": ("mechfact.probes.queries", "ProbeSet"),
    "Site": ("mechfact.probes.queries", "Site"),
    "collect": ("mechfact.probes.queries", "collect"),
    "Intervention": ("mechfact.probes.patching", "Intervention"),
    "run_with_interventions": ("mechfact.probes.patching", "run_with_interventions"),
    # probes, on fact models and pretrained models alike
    "readout": ("mechfact.probes.readout", "readout"),
    "superposition": ("mechfact.targets", "superposition"),
    "intervene": ("mechfact.probes.experiments", "intervene"),
    "freeze_and_swap": ("mechfact.targets", "freeze_and_swap"),
    "scores_and_spectra": ("mechfact.probes.weights", "scores_and_spectra"),
    "probe_all": ("mechfact.targets", "probe_all"),
    # the registry: one declaration gives an analysis its command, run folder and entry point
    "ANALYSES": ("mechfact.analyses", "ANALYSES"),
    "run_analysis": ("mechfact.analyses", "run"),
    "register_analysis": ("mechfact.analyses", "register"),
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'mechfact' has no attribute {name!r}") from None
    obj = importlib.import_module(module)
    obj = getattr(obj, attr) if attr else obj
    globals()[name] = obj
    return obj


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
