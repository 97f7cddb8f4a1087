"""The run folders of the analyses declared with a config (:mod:`mechfact.analyses`): ``run_*(spec, cfg, out,
*, device, seed, progress)``, the writer each :class:`~mechfact.analyses.Variant` names.

The fact-model writers load the target with :func:`mechfact.targets.load_target`, run the in-memory probe and
write ``config.json`` (first), ``result.json``, ``meta.json`` and ``fig_*.png`` drawn from result.json
(:mod:`mechfact.probes.plots`). ``spec`` is a fact-model run directory (what ``mechfact facts
train|construct`` writes) or a pretrained model (hub name, local Hugging Face folder, ``.gguf`` file,
``default``): intervene and scores take both; superposition, swap and the readout over sites need a fact world.
The pretrained-model writers of readout, superposition and the LRE are :mod:`mechfact.llm`'s (``run_llm_*``).
"""

from __future__ import annotations

from . import hooks
from .probes.experiments import (InterveneConfig, LogitScoresConfig, ReadoutConfig, SuperpositionConfig, intervene,
                                 superposition)
from .runs import RunDir
from .targets import SwapConfig, freeze_and_swap, load_target

__all__ = ["ReadoutConfig", "SuperpositionConfig", "InterveneConfig", "SwapConfig", "LogitScoresConfig",
           "run_readout", "run_superposition", "run_intervene", "run_swap", "run_scores", "run_llm_readout",
           "run_llm_superposition", "run_llm_lre"]


def _need_world(world, what: str, spec) -> None:
    if world is None:
        raise ValueError(f"probe {what} needs a synthetic fact model (world.json); --model {spec} is a pretrained model")


def _identity(model, spec) -> dict:
    mid = getattr(model, "model_id", None)
    return {"model": str(spec), **({"model_id": mid} if mid else {})}


# ---- runs -------------------------------------------------------------------------------

def run_readout(spec, cfg: ReadoutConfig, out, *, device="cpu", seed: int = 0, progress: bool = False) -> dict:
    """Readouts per relation and site of a fact model (pretrained models: :func:`mechfact.llm.readout.run_llm_probe`)."""
    from .probes.plots import plot_readout
    from .probes.queries import Site, check_hooks
    from .probes.readout import readout

    model, world, ps = load_target(spec, device)
    _need_world(world, "readout --sites", spec)
    _check_relations(ps, cfg.relations)  # before the run directory: a refused run writes nothing
    check_hooks(model, [Site.parse(s).hook for s in cfg.sites])
    run = RunDir(out, cfg, kind="probe.readout", seed=seed, device=str(device), **_identity(model, spec))
    res = readout(model, ps, cfg.sites, relations=cfg.relations, kind=cfg.kind, heldout_fraction=cfg.heldout_fraction,
                  alpha=cfg.alpha, seed=seed)
    return run.finish(res.to_dict(), plot_readout, "fig_readout.png")


def run_superposition(spec, cfg: SuperpositionConfig, out, *, device="cpu", seed: int = 0, progress: bool = False) -> dict:
    from .probes.plots import plot_superposition

    model, world, _ = load_target(spec, device)
    _need_world(world, "superposition", spec)
    run = RunDir(out, cfg, kind="probe.superposition", seed=seed, device=str(device), **_identity(model, spec))
    res = superposition(model, world, cfg.heldout_fraction, seed)
    return run.finish(res.to_dict(), plot_superposition, "fig_superposition.png")


def _default_layer(model, layer: int | None) -> int:
    """``--layer``, checked against the model's blocks (default: the middle block; 0 for a fact model)."""
    from .probes.experiments import default_layer

    return default_layer(model, layer)


def _check_relations(ps, relations) -> None:
    """``--relations`` ids the queries have (ValueError naming the ones they do)."""
    from .probes.queries import check_relation

    for r in relations or ():
        check_relation(ps, r)


def run_intervene(spec, cfg: InterveneConfig, out, *, device="cpu", seed: int = 0, progress: bool = False,
                  **prompts) -> dict:
    from .probes.plots import plot_intervene
    from .probes.queries import check_hooks

    model, _, ps = load_target(spec, device, **prompts)
    layer = _default_layer(model, cfg.layer)  # checked before the run directory: a refused run writes nothing
    _check_relations(ps, cfg.relations)
    _check_relations(ps, [r for pair in cfg.swap_pairs or () for r in pair])
    check_hooks(model, [cfg.site or hooks.mlp_post(layer)])
    run = RunDir(out, cfg, kind="probe.intervene", seed=seed, device=str(device), **_identity(model, spec),
                 **({"prompts": prompts} if prompts else {}))
    res = intervene(model, ps, relations=cfg.relations, site=cfg.site, layer=layer,
                    n_units=cfg.n_units, kind=cfg.kind, swap_pairs=cfg.swap_pairs, seed=seed)
    return run.finish(res.to_dict(), plot_intervene, "fig_intervene.png")


def run_swap(spec, cfg: SwapConfig, out, *, device="cpu", seed: int = 0, progress: bool = False) -> dict:
    from .probes.plots import plot_swap
    from .probes.swap import check_new_seed

    model, world, _ = load_target(spec, device)
    _need_world(world, "swap", spec)
    check_new_seed(world, cfg.new_seed)  # before the run directory: a refused run writes nothing
    run = RunDir(out, cfg, kind="probe.swap", seed=seed, device=str(device), **_identity(model, spec))
    res = freeze_and_swap(model, world, new_seed=cfg.new_seed, retrain=cfg.retrain, seed=seed)
    return run.finish(res.to_dict(), plot_swap, "fig_swap.png")


def run_scores(spec, cfg: LogitScoresConfig, out, *, device="cpu", seed: int = 0, progress: bool = False,
                  **prompts) -> dict:
    from .probes.plots import plot_scores
    from .probes.weights import scores_and_spectra

    model, _, ps = load_target(spec, device, **prompts)
    layer = _default_layer(model, cfg.layer)  # checked before the run directory: a refused run writes nothing
    run = RunDir(out, cfg, kind="probe.scores", seed=seed, device=str(device), **_identity(model, spec),
                 **({"prompts": prompts} if prompts else {}))
    res = scores_and_spectra(model, ps, layer=layer)
    return run.finish(res.to_dict(), plot_scores, "fig_scores.png")


def run_llm_readout(spec, cfg, out, *, device="cpu", seed: int = 0, progress: bool = False, executor=None,
                    kind: str = "probe.readout") -> dict:
    """The layer-wise readout of a pretrained model (:func:`mechfact.llm.readout.run_llm_probe`); ``kind``:
    the run folder's kind (``llm.probe`` for ``mechfact llm probe``)."""
    from .llm.readout import run_llm_probe

    return run_llm_probe(cfg, out, device=device, seed=seed, progress=progress, executor=executor, kind=kind)


def run_llm_superposition(spec, cfg, out, *, device="cpu", seed: int = 0, progress: bool = False) -> dict:
    """The superposition test on a pretrained model's states (:func:`mechfact.llm.superposition.run_llm_superposition`)."""
    from .llm.superposition import run_llm_superposition as run

    return run(cfg, out, device=device, seed=seed, progress=progress)


def run_llm_lre(spec, cfg, out, *, device="cpu", seed: int = 0, progress: bool = False, executor=None) -> dict:
    """Linear relational embeddings (:func:`mechfact.llm.lre.run_llm_lre`)."""
    from .llm.lre import run_llm_lre as run

    return run(cfg, out, device=device, seed=seed, progress=progress, executor=executor)
