"""Linear relational embeddings (Hernandez et al., ICLR 2024): faithfulness and causality.

For a relation and a subject layer ``l``:

* ``s`` = the subject's last-token ``resid_post`` at layer ``l`` in its
  prompt; ``z`` = the last layer's ``resid_post`` at the prompt's last token
  (before the final norm).
* ``J_i = dz/ds`` at training fact ``i``; ``J = mean_i J_i``,
  ``b = mean_i (z_i - J_i s_i)``; ``LRE(s) = beta * J s + b``.

Two protocols (``LreConfig.protocol``):

* ``authors`` (default) -- as the authors' sweep (evandez/relations) runs it, with every choice made on
  training facts (:mod:`mechfact.llm.lre.protocol_authors`): per trial an object-balanced split, the training facts as
  the in-context examples of every prompt, test facts filtered under that prompt (the fact's own object),
  faithfulness at a fixed beta and at the beta best on the training facts (leave-one-out), causality toward
  other test facts at the rank best on the training facts, baselines and bootstrap intervals over subjects.
* ``mechfact`` -- the first protocol: k random in-context examples from the
  whole relation, known = one prompt's greedy first token equals the object's,
  one train/test split, beta fixed, the projection edit.

Jacobians are exact (:func:`mechfact.llm.jacobian.jacobian`: forward mode, every input direction at once,
with the batched-copies autograd method for blocks it does not reproduce). Edited runs
(:func:`edited_logits`) run the prompt prefix once and the suffix as one copy per edited state.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ...config import DictConfig, check_choice, check_float, check_int, check_int_list
from ...results import Result
from ...runs import RunDir
from . import protocol_authors as lre_authors
from . import protocol_mechfact as lre_mechfact
from ..jacobian import jacobian  # noqa: F401 (public here too)
from ..models.loading import LanguageModel, check_remote, load_model, worker_model
from .protocol_authors import AUTHORS_BETAS, DEFAULT_TRIALS, FIXED_BETA  # noqa: F401
from .protocol_mechfact import BETA_SWEEP  # noqa: F401
from .operator import (LRE, decode_top, edited_logits, edited_predictions, estimate_lre,  # noqa: F401
                           patched_predictions)
from ..jobs import map_relations
from ..readout import check_prompt_options
from ..prompts import check_template
from ..relations import Relation, as_relations

logger = logging.getLogger(__name__)


PROTOCOLS = ("authors", "mechfact")


@dataclass
class LreConfig(DictConfig):
    model: str = "default"
    relations: str | None = None  # relation file or folder; None = the shipped dataset
    relation_names: list[str] | None = None
    layer: int | None = None  # subject layer l; None = n_layers // 2
    layers: list[int] | None = None  # a sweep of subject layers (instead of `layer`); rows report the best
    beta: float | None = None  # LRE(s) = beta * J s + b, fixed in advance; None: 2.25 (authors), 1.0 (mechfact)
    rank: int = 64  # rank of the pseudo-inverse used for causality edits
    n_train: int = 5  # facts whose Jacobians are averaged (the rest are test facts)
    facts: str = "known"  # known: facts the model completes correctly | all: every fact, scored against the model's prediction
    k_shot: int = 3  # in-context examples in every prompt
    template: int = 0
    max_samples: int | None = None  # cap per relation file (authors: taken round-robin over objects); None: all
    max_test: int | None = None  # cap on test facts per relation (None = all known facts left)
    max_causality: int | None = None  # authors: cap on a trial's causality edits (None = one per test fact; 0 = no edits: faithfulness only)
    chunk: int | None = None  # Jacobian input directions per tangent product (None: all at once; lower: less memory)
    protocol: str = "authors"  # authors: Hernandez et al.'s code (module docstring) | mechfact: the first protocol
    n_trials: int = DEFAULT_TRIALS  # authors: trials (split, prompt, filter, operator) averaged; 24 as the paper
    ranks: list[int] | None = None  # authors: edit ranks swept (None: 16..256 and full; lre_authors.AUTHORS_RANKS: theirs)
    dtype: str = "float32"
    batch_size: int = 16
    cache_states: bool = True

    def __post_init__(self) -> None:
        if self.layer is not None:
            check_int("layer", self.layer, 0)
        if self.layers is not None:
            check_int_list("layers", self.layers, 0)
            if self.layer is not None:
                raise ValueError(f"--layer {self.layer} and --layers {self.layers}: give one of them "
                                 "(--layers sweeps, --layer is one layer)")
        if self.beta is not None:
            check_float("beta", self.beta, lo=0, lo_open=True)
        check_int("rank", self.rank, 1)
        check_int("n_train", self.n_train, 1)
        check_choice("facts", self.facts, ("known", "all"))
        if self.max_test is not None:
            check_int("max_test", self.max_test, 1)
        if self.max_causality is not None:
            check_int("max_causality", self.max_causality, 0)
            if self.protocol != "authors":
                raise ValueError(f"max_causality {self.max_causality}: a cap of the authors' protocol; protocol "
                                 f"{self.protocol!r} edits every test fact (use protocol 'authors' or drop the cap)")
        if self.chunk is not None:
            check_int("chunk", self.chunk, 1)
        check_int("batch_size", self.batch_size, 1)
        check_choice("protocol", self.protocol, PROTOCOLS)
        check_int("n_trials", self.n_trials, 1)
        if self.ranks is not None:
            check_int_list("ranks", self.ranks, 0)
        check_prompt_options(self)


def default_layer(n_layers: int) -> int:
    return n_layers // 2


_COMMON = ("relation", "kind", "n_samples", "n_known", "n_train", "n_test", "faithfulness", "causality")


@dataclass(frozen=True)
class LreResult(Result):
    """What :func:`lre` returns (and :func:`lre_sweep`, one per layer): one relation's LRE at one layer.

    The fields every protocol fills are attributes; ``details`` holds the protocol's other numbers (authors:
    ``train_beta``, ``faithfulness_train_beta``, ``faithfulness_bias_only``, ``majority_baseline``, ``rank``,
    each number's ``_ci`` and ``_n``, ``faithfulness_by_beta``, ``causality_by_rank``, ...), readable as
    attributes too (``res.train_beta``) or by key (``res["train_beta"]``). ``records``: the one flat row (with
    ``layer``), the shape every probe result has; ``to_dict()``: the row of ``result.json["per_relation"]``.
    ``operator``: the fitted ``beta J s + b`` (the last trial's, in the authors' protocol).
    """

    relation: str
    kind: str
    layer: int
    n_samples: int
    n_known: int
    n_train: int
    n_test: int
    faithfulness: float | None  # None: too few usable facts
    causality: float | None
    details: dict = field(default_factory=dict)
    operator: LRE | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_row(cls, row: dict, layer: int, operator=None) -> "LreResult":
        return cls(layer=layer, operator=operator,
                   details={k: v for k, v in row.items() if k not in _COMMON},
                   **{k: row[k] for k in _COMMON})

    def __getattr__(self, name: str):
        details = self.__dict__.get("details", {})
        if name in details:
            return details[name]
        raise AttributeError(f"LreResult has no attribute {name!r} (its numbers: {sorted(details)})")

    def __getitem__(self, key: str):
        return self.records[0][key]

    def to_dict(self) -> dict:
        """The row of ``result.json["per_relation"]`` (without the operator)."""
        return {**{k: getattr(self, k) for k in _COMMON}, **self.details}

    @property
    def records(self) -> list[dict]:
        return [{**self.to_dict(), "layer": self.layer}]


def _layer(lm: LanguageModel, layer: int | None, flag: str = "--layer") -> int:
    layer = default_layer(lm.n_layers) if layer is None else lm.check_layer(layer, flag)
    if layer >= lm.n_layers - 1:
        raise ValueError(f"{flag} {layer}: must be below the last layer ({lm.n_layers - 1}); the LRE maps it there")
    return layer


def _layers_of(lm: LanguageModel, cfg: LreConfig) -> list[int]:
    """The subject layers of a config: ``layers`` (a sweep) or ``[layer]``."""
    if cfg.layers is None:
        return [_layer(lm, cfg.layer)]
    return sorted({_layer(lm, l, "--layers") for l in cfg.layers})


def _results(lm: LanguageModel, relation, cfg: LreConfig, seed: int, progress: bool) -> list[LreResult]:
    rels = as_relations(relation)
    if len(rels) != 1:
        raise ValueError(f"lre takes one relation; got {len(rels)} (call it once per relation)")
    rel = _capped(rels[0], cfg, seed)
    check_template(rel, cfg.template)
    rows, op = _evaluate(lm, rel, cfg, _layers_of(lm, cfg), seed, progress)
    if cfg.protocol == "authors":
        lre_authors.add_model_beta(rows, rows[0].get("beta", FIXED_BETA))
    return [LreResult.from_row(r, r["layer"], op if k == len(rows) - 1 else None) for k, r in enumerate(rows)]


def lre(lm: LanguageModel, relation, layer: int | None = None, *, seed: int = 0, progress: bool = False,
        **options) -> LreResult:
    """The linear relational embedding of one relation from subject layer ``layer`` (default ``n_layers // 2``).

    ``relation``: a :class:`~mechfact.llm.relations.Relation` (or a one-relation file). ``options``: any
    :class:`LreConfig` field (``beta``, ``rank``, ``ranks``, ``n_train``, ``n_trials``, ``facts``, ``protocol``,
    ``k_shot``, ``template``, ``max_samples``, ``max_test``, ``max_causality``, ``chunk``, ``batch_size``,
    ``cache_states``),
    defaults as ``mechfact llm lre``. Several layers: :func:`lre_sweep`.
    """
    if isinstance(layer, (list, tuple)):
        raise TypeError(f"lre: layer={list(layer)!r} is a list; lre takes one layer (an int or None), "
                        "mechfact.lre_sweep(lm, relation, layers) takes several")
    return _results(lm, relation, LreConfig(layer=layer, **options), seed, progress)[0]


def lre_sweep(lm: LanguageModel, relation, layers: list[int], *, seed: int = 0, progress: bool = False,
              **options) -> list[LreResult]:
    """:func:`lre` at each of ``layers`` (one result per layer, in layer order), with the same trials, known
    facts, training facts and edit targets at every layer; ``options`` as :func:`lre`.
    :func:`best_layer_row` of their ``to_dict()`` rows picks a layer the way ``mechfact llm lre --layers``
    does (the authors' protocol: on training facts)."""
    if isinstance(layers, int) or not layers:
        raise TypeError(f"lre_sweep: layers={layers!r}; give a non-empty list of layers (one layer: mechfact.lre)")
    return _results(lm, relation, LreConfig(layers=list(layers), **options), seed, progress)


def _evaluate(lm, rel, cfg: LreConfig, layers: list[int], seed: int, progress: bool,
              checkpoint: Path | None = None) -> tuple[list[dict], "LRE | None"]:
    """One row per layer (each with its ``layer``) and the last fitted operator; ``checkpoint`` (the authors'
    protocol): a file that keeps the relation's finished trials (:func:`mechfact.llm.lre.protocol_authors.evaluate`)."""
    if cfg.protocol == "authors":
        return lre_authors.evaluate(lm, rel, cfg, layers, seed, progress, checkpoint)
    rows, op = [], None
    for layer in layers:
        row, op = lre_mechfact.evaluate(lm, rel, cfg, layer, seed, progress)
        rows.append({**row, "layer": layer})
    return rows, op


def _capped(rel: Relation, cfg: LreConfig, seed: int) -> Relation:
    """The relation under ``max_samples``: round-robin over objects (authors), evenly spaced (mechfact)."""
    if cfg.protocol == "authors":
        return lre_authors.stratified_subset(rel, cfg.max_samples, seed)
    return rel.subset(cfg.max_samples)


def best_layer_row(rows: list[dict]) -> dict:
    """A relation's row from its layer rows. Authors: :func:`mechfact.llm.lre.protocol_authors.relation_row` (every choice
    on training facts). Mechfact (the first protocol): :func:`mechfact.llm.lre.protocol_mechfact.relation_row` (the layer
    best on its own test facts, labelled an upper bound)."""
    if rows and rows[0].get("protocol") == "authors":
        return lre_authors.relation_row(rows)
    return lre_mechfact.relation_row(rows)


def _relation_job(cfg: LreConfig, layers: list[int], seed: int, rel: Relation, device: str,
                  trials: str | None = None) -> list[dict]:
    """One relation's rows in an executor worker (which loads ``cfg.model`` once); ``trials``: the run's folder
    of trial checkpoints (:func:`_trials_file`)."""
    ck = None if trials is None else _trials_file(Path(trials), rel.name)
    rows, _ = _evaluate(worker_model(cfg.model, device, cfg.dtype), rel, cfg, layers, seed, False, ck)
    return rows


TRIALS_DIR = "trials"  # a run's per-relation trial checkpoints, removed as each relation's rows are written


def _trials_file(folder: Path, relation: str) -> Path:
    """The checkpoint file of ``relation``'s finished trials in a run's ``trials/`` folder."""
    slug = "".join(c if c.isalnum() else "_" for c in relation)
    digest = hashlib.sha256(relation.encode()).hexdigest()[:8]  # two names with one slug keep two files
    return folder / f"{slug}-{digest}.npz"


def _summarise(result: dict, cfg: LreConfig, seed: int) -> None:
    """Run-level numbers: the authors' protocol gets the model beta and means with intervals over relations."""
    rows = result["per_relation"]
    if cfg.protocol == "authors":
        fixed = FIXED_BETA if cfg.beta is None else cfg.beta
        result["model_beta"] = lre_authors.add_model_beta(rows, fixed)
        result.update(lre_authors.summary(rows, seed))
        return
    result.update(lre_mechfact.summary(rows))


def run_llm_lre(cfg: LreConfig, out: str | Path, *, device: torch.device | str = "cpu", seed: int = 0,
                lm: LanguageModel | None = None, progress: bool = False, executor=None) -> dict:
    """:func:`lre` for every relation, as a run directory (rows written as relations finish; resumes).

    With ``layers`` (a sweep), ``per_relation`` holds each relation at the layers chosen on its training facts
    (``layer`` for faithfulness, ``edit_layer`` for causality; ``by_layer``) and ``per_relation_layer`` every
    (relation, layer) row. The authors' protocol adds ``model_beta`` (one beta chosen on the training facts
    pooled over the run's relations, ``faithfulness_model_beta`` on every row) and means over the
    non-degenerate relations with bootstrap intervals over relations.

    ``executor``: None or a local executor runs the relations one after another in this process; a Ray executor
    (:func:`mechfact.executor.make_executor`) runs one task per relation, each worker loading ``cfg.model``
    itself (once per worker process) with one thread; the driver alone writes result.json, rows in relation
    order whatever order they finish in, so the file is the local one byte for byte.
    """
    from .. import plots

    check_remote(executor, lm)  # before anything is loaded or written
    rels = [_capped(r, cfg, seed) for r in as_relations(cfg.relations, cfg.relation_names)]
    lm = lm or load_model(cfg.model, device=device, dtype=cfg.dtype)
    layers = _layers_of(lm, cfg)
    for r in rels:
        check_template(r, cfg.template)
    run = RunDir(out, cfg, kind="llm.lre", seed=seed, device=str(lm.device), model_id=lm.model_id)
    result = run.read_result({"model": lm.name, "n_layers": lm.n_layers, "layer": layers[0] if len(layers) == 1
                              else None, "layers": layers, "config": cfg.to_dict(), "per_relation": [],
                              "per_relation_layer": []})
    done = {r["relation"] for r in result["per_relation"]}
    order = {r.name: i for i, r in enumerate(rels)}
    trials = run.path / TRIALS_DIR  # an interrupted relation resumes at its next trial

    def add(name: str, rows: list[dict]) -> None:
        row = best_layer_row(rows)
        logger.info("%s: known %d, test %d, layer %s, faithfulness %s, causality %s", name, row["n_known"],
                    row["n_test"], row["layer"], row["faithfulness"], row["causality"])
        result["per_relation"].append(row)
        result["per_relation_layer"] += rows
        for key in ("per_relation", "per_relation_layer"):  # relation order (stable: a sweep's layers stay in order)
            result[key].sort(key=lambda x: order.get(x["relation"], len(order)))
        _summarise(result, cfg, seed)
        run.write_result(result)
        _trials_file(trials, name).unlink(missing_ok=True)  # its trials are in result.json now

    todo = [rel for rel in rels if rel.name not in done]
    with tqdm(total=len(todo), desc="relations", disable=not progress or check_remote(executor, None)) as bar:
        def local(rel):
            rows = _evaluate(lm, rel, cfg, layers, seed, progress, _trials_file(trials, rel.name))[0]
            bar.update()
            return rows

        job = functools.partial(_relation_job, cfg, layers, seed, trials=str(trials))
        map_relations(todo, executor, lm, local, lambda rel: job, add)
    _summarise(result, cfg, seed)
    if trials.is_dir() and not any(trials.iterdir()):
        trials.rmdir()
    plot = plots.plot_lre_layers if len(layers) > 1 else plots.plot_lre
    return run.finish(result, plot, "fig_lre.png", model=lm.name, model_id=lm.model_id)
