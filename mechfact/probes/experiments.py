"""The probes as in-memory functions, and the ``run_*`` wrappers that add run directories and figures.

In memory (what ``import mechfact`` exports): :func:`superposition`,
:func:`intervene`, and :func:`probe_all` (every probe once on a fact model),
beside :func:`~mechfact.probes.readout.readout`,
:func:`~mechfact.probes.swap.freeze_and_swap` and
:func:`~mechfact.probes.weights.scores_and_spectra`. Each returns a result object
with ``to_dict()``.

Run directories (``mechfact probe ...``): ``run_*(spec, cfg, out)`` loads the
target with :func:`load_target`, runs the in-memory probe and writes
``config.json`` (first), ``result.json``, ``meta.json`` and ``fig_*.png`` drawn
from result.json (:mod:`mechfact.probes.plots`). ``spec`` is a fact-model run
directory (what ``mechfact facts train|construct`` writes) or a pretrained model
(hub name, local Hugging Face folder, ``.gguf`` file, ``default``): readout,
intervene and scores take both; superposition and swap need a fact world.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from .. import hooks
from ..config import DictConfig, bad, check_choice, check_float, check_int, check_int_list
from ..facts.train import TrainConfig
from ..runs import RunDir
from .queries import ProbeSet, as_probe_set
from .readout import DEFAULT_SITES
from .swap import RETRAIN

logger = logging.getLogger(__name__)


# ---- configs ------------------------------------------------------------------------

@dataclass
class ReadoutConfig(DictConfig):
    sites: list[str] = field(default_factory=lambda: list(DEFAULT_SITES))
    relations: list[int] | None = None  # None = all
    kind: str = "auto"  # auto | vector | classifier
    heldout_fraction: float = 0.25  # share of subjects held out
    alpha: float = 1.0  # ridge strength (vector readouts; features scaled to unit RMS)

    def __post_init__(self) -> None:
        from .queries import Site

        if not self.sites:
            raise ValueError("--sites: give at least one HOOK@POSITION")
        self.sites = [str(Site.parse(s)) for s in self.sites]
        if self.relations is not None:
            check_int_list("relations", self.relations, 0, "give at least one relation id")
        check_choice("kind", self.kind, ("auto", "vector", "classifier"))
        check_float("heldout", self.heldout_fraction, lo=0, hi=1, lo_open=True, hi_open=True)
        check_float("alpha", self.alpha, lo=0, lo_open=True)


@dataclass
class SuperpositionConfig(DictConfig):
    heldout_fraction: float = 0.2  # share of subjects held out of the fit

    def __post_init__(self) -> None:
        check_float("heldout", self.heldout_fraction, lo=0, hi=1, lo_open=True, hi_open=True)


@dataclass
class InterveneConfig(DictConfig):
    relations: list[int] | None = None  # relations whose selector units are ablated (None = all)
    site: str | None = None  # units to ablate (post-ReLU); None = blocks.<layer>.mlp.hook_post
    n_units: int | None = None  # None = every unit preferring the relation
    kind: str = "zero"  # zero | mean (ablation kind)
    swap_pairs: list[list[int]] | None = None  # relation-token swaps (r, r'); None = (r, r+1 mod R)
    layer: int | None = None  # block of the default site (None: 0 for a fact model, the middle block of an LLM)

    def __post_init__(self) -> None:
        if self.relations is not None:
            check_int_list("relations", self.relations, 0, "give at least one relation id")
        if self.n_units is not None:
            check_int("units", self.n_units, 1)
        check_choice("ablation", self.kind, ("zero", "mean"))
        if self.layer is not None:
            check_int("layer", self.layer, 0)
        if self.swap_pairs is not None:
            for pair in self.swap_pairs:
                if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                    raise ValueError(f"swap_pairs {self.swap_pairs}: expected pairs [r, r'] of relation ids")
                check_int_list("swap_pairs", list(pair), 0)


@dataclass
class SwapConfig(DictConfig):
    new_seed: int = 1  # seed of the new random bijections
    retrain: TrainConfig = field(default_factory=lambda: RETRAIN)  # how fresh embeddings are retrained

    def __post_init__(self) -> None:
        if isinstance(self.new_seed, bool) or not isinstance(self.new_seed, int):
            raise bad("new_seed", self.new_seed, "must be an integer")
        if not isinstance(self.retrain, TrainConfig):
            raise ValueError(f"retrain: expected a TrainConfig, got {type(self.retrain).__name__}")


@dataclass
class LogitScoresConfig(DictConfig):
    layer: int | None = None  # MLP block whose effective maps are analysed (None: 0 / the middle block of an LLM)

    def __post_init__(self) -> None:
        if self.layer is not None:
            check_int("layer", self.layer, 0)


# ---- in-memory probes -------------------------------------------------------------------

def superposition(model, world=None, heldout_fraction: float = 0.2, seed: int = 0, **options):
    """Is each subject's representation a superposition of its attribute vectors?

    * a fact model and its FactWorld (:mod:`.superposition`): fits the subject embeddings on ``1 -
      heldout_fraction`` of the subjects, scores R^2 on the rest, beside a shuffled control; returns a
      :class:`~mechfact.probes.superposition.SuperpositionResult`;
    * a pretrained :class:`~mechfact.llm.loading.LanguageModel` and relations that share subjects (default:
      the shipped countries under five relations): the same test on the subject's state at every layer,
      with its controls (:func:`mechfact.llm.superposition.llm_superposition`; ``options``: ``layers``,
      ``attributes``, ``n_splits``, ``prompt``, ``standardize``, ...); returns an ``LlmSuperpositionResult``.
    """
    if hasattr(model, "bridge") and hasattr(model, "tokenizer"):
        from ..llm.superposition import llm_superposition

        return llm_superposition(model, world, heldout_fraction=heldout_fraction, seed=seed, **options)
    if world is None or options:
        raise ValueError("superposition(fact_model, world): a fact model needs its FactWorld"
                         + (f"; unknown options {sorted(options)}" if options else ""))
    from .superposition import split_entities, superposition_test
    from .swap import attribute_vectors, subject_embeddings

    N = world.n_entities
    tr, te = split_entities(N, heldout_fraction, seed)
    return superposition_test(subject_embeddings(model, N), attribute_vectors(model, N), world.perms, tr, te,
                              seed=seed)


@dataclass
class InterventionResult:
    """Selector-unit ablation per relation (``per_relation``) plus relation-token swaps."""

    site: str
    per_relation: list[dict]  # relation, ablated units, accuracy on it / the others / with random units
    clean_per_relation: list[float]
    chance: float
    relation_swaps: list[dict]
    selectivity: dict = field(repr=False, default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["relation_swaps"] = d.pop("relation_swaps")  # result.json key order: swaps last
        return d

    @property
    def records(self) -> list[dict]:
        """One row per ablated relation (without the unit lists)."""
        return [{k: v for k, v in r.items() if k not in ("ablated_units", "random_units", "intervention")}
                for r in self.per_relation]


def intervene(model, queries, *, relations=None, site: str | None = None, layer: int = 0, n_units: int | None = None,
              kind: str = "zero", swap_pairs=None, seed: int = 0) -> InterventionResult:
    """Ablate each relation's selector units (and as many random ones), and swap relation tokens.

    ``queries``: a ProbeSet or a FactWorld. ``site`` defaults to ``blocks.<layer>.mlp.hook_post``.
    Relation-token swaps need queries with a relation token (fact models); for pretrained-model prompts
    only the ablation runs.
    """
    from .patching import ablate_relation_units, relation_swap

    ps = as_probe_set(queries)
    site = site or hooks.mlp_post(layer)
    ab = ablate_relation_units(model, ps, relations, site=site, n_units=n_units, kind=kind, seed=seed)
    rels = ps.relation_ids
    pairs = swap_pairs
    if pairs is None and ps.relation_pos is not None and len(rels) > 1:
        pairs = [[r, rels[(i + 1) % len(rels)]] for i, r in enumerate(rels)]
    swaps = [relation_swap(model, ps, a, b).to_dict() for a, b in (pairs or [])]
    return InterventionResult(ab.site, ab.per_relation, ab.clean_per_relation, ab.chance, swaps, ab.selectivity)


def probe_all(model, world, *, seed: int = 0, swap: SwapConfig | None = None, readout_sites=None) -> dict:
    """Superposition, readout (embedding site), ablation + relation swaps, freeze-and-swap: one dict."""
    from .readout import readout
    from .swap import freeze_and_swap

    ps = ProbeSet.from_world(world)
    sp = superposition(model, world, seed=seed)
    rd = readout(model, ps, readout_sites or [f"{hooks.embed()}@subject"], seed=seed)
    iv = intervene(model, ps, seed=seed)
    swap = swap or SwapConfig()
    sw = freeze_and_swap(model, world, new_seed=swap.new_seed, retrain=swap.retrain, sfit=sp.fit, seed=seed)
    return {"superposition": sp.to_dict(), "readout": rd.to_dict(), "intervene": iv.to_dict(), "swap": sw.to_dict()}


def summary(res: dict) -> dict:
    """The headline numbers of :func:`probe_all` (per relation where relations differ)."""
    sp, rd, iv, sw = res["superposition"], res["readout"]["per_relation"], res["intervene"], res["swap"]
    emb = [r["accuracy"] for r in rd if r["site"].startswith(hooks.embed())]
    emb_c = [r["control_accuracy"] for r in rd if r["site"].startswith(hooks.embed())]
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
          retrain_steps: int = 30, device: str | torch.device = "cpu") -> dict:
    """A fast small version for the quickstart: build (or train) a model, run every probe once, return numbers.

    ``model="construct"``: the explicit construction (block size 24; a few
    seconds). ``model="trained"``: a d = 32, m = 32 model trained in the L2
    regime of docs/results_probes.md (coupled L2 1e-3, 1500 full-batch Adam
    steps; 20-50 s at N = 128 on one CPU thread).
    Returns :func:`summary` of :func:`probe_all` plus ``model`` and ``train_accuracy``.
    """
    from ..facts import FactWorld, build_fact_model, build_single_hop, evaluate, train

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
            "train_accuracy": evaluate(m, world)["accuracy"], **summary(res)}


# ---- targets of the probe commands ---------------------------------------------------------

def is_fact_run(spec) -> bool:
    """Whether ``spec`` names a fact-model run directory (``world.json`` in it, or next to a bare ``model/``)."""
    from ..facts.runio import WORLD_FILE

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
    pretrained model (:func:`mechfact.llm.loading.load_model`: hub name, local Hugging Face folder, ``.gguf``
    file, ``default``) with the prompts of ``prompts`` (:func:`mechfact.llm.prompts.probe_set` options:
    ``relations``, ``relation_names``, ``k_shot``, ``template``, ``max_samples``, ``seed``, ``dtype``).
    """
    from ..facts.runio import load_fact_run

    if check_target(spec) == "fact":
        model, world = load_fact_run(spec, device=device)
        return model.eval(), world, ProbeSet.from_world(world)
    from ..llm.loading import load_model
    from ..llm.prompts import probe_set
    from ..llm.relations import load_relations

    dtype = prompts.pop("dtype", "float32")
    rels = load_relations(prompts.pop("relations", None), prompts.pop("relation_names", None))
    lm = load_model(spec, device=device, dtype=dtype)
    return lm, None, probe_set(lm, rels, **prompts)


