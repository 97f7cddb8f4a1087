"""The quickstart's sizes, in one place: ``--fast`` (smoke-sized, the tests), the default, and ``--full``.

The default is what a new user runs (on two idle cores, with the pretrained-model part in a second process:
about 2 minutes); ``--full`` adds what is slow and secondary:
the geometric regime on the bijection world (it does not learn that world in its 1000 steps, at 40 s) and two
more layers of the pretrained model's superposition test (each layer's 200-draw nulls cost about 8 s).
``--full`` is the previous default quickstart, size for size.
"""

from __future__ import annotations

from dataclasses import dataclass

POOL = {"n": 256, "relations": 4, "attributes": 16}  # the attribute-pool world of docs/results_probes.md section 4
GEO_STEPS = 1000  # the geometric regime here trains for 1000 of REGIMES['geometric']'s 3000 steps


@dataclass(frozen=True)
class Sizes:
    mode: str  # fast | default | full
    # paper A: linear memory
    memory_d: tuple = (16, 24)
    memory_seeds: int = 3
    memory_steps: int = 2000
    memory_patience: int = 500
    scores_d: int = 32
    spectrum_d: int = 32
    spectrum_seeds: int = 3
    spectrum_steps: int = 600
    # paper B: facts
    facts_n: int = 128
    facts_r: int = 4
    capacity_subjects: tuple = (64, 128)
    capacity_relations: tuple = (1, 2, 4)
    capacity_steps: int = 800
    # paper B: probes (keys of probe_models)
    probe_keys: tuple = ("construction", "default-pool", "geometric-pool", "default-bijection")
    # pretrained model
    llm_fast: bool = False  # --fast's LLM sizes (5 readout layers, 2 relations, 24 samples)
    superposition_layers: str = "three"  # three: {0, n/2, n-1}; five: {0, n/4, n/2, 3n/4, n-1}
    trace_facts: int = 3  # known country_capital facts in the causal trace (state restorations)
    trace_step: int = 5  # every trace_step-th layer traced (with the embedding and the last layer)

    @property
    def fast(self) -> bool:
        return self.mode == "fast"


def sizes_for(fast: bool = False, full: bool = False) -> Sizes:
    """The sizes of one quickstart run; ``fast`` wins over ``full``."""
    if fast:
        return Sizes("fast", memory_d=(12, 16), memory_seeds=2, memory_steps=1500, memory_patience=300, scores_d=24,
                     spectrum_d=24, spectrum_seeds=2, spectrum_steps=300, facts_n=64, facts_r=2,
                     capacity_subjects=(64,), capacity_relations=(1, 2), capacity_steps=400, llm_fast=True,
                     trace_facts=1, trace_step=6)
    if full:
        return Sizes("full", probe_keys=Sizes.probe_keys + ("geometric-bijection",), superposition_layers="five",
                     trace_facts=6, trace_step=1)
    return Sizes("default")


def probe_models(sizes: Sizes) -> list[dict]:
    """(key, world, model) of the probe section, in report order."""
    every = [
        {"key": "construction", "world": "pool", "model": "construction", "label": "construction (pool)"},
        {"key": "default-pool", "world": "pool", "model": "plain", "label": "default regime (pool)"},
        {"key": "geometric-pool", "world": "pool", "model": "geometric", "steps": GEO_STEPS,
         "label": "geometric regime (pool)"},
        {"key": "default-bijection", "world": "bijection", "model": "plain", "label": "default regime (bijection)"},
        {"key": "geometric-bijection", "world": "bijection", "model": "geometric", "steps": GEO_STEPS,
         "label": "geometric regime (bijection)"},
    ]
    return [m for m in every if m["key"] in sizes.probe_keys]


def llm_layers(n: int, sizes: Sizes) -> dict:
    """Layers of the pretrained model's readout and superposition runs, for a model of ``n`` layers."""
    if sizes.llm_fast:
        readout = sorted({0, n // 4, n // 2, (3 * n) // 4, n - 1})
    else:
        readout = sorted(set(range(0, n, 3)) | {n - 1})
    if sizes.superposition_layers == "five":
        sup = sorted({0, n // 4, n // 2, (3 * n) // 4, n - 1})
    else:
        sup = sorted({0, n // 2, n - 1})
    trace = sorted({-1, n - 1} | set(range(0, n, sizes.trace_step)))
    return {"readout": readout, "superposition": sup, "trace": trace}
