"""Layer-wise linear readouts of relational facts from a pretrained model's hidden states.

For every relation: build (k-shot) prompts, extract the subject's hidden state
at every requested layer (:func:`mechfact.probes.queries.collect`, the one
activation collector), mark the facts the model knows
(greedy next token(s) = the object's first token(s)), and score a linear
readout ``state -> object`` on held-out subjects with
:func:`mechfact.probes.readout.nested_layer_readout` -- the readout the synthetic
models use (:func:`mechfact.probes.readout.linear_readout`), at every layer and at
one layer chosen without the test data.

* Splits are by subject (every fact of a subject on one side, one-to-many
  relations too): the subjects are dealt into ``round(1 / heldout_fraction)``
  folds, ``n_splits`` of which are held out in turn (disjoint, so every scored
  fact is scored once); ``split="stratified"`` spreads each object's subjects
  evenly over the folds without forcing any into the test part.
* ``per_layer``: each layer's held-out accuracy, beside the shuffled-label
  control, the majority rate (``chance``), ``prior_baseline`` and ``ceiling``
  (share of test facts whose object the readout can name: a classifier cannot
  name an object absent from training). Descriptive curves: the best of them is
  picked on the test data (``best_on_test_upper_bound``, an optimistic bound).
* ``best_layers`` (one row per relation): the layer chosen by cross-validation
  inside the training subjects (``selected_on: "validation"``), scored once on
  the held-out subjects; the shuffled-label control chooses its layer the same
  way. Every number carries ``_ci`` (Wilson, or bootstrap for the prior) and ``_n``.

* many-to-one relations: ``kind="classifier"`` over the relation's objects.
* one-to-one relations (every object unique, so a held-out subject's object is
  never a training class): ``kind="vector"``; ridge regression onto the
  model's unembedding row of the object's first token, decoded as the nearest
  (cosine) among the relation's objects' rows. Objects that share a first token
  share a class (they are indistinguishable by that token).

:func:`layer_readout` returns the result in memory; :func:`run_llm_probe` (``mechfact
llm probe`` and ``mechfact probe readout`` on a pretrained model) writes it as a
run directory, relation by relation.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .. import hooks, stats
from ..config import DictConfig, check_choice, check_float, check_int, check_int_list
from ..probes.queries import PADDING, ProbeSet, Site, collect, pad_batch
from ..probes.readout import nested_layer_readout, outer_fold_count, subject_splits
from ..results import Result
from ..runs import RunDir
from ..seeding import derive_seed
from .jobs import map_relations
from .models.loading import DTYPES, LanguageModel, check_remote, load_model, worker_model
from .prompts import POSITIONS as PROMPT_POSITIONS
from .prompts import build_prompts, check_template, object_token_ids
from .relations import Relation, as_relations

logger = logging.getLogger(__name__)

SITES = hooks.LAYER_SITES
POSITIONS = ("subject_last", *PROMPT_POSITIONS)  # the probes' vocabulary; subject_last is subject's other name


@dataclass
class ProbeConfig(DictConfig):
    model: str = "default"  # hub name, local HF folder, .gguf file, or "default" (embedded SmolLM2-135M-Instruct)
    relations: str | None = None  # relation file or folder; None = the shipped dataset
    relation_names: list[str] | None = None  # keep only these relations (None = all)
    layers: list[int] | None = None  # None = every layer
    site: str = "resid_post"  # resid_pre | resid_mid | resid_post | attn_out | mlp_out | mlp_post
    position: str = "subject_last"  # subject_last (= subject) | subject_first | last
    k_shot: int = 3  # in-context examples (other subjects of the relation) before each query
    template: int = 0  # which prompt template of each relation
    max_samples: int | None = None  # N evenly spaced samples per relation (None = all)
    known_tokens: int = 1  # a fact is known when the greedy next tokens match the object's first N tokens
    readout_on: str = "all"  # all | known: which facts the readout is fitted/scored on
    known_only: bool = False  # fit and score only the facts the model knows (= readout_on "known")
    heldout_fraction: float = 0.25  # subjects are dealt into round(1 / heldout_fraction) folds; one is held out
    n_splits: int = 3  # folds held out in turn (disjoint test parts; at most round(1 / heldout_fraction))
    split: str = "random"  # random: subjects dealt to folds at random | stratified: each object's subjects spread
    inner_folds: int = 3  # folds of the training subjects that choose the layer (nested cross-validation)
    C: float = 1.0  # logistic-regression regularisation (classifier readout)
    # ridge regularisation (vector readout; features scaled to unit RMS as for fact models). 10, not the fact
    # models' 1: an LLM relation has tens of training subjects against 576-1152 state dimensions, a fact world
    # hundreds of subjects against d <= 128; `mechfact probe readout --alpha` sets either
    alpha: float = 10.0
    dtype: str = "float32"
    batch_size: int = 16
    padding: str = "right"  # right | left (both exact; tested)
    cache_states: bool = True  # disk cache of hidden states (model + prompts + site)

    def __post_init__(self) -> None:
        check_choice("site", self.site, SITES)
        check_choice("position", self.position, POSITIONS)
        check_prompt_options(self)
        check_int("known_tokens", self.known_tokens, 1)
        check_choice("readout_on", self.readout_on, ("all", "known"))
        if not isinstance(self.known_only, bool):
            raise ValueError(f"--known-only {self.known_only!r}: must be true or false")
        check_float("heldout", self.heldout_fraction, lo=0, hi=1, lo_open=True, hi_open=True)
        check_int("splits", self.n_splits, 1, outer_fold_count(self.heldout_fraction))
        check_choice("split", self.split, ("stratified", "random"))
        check_int("inner_folds", self.inner_folds, 2)
        check_float("C", self.C, lo=0, lo_open=True)
        check_float("alpha", self.alpha, lo=0, lo_open=True)
        check_int("batch_size", self.batch_size, 1)
        check_choice("padding", self.padding, PADDING)
        if self.layers is not None:
            check_int_list("layers", self.layers, 0, "give at least one layer, or all")


@dataclass
class PromptOptions(DictConfig):
    """How the prompts of a pretrained model's relations are built, for the probes that take the queries from
    :func:`mechfact.targets.load_target` (intervene, scores): the relations kept, the in-context examples, the
    template, the cap on samples and the precision."""

    relation_names: list[str] | None = None
    dtype: str = "float32"
    k_shot: int = 3
    template: int = 0
    max_samples: int | None = None

    def __post_init__(self) -> None:
        check_prompt_options(self)


def check_prompt_options(cfg) -> None:
    """The checks shared by every LLM config: ``k_shot``, ``template``, ``max_samples``, ``dtype``."""
    check_int("k_shot", cfg.k_shot, 0)
    check_int("template", cfg.template, 0)
    if cfg.max_samples is not None:
        check_int("max_samples", cfg.max_samples, 4)
    check_choice("dtype", cfg.dtype, DTYPES)


@dataclass
class RelationStates:
    """One relation's prompts, hidden states and known-fact mask."""

    relation: Relation
    prompts: list
    states: torch.Tensor  # (layers, n, d_model)
    layers: list[int]
    next_token: torch.Tensor  # (n,)
    object_first: list[int]  # first token of " " + object
    known: np.ndarray  # (n,) bool