def _need_world(world, what: str, spec) -> None:
    if world is None:
        raise ValueError(f"probe {what} needs a synthetic fact model (world.json); --model {spec} is a pretrained model")


def _identity(model, spec) -> dict:
    mid = getattr(model, "model_id", None)
    return {"model": str(spec), **({"model_id": mid} if mid else {})}


# ---- runs -------------------------------------------------------------------------------

def run_readout(spec, cfg: ReadoutConfig, out, *, device="cpu", seed: int = 0) -> dict:
    """Readouts per relation and site of a fact model (pretrained models: :func:`mechfact.llm.probe.run_llm_probe`)."""
    from .plots import plot_readout
    from .readout import readout

    from .queries import Site, check_hooks

    model, world, ps = load_target(spec, device)
    _need_world(world, "readout --sites", spec)
    _check_relations(ps, cfg.relations)  # before the run directory: a refused run writes nothing
    check_hooks(model, [Site.parse(s).hook for s in cfg.sites])
    run = RunDir(out, cfg, kind="probe.readout", seed=seed, device=str(device), **_identity(model, spec))
    res = readout(model, ps, cfg.sites, relations=cfg.relations, kind=cfg.kind, heldout_fraction=cfg.heldout_fraction,
                  alpha=cfg.alpha, seed=seed)
    return run.finish(res.to_dict(), plot_readout, "fig_readout.png")


