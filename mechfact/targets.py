"""What a probe runs on: fact models (:mod:`mechfact.facts`) and pretrained models (:mod:`mechfact.llm`).

:mod:`mechfact.probes` works on any hooked model and imports neither; this module joins them:

* target resolution for ``mechfact probe ... --model SPEC``: :func:`check_target` (``"fact"`` or
  ``"pretrained"``), :func:`load_target` (``(model, world_or_None, probe_set)``);
* the facts-aware in-memory API that ``import mechfact`` exports: :func:`superposition` (a fact model and its
  world, or a pretrained model), :func:`freeze_and_swap` and :func:`probe_all` with the fact trainer
  (:func:`fact_retrainer`, :class:`SwapConfig`), :func:`quick` (the probe section of the quickstart).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .config import DictConfig, bad
from .facts.train import TrainConfig
from .probes import experiments as _probes
from .probes import swap as _swap
from .probes.queries import ProbeSet

RETRAIN = TrainConfig(lr=1e-2, steps=300, eval_every=25, target_accuracy=None)  # freeze-and-swap's default


# ---- the fact trainer, passed to the probes -----------------------------------------------

@dataclass
class FactRetrainer:
    """:class:`~mechfact.probes.protocols.Retrainer` of a fact model: :func:`mechfact.facts.train.train` with
    ``cfg``, the tensors the probe names frozen beside ``cfg.freeze``; the curve starts with the accuracy of
    :func:`mechfact.facts.evaluate.evaluate` at step 0."""

    cfg: TrainConfig

    def __call__(self, model, world, frozen, device) -> list[dict]:
        from .facts.evaluate import evaluate
        from .facts.train import train

        freeze = sorted(set(frozen) | set(self.cfg.freeze))
        cfg = dataclasses.replace(self.cfg, freeze=freeze, l2_only=[n for n in self.cfg.l2_only if n not in freeze])
        start = {"step": 0, "loss": float("nan"), "accuracy": evaluate(model, world)["accuracy"]}
        return [start, *train(model, world, cfg, device=device)["history"]]

    def to_dict(self) -> dict:
        return self.cfg.to_dict()


def fact_retrainer(cfg: TrainConfig | None = None) -> FactRetrainer:
    """The retrainer of freeze-and-swap on a fact model (default :data:`RETRAIN`: Adam lr 1e-2, 300 steps)."""
    return FactRetrainer(cfg or RETRAIN)


@dataclass
class SwapConfig(DictConfig):
    new_seed: int = 1  # seed of the new random bijections
    retrain: TrainConfig = field(default_factory=lambda: RETRAIN)  # how fresh embeddings are retrained

    def __post_init__(self) -> None:
        if isinstance(self.new_seed, bool) or not isinstance(self.new_seed, int):
            raise bad("new_seed", self.new_seed, "must be an integer")
        if not isinstance(self.retrain, TrainConfig):
            raise ValueError(f"retrain: expected a TrainConfig, got {type(self.retrain).__name__}")

    def retrainer(self) -> FactRetrainer:
        return fact_retrainer(self.retrain)


def retrain_embeddings(model, world, init: torch.Tensor, cfg: TrainConfig = RETRAIN) -> list[dict]:
    """:func:`mechfact.probes.swap.retrain_embeddings` with the fact trainer and ``cfg``."""
    return _swap.retrain_embeddings(model, world, init, fact_retrainer(cfg))


def freeze_and_swap(model, world, *, new_seed: int = 1, retrain: TrainConfig | None = None, sfit=None,
                    seed: int = 0) -> _swap.SwapResult:
    """:func:`mechfact.probes.swap.freeze_and_swap` on a fact model, retrained by the fact trainer with
    ``retrain`` (default :data:`RETRAIN`)."""
    return _swap.freeze_and_swap(model, world, new_seed=new_seed, retrain=fact_retrainer(retrain), sfit=sfit,
                                 seed=seed)


def probe_all(model, world, *, seed: int = 0, swap: SwapConfig | None = None, readout_sites=None):
    """:func:`mechfact.probes.experiments.probe_all` with ``swap`` defaulting to :class:`SwapConfig`."""
    return _probes.probe_all(model, world, seed=seed, swap=swap or SwapConfig(), readout_sites=readout_sites)


def superposition(model, world, heldout_fraction: float = 0.2, seed: int = 0):
    """Is each subject's embedding a superposition of its attribute vectors? A fact model and its FactWorld
    (:func:`mechfact.probes.experiments.superposition`): fits the subject embeddings on ``1 - heldout_fraction``
    of the subjects, scores R^2 on the rest, beside a shuffled control; returns a
    :class:`~mechfact.probes.superposition.SuperpositionResult`. The same test on a pretrained model's states,
    layer by layer: :func:`mechfact.llm.superposition.llm_superposition` (``mechfact.llm_superposition``)."""
    from .facts.world import FactWorld

    if not isinstance(world, FactWorld):
        raise TypeError(f"superposition(model, world): world is a {type(world).__name__}, not a FactWorld; for a "
                        "pretrained model call mechfact.llm_superposition(lm, relations, layers)")
    return _probes.superposition(model, world, heldout_fraction, seed)


def quick(n_entities: int = 128, n_relations: int = 4, *, model: str = "construct", seed: int = 0,
          retrain_steps: int = 30, device: str | torch.device = "cpu") -> dict:
    """A fast small version for the quickstart: build (or train) a model, run every probe once, return numbers.

    ``model="construct"``: the explicit construction (block size 24; a few
    seconds). ``model="trained"``: a d = 32, m = 32 model trained in the L2
    regime of docs/results_probes.md (coupled L2 1e-3, 1500 full-batch Adam
    steps; 20-50 s at N = 128 on one CPU thread).
    Returns :func:`~mechfact.probes.experiments.summary` of :func:`probe_all` plus ``model`` and
    ``train_accuracy``.
    """
    from .facts import FactWorld, build_fact_model, build_single_hop, evaluate, train

    world = FactWorld(n_entities, n_relations, seed=seed)
    if model == "construct":
        m = build_single_hop(world, 24, seed=seed).to(device)
    elif model == "trained":
        m = build_fact_model(world, d=32, mlp_width=32, seed=seed)
        train(m, world, TrainConfig(lr=1e-2, steps=1500, l2=1e-3, eval_every=500, target_accuracy=None),
              device=device)
        m.eval()
    else:
        raise ValueError(f"model={model!r}: allowed construct, trained")
    res = probe_all(m, world, seed=seed, swap=SwapConfig(retrain=TrainConfig(
        lr=3e-2, steps=retrain_steps, eval_every=max(1, retrain_steps // 3), target_accuracy=None)))
    return {"model": model, "n_entities": n_entities, "n_relations": n_relations,
            "train_accuracy": evaluate(m, world)["accuracy"], **_probes.summary(res)}


# ---- targets of the probe commands ---------------------------------------------------------

def is_fact_run(spec) -> bool:
    """Whether ``spec`` names a fact-model run directory (``world.json`` in it, or next to a bare ``model/``)."""
    from .facts.runio import WORLD_FILE

    p = Path(spec).expanduser()
    return p.is_dir() and ((p / WORLD_FILE).is_file() or ((p / "model.safetensors").is_file()
                                                          and (p.parent / WORLD_FILE).is_file()))


def _run_kind(p: Path) -> str | None:
    """The ``kind`` of a mechfact run directory's config.json (None: not one, or unreadable)."""
    import json

    try:
        cfg = json.loads((p / "config.json").read_text())
    except (OSError, ValueError):
        return None
    ours = isinstance(cfg, dict) and {"kind", "config", "seed"} <= set(cfg) and isinstance(cfg["kind"], str)
    return cfg["kind"] if ours else None