def greedy_tokens(lm: LanguageModel, seqs: Sequence[Sequence[int]], n_tokens: int, *, batch_size: int = 16,
                  first: torch.Tensor | None = None) -> torch.Tensor:
    """(n, n_tokens) greedy continuation of each prompt (no KV cache: prompts are short, n_tokens small)."""
    n = len(seqs)
    out = torch.empty((n, n_tokens), dtype=torch.long)
    cur = [list(s) for s in seqs]
    for t in range(n_tokens):
        if t == 0 and first is not None:
            step = first
        else:
            step = torch.empty(n, dtype=torch.long)
            for i in range(0, n, batch_size):
                batch = cur[i:i + batch_size]
                toks, _, _, _ = pad_batch(batch, lm.pad_id, "right")
                with torch.no_grad():
                    logits = lm(toks.to(lm.device))
                last = torch.tensor([len(s) - 1 for s in batch])
                step[i:i + len(batch)] = logits[torch.arange(len(batch)), last].argmax(-1).cpu()
        out[:, t] = step
        for i in range(n):
            cur[i].append(int(step[i]))
    return out


def relation_states(lm: LanguageModel, rel: Relation, cfg: ProbeConfig | None = None, *, layers=None,
                    seed: int = 0, progress: bool = False) -> RelationStates:
    """Prompts of ``rel``, the state at ``cfg.site`` / ``cfg.position`` of every layer, and which facts are known.

    ``layers`` overrides ``cfg.layers`` (None: every layer). The states come from
    :func:`mechfact.probes.queries.collect` (the one activation collector, with its disk cache).
    """
    cfg = cfg or ProbeConfig()
    layers = layers if layers is not None else cfg.layers
    layers = list(range(lm.n_layers)) if layers is None else [lm.check_layer(int(l), "--layers") for l in layers]
    prompts = build_prompts(rel, lm.tokenizer, lm.bos_id, k=cfg.k_shot, template=cfg.template, seed=seed)
    obj_toks = [object_token_ids(lm.tokenizer, p.object) for p in prompts]
    ps = ProbeSet.from_prompts(prompts, object_tokens=[o[0] for o in obj_toks], pad_id=lm.pad_id,
                               relation_names=[rel.name])
    sites = [Site(hooks.layer_site(cfg.site, layer), cfg.position) for layer in layers]
    acts = collect(lm, ps, sites, batch_size=cfg.batch_size, padding=cfg.padding, cache=cfg.cache_states,
                   progress=progress, desc=rel.name)
    states = torch.stack([acts[s] for s in sites])
    if cfg.known_tokens == 1:
        known = np.array([int(t) == o[0] for t, o in zip(acts.next_token, obj_toks)])
    else:
        greedy = greedy_tokens(lm, [p.tokens for p in prompts], cfg.known_tokens, batch_size=cfg.batch_size,
                               first=acts.next_token)
        known = np.array([greedy[i, :min(cfg.known_tokens, len(o))].tolist() == o[:cfg.known_tokens]
                          for i, o in enumerate(obj_toks)])
    return RelationStates(relation=rel, prompts=prompts, states=states, layers=layers,
                          next_token=acts.next_token, object_first=[o[0] for o in obj_toks], known=known)