def run_superposition(spec, cfg: SuperpositionConfig, out, *, device="cpu", seed: int = 0) -> dict:
    from .plots import plot_superposition

    model, world, _ = load_target(spec, device)
    _need_world(world, "superposition", spec)
    run = RunDir(out, cfg, kind="probe.superposition", seed=seed, device=str(device), **_identity(model, spec))
    res = superposition(model, world, cfg.heldout_fraction, seed)
    return run.finish(res.to_dict(), plot_superposition, "fig_superposition.png")


def _default_layer(model, layer: int | None) -> int:
    """``--layer``, checked against the model's blocks (default: 0 for a fact model, the middle block of an LLM)."""
    n = getattr(model, "n_layers", None)
    if layer is None:
        return 0 if n is None else n // 2
    blocks = n if n is not None else (len(model.blocks) if hasattr(model, "blocks") else None)
    if blocks is not None and layer >= blocks:
        raise ValueError(f"--layer {layer}: out of range; the model has layers 0..{blocks - 1}")
    return layer


def _check_relations(ps, relations) -> None:
    """``--relations`` ids the queries have (ValueError naming the ones they do)."""
    from .queries import check_relation

    for r in relations or ():
        check_relation(ps, r)


def run_intervene(spec, cfg: InterveneConfig, out, *, device="cpu", seed: int = 0, **prompts) -> dict:
    from .plots import plot_intervene

    from .queries import check_hooks

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


