"""Probe runs: a typed config plus ``run_*(model_spec, cfg, out)`` writing a standard run directory.

Every run directory holds ``config.json`` (first; includes the model spec),
``result.json``, ``meta.json`` and ``fig_*.png`` drawn from result.json
(:mod:`mechfact.probes.plots`). ``model`` is a fact-model run directory (what
``mechfact facts train|construct`` writes) or, once :mod:`mechfact.llm.loading`
exists, a pretrained model name (readout / intervene only: the other probes
need a fact world).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..config import DictConfig
from ..runs import RunDir
from .fit import FitConfig
from .queries import ProbeSet, from_world

logger = logging.getLogger(__name__)


# ---- configs ------------------------------------------------------------------------

@dataclass
class ReadoutConfig(DictConfig):
    sites: list[str] = field(default_factory=lambda: ["hook_embed@subject", "blocks.0.hook_resid_mid@last",
                                                      "blocks.0.mlp.hook_post@last", "blocks.0.hook_resid_post@last"])
    relations: list[int] | None = None  # None = all
    kind: str = "auto"  # auto | vector | classifier
    heldout_fraction: float = 0.25  # share of subjects held out
    alpha: float = 1.0  # ridge strength (vector readouts; features scaled to unit RMS)


@dataclass
class SuperpositionConfig(DictConfig):
    heldout_fraction: float = 0.2  # share of subjects held out of the fit


@dataclass
class InterveneConfig(DictConfig):
    relations: list[int] | None = None  # relations whose selector units are ablated (None = all)
    site: str = "blocks.0.mlp.hook_post"  # units to ablate (post-ReLU)
    n_units: int | None = None  # None = every unit preferring the relation
    kind: str = "zero"  # zero | mean (ablation kind)
    swap_pairs: list[list[int]] | None = None  # relation-token swaps (r, r'); None = (r, r+1 mod R)


@dataclass
class SwapConfig(DictConfig):
    new_seed: int = 1  # seed of the new random bijections
    retrain: FitConfig = field(default_factory=lambda: FitConfig(lr=1e-2, steps=300, eval_every=25))

    @classmethod
    def from_dict(cls, d: dict) -> "SwapConfig":
        d = dict(d)
        if isinstance(d.get("retrain"), dict):
            d["retrain"] = FitConfig.from_dict(d["retrain"])
        return super().from_dict(d)


@dataclass
class ScoresConfig(DictConfig):
    pass


# ---- model loading --------------------------------------------------------------------

def load_model(spec: str | os.PathLike, device: str | torch.device = "cpu"):
    """``(model, world_or_None, probe_set_or_None)`` from a fact run dir, or a pretrained name."""
    from ..facts.runio import is_fact_run, load_fact_run

    p = Path(spec)
    if p.exists():
        if not p.is_dir() or not (is_fact_run(p) or (p / "world.json").is_file()):
            raise ValueError(f"--model {spec}: not a fact-model run directory (expected world.json and model/ as "
                             "written by `mechfact facts train` or `mechfact facts construct`)")
        model, world = load_fact_run(p, device=device)
        model.eval()
        return model, world, from_world(world)
    if str(spec).startswith(("/", ".", "~")) or str(spec).endswith(os.sep):
        raise ValueError(f"--model {spec}: no such run directory")
    try:
        from ..llm import loading  # type: ignore[attr-defined]
    except ImportError:
        raise ValueError(f"--model {spec}: no such run directory, and pretrained models need mechfact.llm.loading, "
                         "which this install does not have") from None
    loader = getattr(loading, "load_probe_target", None)
    if loader is None:
        raise ValueError(f"--model {spec}: no such run directory; mechfact.llm.loading has no load_probe_target "
                         "(model, ProbeSet) entry point yet")
    model, ps = loader(str(spec), device=device)
    return model, None, ps


def _need_world(world, what: str, spec) -> None:
    if world is None:
        raise ValueError(f"probe {what} needs a synthetic fact model (world.json); --model {spec} is a pretrained model")


def _finish(run: RunDir, result: dict, fig: str, plot) -> dict:
    run.write_result(result)
    try:
        plot(result, run.file(fig))
    except Exception as exc:  # a figure must never lose a result
        logger.warning("figure %s failed: %s", fig, exc)
    run.write_meta()
    return result


def _dev(device) -> str:
    return str(device)


# ---- runs -------------------------------------------------------------------------------

def run_readout(spec, cfg: ReadoutConfig, out, *, device="cpu", seed: int = 0) -> dict:
    from . import plots
    from .readout import readout

    model, world, ps = load_model(spec, device)
    run = RunDir(out, {"model": str(spec), **cfg.to_dict()}, kind="probe.readout", seed=seed, device=_dev(device))
    res = readout(model, ps, cfg.sites, relations=cfg.relations, kind=cfg.kind, heldout_fraction=cfg.heldout_fraction,
                  alpha=cfg.alpha, seed=seed)
    return _finish(run, res.to_dict(), "fig_readout.png", plots.plot_readout)


def superposition_of(model, world, heldout_fraction: float = 0.2, seed: int = 0):
    from .superposition import split_entities, superposition_test
    from .swap import attribute_vectors, subject_embeddings

    N = world.n_entities
    tr, te = split_entities(N, heldout_fraction, seed)
    return superposition_test(subject_embeddings(model, N), attribute_vectors(model, N), world.perms, tr, te,
                              seed=seed)


def run_superposition(spec, cfg: SuperpositionConfig, out, *, device="cpu", seed: int = 0) -> dict:
    from . import plots

    model, world, _ = load_model(spec, device)
    _need_world(world, "superposition", spec)
    run = RunDir(out, {"model": str(spec), **cfg.to_dict()}, kind="probe.superposition", seed=seed, device=_dev(device))
    res = superposition_of(model, world, cfg.heldout_fraction, seed)
    return _finish(run, res.to_dict(), "fig_superposition.png", plots.plot_superposition)


def intervene(model, ps: ProbeSet, cfg: InterveneConfig, seed: int = 0) -> dict:
    from .patching import ablate_relation_units, relation_swap

    ab = ablate_relation_units(model, ps, cfg.relations, site=cfg.site, n_units=cfg.n_units, kind=cfg.kind, seed=seed)
    rels = ps.relation_ids
    pairs = cfg.swap_pairs
    if pairs is None and ps.relation_pos is not None and len(rels) > 1:
        pairs = [[r, rels[(i + 1) % len(rels)]] for i, r in enumerate(rels)]
    swaps = [relation_swap(model, ps, a, b).to_dict() for a, b in (pairs or [])]
    return {**ab.to_dict(), "relation_swaps": swaps}


def run_intervene(spec, cfg: InterveneConfig, out, *, device="cpu", seed: int = 0) -> dict:
    from . import plots

    model, _, ps = load_model(spec, device)
    run = RunDir(out, {"model": str(spec), **cfg.to_dict()}, kind="probe.intervene", seed=seed, device=_dev(device))
    return _finish(run, intervene(model, ps, cfg, seed), "fig_intervene.png", plots.plot_intervene)


def run_swap(spec, cfg: SwapConfig, out, *, device="cpu", seed: int = 0) -> dict:
    from . import plots
    from .swap import freeze_and_swap

    model, world, _ = load_model(spec, device)
    _need_world(world, "swap", spec)
    run = RunDir(out, {"model": str(spec), **cfg.to_dict()}, kind="probe.swap", seed=seed, device=_dev(device))
    res = freeze_and_swap(model, world, new_seed=cfg.new_seed, retrain=cfg.retrain, seed=seed)
    return _finish(run, res.to_dict(), "fig_swap.png", plots.plot_swap)


def run_scores(spec, cfg: ScoresConfig, out, *, device="cpu", seed: int = 0) -> dict:
    from . import plots
    from .weights import scores_and_spectra

    model, world, ps = load_model(spec, device)
    _need_world(world, "scores", spec)
    run = RunDir(out, {"model": str(spec), **cfg.to_dict()}, kind="probe.scores", seed=seed, device=_dev(device))
    return _finish(run, scores_and_spectra(model, ps).to_dict(), "fig_scores.png", plots.plot_scores)


# ---- everything at once on an in-memory model (quickstart, examples, studies) ----------

def probe_all(model, world, *, seed: int = 0, swap: SwapConfig | None = None, readout_sites=None) -> dict:
    """Superposition, readout (embedding site), ablation + relation swaps, freeze-and-swap: one dict."""
    from .readout import readout
    from .swap import freeze_and_swap

    ps = from_world(world)
    sp = superposition_of(model, world, seed=seed)
    rd = readout(model, ps, readout_sites or ["hook_embed@subject"], seed=seed)
    iv = intervene(model, ps, InterveneConfig(), seed)
    swap = swap or SwapConfig()
    sw = freeze_and_swap(model, world, new_seed=swap.new_seed, retrain=swap.retrain, sfit=sp.fit, seed=seed)
    return {"superposition": sp.to_dict(), "readout": rd.to_dict(), "intervene": iv, "swap": sw.to_dict()}


def summary(res: dict) -> dict:
    """The headline numbers of :func:`probe_all`."""
    sp, rd, iv, sw = res["superposition"], res["readout"]["per_relation"], res["intervene"], res["swap"]
    emb = [r["accuracy"] for r in rd if r["site"].startswith("hook_embed")]
    emb_c = [r["control_accuracy"] for r in rd if r["site"].startswith("hook_embed")]
    pr = iv["per_relation"]
    return {
        "r2_train": sp["r2_train"], "r2_heldout": sp["r2_heldout"], "control_r2_heldout": sp["control_r2_heldout"],
        "attribute_coadaptation_r2": sp["attribute_coadaptation_r2"],
        "block_overlap_offdiag": float(np.mean([sp["block_overlap"][a][b] for a in range(len(sp["block_overlap"]))
                                               for b in range(len(sp["block_overlap"])) if a != b])),
        "readout_embed_min": min(emb), "readout_embed_mean": float(np.mean(emb)),
        "readout_embed_control_max": max(emb_c),
        "ablation_on_relation": [r["accuracy_on_relation"] for r in pr],
        "ablation_on_others": [r["accuracy_on_others"] for r in pr],
        "ablation_random_on_relation": [r["random_units_accuracy_on_relation"] for r in pr],
        "n_ablated": [r["n_ablated"] for r in pr],
        "relation_swap_moved": [s["moved_to_new"] for s in iv["relation_swaps"]],
        "zero_shot_accuracy": sw["zero_shot_accuracy"], "zero_shot_control_accuracy": sw["zero_shot_control_accuracy"],
        "reconstructed_accuracy": sw["reconstructed_accuracy"],
        "retrained_accuracy": sw["retrained_accuracy"], "control_relearn_accuracy": sw["control_relearn_accuracy"],
    }


def quick(n_entities: int = 128, n_relations: int = 4, *, model: str = "construct", seed: int = 0,
          retrain_steps: int = 30) -> dict:
    """A fast small version for the quickstart: build (or train) a model, run every probe once, return numbers.

    ``model="construct"``: the explicit construction (block size 24; a few
    seconds). ``model="trained"``: a d = 32, m = 32 model trained in the L2
    regime of docs/results_probes.md (coupled L2 1e-3, 1500 full-batch Adam
    steps; 20-50 s at N = 128 on one CPU thread).
    Returns :func:`summary` of :func:`probe_all` plus ``model`` and ``train_accuracy``.
    """
    from ..facts import FactModel, FactModelConfig, FactWorld, build_single_hop, evaluate

    world = FactWorld(n_entities, n_relations, seed=seed)
    if model == "construct":
        m = build_single_hop(world, 24, seed=seed)
    elif model == "trained":
        from .fit import train_fact_model

        m = FactModel(FactModelConfig(n_entities, n_relations, d=32, mlp_width=32, seed=seed))
        train_fact_model(m, world, FitConfig(lr=1e-2, steps=1500, l2=1e-3, eval_every=500))
    else:
        raise ValueError(f"model={model!r}: allowed construct, trained")
    res = probe_all(m, world, seed=seed, swap=SwapConfig(retrain=FitConfig(lr=3e-2, steps=retrain_steps,
                                                                           eval_every=max(1, retrain_steps // 3))))
    return {"model": model, "n_entities": n_entities, "n_relations": n_relations,
            "train_accuracy": evaluate(m, world)["accuracy"], **summary(res)}