def readout_targets(rs: RelationStates, lm: LanguageModel, idx: np.ndarray):
    """(kind, object ids, object vectors or None) for the readout over samples ``idx``."""
    rel = rs.relation
    if rel.many_objects:
        objs = [rel.objects[i] for i in idx]
        classes = {o: c for c, o in enumerate(dict.fromkeys(objs))}
        return "classifier", np.array([classes[o] for o in objs]), None
    firsts = [rs.object_first[i] for i in idx]
    uniq = list(dict.fromkeys(firsts))
    cls = {t: c for c, t in enumerate(uniq)}
    W_U = lm.bridge.W_U.detach().float().cpu()  # (d_model, vocab)
    vecs = W_U[:, torch.tensor(uniq)].T.numpy()  # (n_classes, d_model)
    return "vector", np.array([cls[t] for t in firsts]), vecs


def _readout_facts(rs: RelationStates, cfg: ProbeConfig) -> tuple[str, np.ndarray]:
    """("known" or "all", the indices of the facts the readout is fitted and scored on)."""
    if cfg.known_only or cfg.readout_on == "known":
        return "known", np.flatnonzero(rs.known)
    return "all", np.arange(len(rs.prompts))


_RENAME = {"accuracy": "readout_accuracy", "accuracy_ci": "readout_accuracy_ci", "accuracy_n": "readout_accuracy_n",
           "accuracy_range": "readout_accuracy_range"}
_SHARED = {**{v: k for k, v in _RENAME.items()}, "readout_kind": "kind"}  # result.json row keys -> records' keys