def run_swap(spec, cfg: SwapConfig, out, *, device="cpu", seed: int = 0) -> dict:
    from .plots import plot_swap
    from .swap import freeze_and_swap

    from .swap import check_new_seed

    model, world, _ = load_target(spec, device)
    _need_world(world, "swap", spec)
    check_new_seed(world, cfg.new_seed)  # before the run directory: a refused run writes nothing
    run = RunDir(out, cfg, kind="probe.swap", seed=seed, device=str(device), **_identity(model, spec))
    res = freeze_and_swap(model, world, new_seed=cfg.new_seed, retrain=cfg.retrain, seed=seed)
    return run.finish(res.to_dict(), plot_swap, "fig_swap.png")


def run_scores(spec, cfg: LogitScoresConfig, out, *, device="cpu", seed: int = 0, **prompts) -> dict:
    from .plots import plot_scores
    from .weights import scores_and_spectra

    model, _, ps = load_target(spec, device, **prompts)
    layer = _default_layer(model, cfg.layer)  # checked before the run directory: a refused run writes nothing
    run = RunDir(out, cfg, kind="probe.scores", seed=seed, device=str(device), **_identity(model, spec),
                 **({"prompts": prompts} if prompts else {}))
    res = scores_and_spectra(model, ps, layer=layer)
    return run.finish(res.to_dict(), plot_scores, "fig_scores.png")
