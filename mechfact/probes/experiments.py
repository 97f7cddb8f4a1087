"""The probes as in-memory functions on any hooked model: :func:`superposition` (fact models),
:func:`intervene`, :func:`probe_all` (every probe once on a fact model) and :func:`summary`, beside
:func:`~mechfact.probes.readout.readout`, :func:`~mechfact.probes.swap.freeze_and_swap` and
:func:`~mechfact.probes.weights.scores_and_spectra`; and the configs of ``mechfact probe``. Each probe
returns a result object with ``to_dict()``.

What ``import mechfact`` exports for fact models and pretrained models alike (``mechfact.superposition``,
``mechfact.probe_all``, ``mechfact.freeze_and_swap`` with the fact trainer as default) is in
:mod:`mechfact.targets`; the run directories of ``mechfact probe ...`` in :mod:`mechfact.probe_runs`.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

import numpy as np

from .. import hooks
from ..config import DictConfig, check_choice, check_float, check_int, check_int_list
from ..results import MappingResult, Result
from .protocols import FactWorldLike, HookedModel, SwapSpec
from .queries import ProbeSet, as_probe_set
from .readout import DEFAULT_SITES

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
    """Options of the superposition test on a synthetic fact model (``mechfact probe superposition``): the
    held-out share. Not :class:`mechfact.llm.superposition.LlmSuperpositionConfig`, which configures the test on a
    pretrained language model."""

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
class LogitScoresConfig(DictConfig):
    layer: int | None = None  # MLP block whose effective maps are analysed (None: 0 / the middle block of an LLM)

    def __post_init__(self) -> None:
        if self.layer is not None:
            check_int("layer", self.layer, 0)


# ---- in-memory probes -------------------------------------------------------------------

def superposition(model: HookedModel, world: FactWorldLike, heldout_fraction: float = 0.2, seed: int = 0):
    """Is each subject's representation a superposition of its attribute vectors? (a fact model and its world)

    Fits the subject embeddings on ``1 - heldout_fraction`` of the subjects, scores R^2 on the rest, beside
    a shuffled control (:mod:`.superposition`); returns a
    :class:`~mechfact.probes.superposition.SuperpositionResult`. :func:`mechfact.superposition` also takes a
    pretrained model (:func:`mechfact.targets.superposition`).
    """
    if world is None:
        raise ValueError("superposition(fact_model, world): a fact model needs its FactWorld")
    from .superposition import split_entities, superposition_test
    from .swap import attribute_vectors, subject_embeddings

    N = world.n_entities
    tr, te = split_entities(N, heldout_fraction, seed)
    return superposition_test(subject_embeddings(model, N), attribute_vectors(model, N), world.perms, tr, te,
                              seed=seed)


@dataclass(frozen=True)
class InterventionResult(Result):
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


def default_layer(model, layer: int | None = None) -> int:
    """``layer``, checked against the model's blocks; None: the middle block (``n_layers // 2``: 0 for a
    one-layer fact model), as the ``--layer`` default of the commands."""
    n = getattr(model, "n_layers", None)
    if n is None and hasattr(model, "blocks"):
        n = len(model.blocks)
    if layer is None:
        return 0 if n is None else n // 2
    if n is not None and not 0 <= layer < n:
        raise ValueError(f"--layer {layer}: out of range; the model has layers 0..{n - 1}")
    return layer


def intervene(model: HookedModel, queries, *, relations=None, site: str | None = None, layer: int | None = None,
              n_units: int | None = None, kind: str = "zero", swap_pairs=None, seed: int = 0) -> InterventionResult:
    """Ablate each relation's selector units (and as many random ones), and swap relation tokens.

    ``queries``: a ProbeSet or a FactWorld. ``site`` defaults to ``blocks.<layer>.mlp.hook_post``, ``layer`` to
    the middle block (:func:`default_layer`, as ``mechfact probe intervene``).
    Relation-token swaps need queries with a relation token (fact models); for pretrained-model prompts
    only the ablation runs.
    """
    from .patching import ablate_relation_units, relation_swap

    ps = as_probe_set(queries)
    site = site or hooks.mlp_post(default_layer(model, layer))
    ab = ablate_relation_units(model, ps, relations, site=site, n_units=n_units, kind=kind, seed=seed)
    rels = ps.relation_ids
    pairs = swap_pairs
    if pairs is None and ps.relation_pos is not None and len(rels) > 1:
        pairs = [[r, rels[(i + 1) % len(rels)]] for i, r in enumerate(rels)]
    swaps = [relation_swap(model, ps, a, b).to_dict() for a, b in (pairs or [])]
    return InterventionResult(ab.site, ab.per_relation, ab.clean_per_relation, ab.chance, swaps, ab.selectivity)


@dataclass(frozen=True)
class ProbeAllResult(MappingResult):
    """Every probe of :func:`probe_all`, each as its ``to_dict()``; read as a dict of those four.
    ``records``: one row, the headline numbers (:func:`summary`)."""

    superposition: dict
    readout: dict
    intervene: dict
    swap: dict

    @property
    def records(self) -> list[dict]:
        return [summary(self)]


def probe_all(model: HookedModel, world: FactWorldLike, *, swap: SwapSpec | None = None, seed: int = 0,
              readout_sites=None) -> ProbeAllResult:
    """Superposition, readout (embedding site), ablation + relation swaps, freeze-and-swap: one
    :class:`ProbeAllResult` (keys ``superposition``, ``readout``, ``intervene``, ``swap``).

    ``swap`` says how the swapped embeddings are retrained (:func:`mechfact.targets.probe_all` defaults it).
    """
    from .readout import readout
    from .swap import freeze_and_swap

    if swap is None:
        raise ValueError("probe_all: pass swap= (mechfact.targets.SwapConfig), or use mechfact.probe_all")
    ps = ProbeSet.from_world(world)
    sp = superposition(model, world, seed=seed)
    rd = readout(model, ps, readout_sites or [f"{hooks.embed()}@subject"], seed=seed)
    iv = intervene(model, ps, seed=seed)
    sw = freeze_and_swap(model, world, new_seed=swap.new_seed, retrain=swap.retrainer(), sfit=sp.fit, seed=seed)
    return ProbeAllResult(superposition=sp.to_dict(), readout=rd.to_dict(), intervene=iv.to_dict(), swap=sw.to_dict())


def summary(res) -> dict:
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