def relation_readout(rs: RelationStates, lm: LanguageModel, cfg: ProbeConfig, seed: int
                     ) -> tuple[list[dict], dict | None]:
    """One relation's readout: (a row per layer, the row of the layer chosen without the test data).

    Subject splits (:func:`mechfact.probes.readout.subject_splits`), then
    :func:`mechfact.probes.readout.nested_layer_readout`: the layer is chosen by ``cfg.inner_folds``-fold
    cross-validation over each split's training subjects and scored once on its held-out subjects. Too few
    facts or subjects for the folds: ``([], None)`` with a warning.
    """
    facts, idx = _readout_facts(rs, cfg)
    name = rs.relation.name
    subjects = np.array([rs.relation.subjects[i] for i in idx], dtype=object)
    n_subj = len(set(subjects.tolist()))
    need = max(4, outer_fold_count(cfg.heldout_fraction) + 1)
    if len(idx) < 4 or n_subj < need:
        logger.warning("%s: %d %s facts of %d subjects for the readout (need %d subjects); skipped", name, len(idx),
                       facts, n_subj, need)
        return [], None
    kind, y, vecs = readout_targets(rs, lm, idx)
    strata = y if cfg.split == "stratified" and kind == "classifier" else None
    splits = subject_splits(subjects, cfg.heldout_fraction, cfg.n_splits, seed=derive_seed(seed, f"llm.split.{name}"),
                            strata=strata)
    out = nested_layer_readout([rs.states[j, idx].double().numpy() for j in range(len(rs.layers))], y, subjects,
                               splits, kind=kind, object_vectors=vecs, inner_folds=cfg.inner_folds, strata=strata,
                               C=cfg.C, alpha=cfg.alpha, seed=derive_seed(seed, f"llm.readout.{name}"),
                               layer_names=list(rs.layers))
    head = {"relation": name, "readout_kind": kind, "facts": facts}
    rows = [{**head, **{_RENAME.get(k, k): v for k, v in r.items()}} for r in out["per_layer"]]
    return rows, {**head, **{_RENAME.get(k, k): v for k, v in out["selected"].items()}}


def layer_readouts(rs: RelationStates, lm: LanguageModel, cfg: ProbeConfig, seed: int) -> list[dict]:
    """Readout rows (one per layer) of one relation's states, pooled over ``cfg.n_splits`` held-out subject
    folds (each scored fact once): descriptive curves; :func:`relation_readout` also chooses a layer."""
    return relation_readout(rs, lm, cfg, seed)[0]


def mean_curves(result: dict) -> list[dict]:
    """Mean readout / control / chance / prior / ceiling per layer over relations, per relation kind and overall,
    each with a bootstrap interval over the relations (``_n``: relations). Descriptive: each layer is scored on
    the test subjects; the layer to report is chosen in :func:`best_layers`."""
    kinds = {r["relation"]: r["kind"] for r in result["relations"]}
    out = []
    for group in ("many_to_one", "one_to_one", "one_to_many", "many_to_many", "all"):
        rows = [r for r in result["per_layer"] if group == "all" or kinds.get(r["relation"]) == group]
        for layer in sorted({r["layer"] for r in rows}):
            at = [r for r in rows if r["layer"] == layer]
            row = {"group": group, "layer": layer, "n_relations": len(at)}
            for k in ("readout_accuracy", "control_accuracy", "chance", "prior_baseline", "ceiling"):
                vals = [float(r[k]) for r in at if r.get(k) is not None]
                est = stats.bootstrap(vals, seed=derive_seed(0, f"llm.mean.{group}.{k}", int(layer)))
                row.update(stats.fields(f"mean_{k}", est) if vals else
                           {f"mean_{k}": float("nan"), f"mean_{k}_ci": [None, None], f"mean_{k}_n": 0})
            out.append(row)
    return out