def check_target(spec) -> str:
    """``"fact"`` or ``"pretrained"`` for a ``--model`` value; ValueError naming what a bad path is not."""
    if is_fact_run(spec):
        return "fact"
    p = Path(spec).expanduser()
    if p.is_dir():
        kind = _run_kind(p)
        if ((p / "model" / "model.safetensors").is_file() or (p / "model" / "config.json").is_file()
                or kind in ("facts.train", "facts.construct")):
            return "fact"  # a fact-model run that lost a file: loading it names the file
        if kind is not None:
            raise ValueError(f"--model {spec}: a mechfact {kind} run directory, not a model; pass a fact-model run "
                             "directory (`mechfact facts train|construct`) or a Hugging Face model folder")
    if p.is_dir() and not (p / "config.json").is_file():
        raise ValueError(f"--model {spec}: neither a fact-model run directory (world.json + model/, as written "
                         "by `mechfact facts train|construct`) nor a Hugging Face model folder (config.json)")
    if not p.exists() and (str(spec).startswith(("/", ".", "~")) or str(spec).count("/") > 1):
        raise ValueError(f"--model {spec}: no such run directory or model file")
    return "pretrained"


def load_target(spec: str | os.PathLike, device: str | torch.device = "cpu", **prompts):
    """``(model, world_or_None, probe_set)`` for ``mechfact probe ... --model spec``.

    A fact-model run directory gives its FactModel, FactWorld and single-hop queries. Anything else is a
    pretrained model (:func:`mechfact.llm.models.loading.load_model`: hub name, local Hugging Face folder, ``.gguf``
    file, ``default``) with the prompts of ``prompts`` (:func:`mechfact.llm.prompts.probe_set` options:
    ``relations``, ``relation_names``, ``k_shot``, ``template``, ``max_samples``, ``seed``, ``dtype``).
    """
    from .facts.runio import load_fact_run

    if check_target(spec) == "fact":
        model, world = load_fact_run(spec, device=device)
        return model.eval(), world, as_queries(model, world)
    from .llm.models.loading import load_model
    from .llm.relations import load_relations

    dtype = prompts.pop("dtype", "float32")
    rels = load_relations(prompts.pop("relations", None), prompts.pop("relation_names", None))
    lm = load_model(spec, device=device, dtype=dtype)
    return lm, None, as_queries(lm, rels, **prompts)


def as_queries(model, source=None, *, k_shot: int = 3, template: int = 0, seed: int = 0,
               max_samples: int | None = None) -> ProbeSet:
    """The queries every probe takes (a :class:`~mechfact.probes.queries.ProbeSet`), from what it runs on: a
    ProbeSet (as it is), a :class:`~mechfact.facts.world.FactWorld` (its single-hop queries ``[s, r]``), or
    relations of a pretrained ``model`` (a Relation, a list of them, a file or folder; None: the shipped dataset)
    as ``k_shot`` prompts (:func:`mechfact.llm.prompts.probe_set`). The causal experiments take the same sources
    and keep the facts the model knows (:func:`mechfact.causal.trace_queries`)."""
    from .facts.world import FactWorld

    if isinstance(source, ProbeSet):
        return source
    if isinstance(source, FactWorld):
        return ProbeSet.from_world(source)
    if not hasattr(model, "tokenizer"):
        raise ValueError(f"as_queries: a source of type {type(source).__name__} needs a pretrained model with a "
                         f"tokenizer; a {type(model).__name__} takes its FactWorld or a ProbeSet")
    from .llm.prompts import probe_set

    return probe_set(model, source, k_shot=k_shot, template=template, seed=seed, max_samples=max_samples)