def best_layers(result: dict) -> list[dict]:
    """Per relation: the readout at the layer chosen on validation folds of the training subjects
    (``selected_layer``; ``best_layer`` is the same layer), scored on the held-out subjects, beside the
    control (which chose its own layer the same way), the majority rate, the prior baseline, the ceiling, and
    ``best_on_test_upper_bound`` (the per-layer maximum on the test subjects: optimistic, not an estimate)."""
    out = []
    for rel in result["relations"]:
        sel = rel.get("selection")
        if sel:
            out.append({"relation": rel["relation"], "kind": rel["kind"], "best_layer": sel["selected_layer"],
                        **{k: v for k, v in sel.items() if k != "relation"}})
    return out


def _relation_record(rel: Relation, rs: RelationStates, selection: dict | None = None) -> dict:
    return {"relation": rel.name, "kind": rel.kind, "n_samples": len(rel), "n_known": int(rs.known.sum()),
            "n_objects": len(rel.object_set), "known_subjects": [p.subject for p, k in zip(rs.prompts, rs.known) if k],
            "selection": selection}


def _probe_relation(lm: LanguageModel, rel: Relation, cfg: ProbeConfig, layers, seed: int,
                    progress: bool) -> tuple[dict, list[dict]]:
    rs = relation_states(lm, rel, cfg, layers=layers, seed=seed, progress=progress)
    rows, sel = relation_readout(rs, lm, cfg, seed)
    if sel is not None:
        logger.info("%s: %d/%d known; readout %.2f at layer %s (chosen on validation folds; control %.2f)",
                    rel.name, int(rs.known.sum()), len(rel), sel["readout_accuracy"], sel["selected_layer"],
                    sel["control_accuracy"])
    return _relation_record(rel, rs, sel), rows


@dataclass(frozen=True)
class LayerReadoutResult(Result):
    """What :func:`layer_readout` returns: per-layer rows, per-relation facts, mean curves and, per relation, the
    readout at the layer chosen on validation folds of the training subjects (``best_layers``)."""

    model: str
    n_layers: int
    relations: list[dict]  # relation, kind, n_samples, n_known, n_objects, known_subjects, selection
    per_layer: list[dict]  # layer, relation, readout_kind, readout_accuracy(_ci, _n), control_accuracy, chance, ...
    mean_per_layer: list[dict] = field(default_factory=list)
    best_layers: list[dict] = field(default_factory=list)

    @property
    def records(self) -> list[dict]:
        """One row per (relation, layer), in the probes' shared keys (``accuracy``, ``kind``, as
        :func:`mechfact.readout` rows); ``per_layer`` keeps result.json's ``readout_accuracy`` / ``readout_kind``."""
        return [{_SHARED.get(k, k): v for k, v in r.items()} for r in self.per_layer]

    def accuracy(self, relation: str) -> dict[int, float]:
        """{layer: held-out readout accuracy} of one relation."""
        return {r["layer"]: r["readout_accuracy"] for r in self.per_layer if r["relation"] == relation}

    def to_dict(self) -> dict:
        return asdict(self)


def layer_readout(lm: LanguageModel, relations=None, layers="all", *, seed: int = 0, progress: bool = False,
                  **options) -> LayerReadoutResult:
    """Layer-wise linear readout of the object from the subject's state, per relation, on held-out subjects.

    ``lm``: a :class:`~mechfact.llm.models.loading.LanguageModel` (:func:`mechfact.load_model`). ``relations``: a
    Relation, a list of them, a relation file / folder, or None (the shipped dataset). ``layers``: ``"all"``
    or a list. ``options``: any :class:`ProbeConfig` field (``site``, ``position``, ``k_shot``, ``template``,
    ``max_samples``, ``known_tokens``, ``readout_on``, ``known_only``, ``heldout_fraction``, ``n_splits``,
    ``split``, ``inner_folds``, ``C``, ``alpha``, ``batch_size``, ``padding``, ``cache_states``), with the same
    defaults as ``mechfact llm probe``. ``best_layers`` holds each relation's readout at the layer chosen
    without the test data; ``per_layer`` / ``mean_per_layer`` are the descriptive curves.
    """
    cfg = ProbeConfig(layers=None if layers == "all" else list(layers), **options)
    rels = [r.subset(cfg.max_samples) for r in as_relations(relations, cfg.relation_names)]
    for r in rels:
        check_template(r, cfg.template)
    layers = None if cfg.layers is None else [lm.check_layer(int(l), "--layers") for l in cfg.layers]
    result = {"model": lm.name, "n_layers": lm.n_layers, "relations": [], "per_layer": []}
    for rel in rels:
        record, rows = _probe_relation(lm, rel, cfg, layers, seed, progress)
        result["relations"].append(record)
        result["per_layer"].extend(rows)
    result["mean_per_layer"] = mean_curves(result)
    result["best_layers"] = best_layers(result)
    return LayerReadoutResult(**result)


def _probe_job(cfg: ProbeConfig, layers, seed: int, rel: Relation, device: str) -> tuple[dict, list[dict]]:
    """One relation's record and rows in an executor worker (which loads ``cfg.model`` once)."""
    return _probe_relation(worker_model(cfg.model, device, cfg.dtype), rel, cfg, layers, seed, False)


def run_llm_probe(cfg: ProbeConfig, out: str | Path, *, device: torch.device | str = "cpu", seed: int = 0,
                  lm: LanguageModel | None = None, progress: bool = False, kind: str = "llm.probe",
                  executor=None) -> dict:
    """:func:`layer_readout` as a run directory: config.json, result.json (per relation as it finishes), meta.json,
    fig_*.png. Resumes: relations already in ``out/result.json`` are skipped. ``lm`` reuses a loaded model.
    ``executor``: a Ray executor runs one task per relation, each worker loading ``cfg.model`` once; rows are
    kept in relation order, so result.json is the local run's whatever order relations finish in."""
    from . import plots

    check_remote(executor, lm)  # before anything is loaded or written
    rels = [r.subset(cfg.max_samples) for r in as_relations(cfg.relations, cfg.relation_names)]
    lm = lm or load_model(cfg.model, device=device, dtype=cfg.dtype)
    layers = None if cfg.layers is None else [lm.check_layer(int(l), "--layers") for l in cfg.layers]
    for r in rels:
        check_template(r, cfg.template)
    run = RunDir(out, cfg, kind=kind, seed=seed, device=str(lm.device), model_id=lm.model_id)
    result = run.read_result({"model": lm.name, "n_layers": lm.n_layers, "relations": [], "per_layer": []})
    done = {r["relation"] for r in result["relations"]}
    order = {r.name: i for i, r in enumerate(rels)}

    def add(name: str, value: tuple[dict, list[dict]]) -> None:
        record, rows = value
        result["relations"].append(record)
        result["per_layer"].extend(rows)
        for key in ("relations", "per_layer"):  # relation order (stable: layers stay in order)
            result[key].sort(key=lambda x: order.get(x["relation"], len(order)))
        run.write_result(result)

    map_relations([rel for rel in rels if rel.name not in done], executor, lm,
                  lambda rel: _probe_relation(lm, rel, cfg, layers, seed, progress),
                  lambda rel: functools.partial(_probe_job, cfg, layers, seed), add)
    result["mean_per_layer"] = mean_curves(result)
    result["best_layers"] = best_layers(result)
    run.write_result(result)
    for plot, fig in ((plots.plot_readout, "fig_readout.png"), (plots.plot_readout_mean, "fig_readout_mean.png")):
        plot(result, run.file(fig))
    return run.finish(result, plots.plot_known, "fig_known.png", model=lm.name, model_id=lm.model_id)


QUICK_RELATIONS = ["animal_class", "city_country", "country_continent", "country_capital"]


def quick_probe_config(**over) -> ProbeConfig:
    """A small probe for the quickstart: 4 relations, 7 layers, 32 samples each, one split."""
    base = dict(relation_names=list(QUICK_RELATIONS), layers=[0, 5, 10, 15, 20, 25, 29], max_samples=32, n_splits=1)
    return ProbeConfig(**{**base, **over})
