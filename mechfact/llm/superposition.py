"""The geometric-recall paper's claim on a pretrained model: is a subject's hidden state a superposition of
the vectors of its attributes under several relations?

Where the pieces live:

* here: the run -- :func:`llm_superposition` (in memory), :func:`run_llm_superposition` (a run directory that
  resumes layer by layer) and :class:`LlmSuperpositionResult`;
* :mod:`mechfact.llm.superposition_data`: :class:`LlmSuperpositionConfig`, the subjects shared by the relations,
  the attribute codes and the subject states;
* :mod:`mechfact.llm.superposition_stats`: every number of one layer -- the kernels of every null draw, computed
  once per run, the per-fold fits, the attribute subspace, the decodability readouts and their intervals.

For subjects that carry R relations (default: the 73 countries of ``mechfact/data/countries`` under capital,
continent, language, currency and demonym), at every layer::

    h_s  ~=  c + sum_r  a_r(s) M_r

``h_s`` is the state at the subject's last token of a relation-neutral prompt (default ``"{}"``: the subject
alone after BOS, so no relation is named; ``prompt="words"`` puts words before the subject, for any model). The
attribute code ``a_r(s)`` is the model's unembedding row of the object's first token (``attributes="unembed"``;
objects of one relation that share a first token have the same row, so they are one code: merged, and listed in
``shared_first_token``) or a one-hot code of the object within its relation (``"class"``; one-to-one relations
then add nothing for held-out subjects).

The fit. The maps ``M_r`` are fitted by ridge regression on training subjects and scored by R^2 on held-out
subjects, k-fold over subjects (``folds``, default 5; ``n_splits`` repeats the partition), pooled over all
held-out subjects: ``r2_heldout = 1 - sum_s |h_s - pred_s|^2 / sum_s |h_s - mean_train|^2``. The ridge strength
is chosen per fold by generalised cross-validation on the training subjects over a grid relative to the
kernel's scale (``alpha`` per layer, ``alpha_at_grid_edge`` when a fold chose an end of the grid). The fit is
solved in its kernel form (:mod:`mechfact.probes.superposition`): the design enters only through the
subjects x subjects kernel ``sum_r <a_r(s), a_r(t)>``, so each null draw costs a few ``n x n`` products.

Every number carries an interval and its ``n`` (:mod:`mechfact.stats`): R^2 values a bootstrap over subjects
(``_n`` = subjects), p-values ``(1 + #{null >= observed}) / (1 + n_null)``.

Nulls and controls, per layer (``n_null`` draws each, default 200; the same draws at every layer):

* ``null_shuffled``: the subjects' attribute tuples reassigned to other subjects (one permutation of the
  subjects per draw, all relations together). ``p_value`` is the observed R^2 against it;
  ``control_shuffled_r2_heldout`` its mean (``_ci``: the central 95% of the draws);
* ``null_random_features``: every object code replaced by a random Gaussian vector of the same width and mean
  square (object identity kept, the model's geometry gone): its p-value says whether the unembedding geometry
  explains more than object identity;
* each relation alone (``r2_heldout_each_relation_alone``) and dropped (``delta_r2_drop_one``: R^2 of the full
  fit minus R^2 without relation r, with a p-value against draws that shuffle relation r alone);
* ``partial_r2_heldout``: what the attributes explain beyond nuisance regressors (the first ``nuisance_pcs``
  principal components of the subject's layer-0 state, fitted on the training subjects, and its token count),
  ``1 - SSE(nuisance + attributes) / SSE(nuisance)`` on held-out subjects, against the shuffled null;
* ``r2_heldout_beyond_layer0``: what the attributes explain of the states once the WHOLE layer-0 state and the
  token count are taken out: per fold, the states ridge-regressed on the layer-0 state (alpha by GCV, token
  count unpenalised, fitted on the training subjects; the training subjects' residuals out of fold, from an
  inner k-fold, as the held-out ones), then the attributes' fit to the residual, ``1 -
  SSE / SSE(residual about its training mean)`` on held-out subjects, against the shuffled null
  (``null_beyond_layer0``); ``r2_heldout_layer0_only``: what the layer-0 state and token count alone predict of
  the held-out states (lexical geometry: a signal already there at layer 0 is not recall);
* ``r2_heldout_attribute_subspace``: the same fit on the state projected onto the attribute-relevant subspace
  (the span of the per-relation readout directions fitted on the training subjects: the top singular vectors of
  each ridge map h -> a_r, 90% of its energy, at most 8 per relation). The subspace is refitted under every
  null draw (with the shuffled or random attributes), so its null is matched;
* ``known_contrast`` and ``known_contrast_beyond_layer0``: the same held-out fits scored separately on the
  subjects the model knows (its top token on a 3-shot prompt spells the object for most of the subject's
  relations; ``recalled`` lists them per subject) and on the others: each group's R^2 with its interval and its
  p against the shuffled draws, the difference and its p from relabelling subjects; and ``recall_spearman``,
  over every subject, the number of relations recalled against the share of its held-out state the fit
  explains. Recall stored in the subject state should fit better where the model recalls;
* ``decodability``: per relation, the held-out accuracy of a linear (ridge, closed form) readout of the
  attribute from the z-scored state (a one-hot class readout for many-to-one relations, the nearest attribute
  code for one-to-one ones), against the same readout with the labels shuffled across subjects.

A subject state can be dominated by one "massive activation" coordinate: on Qwen2.5 a subject right after BOS
(the default prompt) puts about 90% of the states' variance into coordinate 62, which follows the subject's
token count. Each layer records ``top_coordinate`` and ``top_coordinate_variance_share`` (``massive_coordinate``
above 0.5, and a warning); ``standardize=True`` z-scores every coordinate on the training subjects,
``drop_massive=True`` removes every coordinate holding more than 10% of the training subjects' variance, and
``prompt="words"`` keeps the subject off position 1. The result records which were used.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

from ..results import Result
from ..runs import RunDir
from ..seeding import derive_seed
from .models.loading import LanguageModel, load_model
from .relations import as_relations
from .superposition_data import (ATTRIBUTES, KNOWN_SHARE, PROMPTS, LlmSuperpositionConfig, _objects, attribute_table,
                                 countries_dir, shared_first_token, shared_subjects, subject_recall, subject_states,
                                 subject_token_counts)
from .superposition_stats import (DROP_SHARE, ENERGY, MASSIVE_SHARE, PER_RELATION, ROW_FORMAT, _layer_row,
                                  _one_blas_thread, _setup, massive_coordinates, scaled)
from .superposition_stats import _readout_subspace  # noqa: F401 (public here too)

__all__ = ["ATTRIBUTES", "PROMPTS", "MASSIVE_SHARE", "DROP_SHARE", "PER_RELATION", "ENERGY", "ROW_FORMAT",
           "countries_dir", "LlmSuperpositionConfig", "shared_subjects", "shared_first_token", "attribute_table",
           "subject_states", "subject_token_counts", "scaled", "massive_coordinates", "LlmSuperpositionResult",
           "llm_superposition", "run_llm_superposition"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LlmSuperpositionResult(Result):
    """Per layer: held-out R^2 of the superposition fit beside its nulls and controls (module docstring)."""

    model: str
    relations: list[str]
    subjects: list[str]
    attributes: str
    per_layer: list[dict] = field(default_factory=list)  # layer, r2_heldout, nulls, controls, overlap, ...
    prompt: str = "{}"
    standardize: bool = False
    drop_massive: bool = False
    folds: int = 5
    repeats: int = 1
    n_null: int = 200
    shared_first_token: dict = field(default_factory=dict)  # relation -> groups of objects merged into one code
    massive_coordinate_layers: list[int] = field(default_factory=list)  # layers where one coordinate holds > 50%
    recalled: dict = field(default_factory=dict)  # subject -> relations whose object the model recalls (3-shot)
    known_rule: str = ""

    @property
    def records(self) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "block_overlap"} for r in self.per_layer]

    def to_dict(self) -> dict:
        return asdict(self)


def llm_superposition(lm: LanguageModel, relations=None, layers="all", *, seed: int = 0, progress: bool = False,
                      **options) -> LlmSuperpositionResult:
    """The superposition test at every layer of ``lm`` (module docstring); ``options``: LlmSuperpositionConfig fields."""
    cfg = LlmSuperpositionConfig(layers=None if layers == "all" else list(layers), **options)
    return _run(lm, cfg, relations, seed, progress)


def _prepare(lm: LanguageModel, cfg: LlmSuperpositionConfig, relations):
    rels = as_relations(countries_dir() if relations is None else relations, cfg.relation_names)
    subjects, rels = shared_subjects(rels, cfg.min_relations)
    layers = list(range(lm.n_layers)) if cfg.layers is None else [lm.check_layer(int(l), "--layers")
                                                                   for l in cfg.layers]
    return rels, subjects, layers


def _run(lm, cfg, relations, seed, progress, on_layer=None, done=None) -> LlmSuperpositionResult:
    rels, subjects, layers = _prepare(lm, cfg, relations)
    if cfg.k_folds > len(subjects) // 2:
        raise ValueError(f"--folds {cfg.k_folds}: {len(subjects)} subjects allow at most {len(subjects) // 2} folds "
                         "(two held-out subjects per fold)")
    names = [r.name for r in rels]
    V, P, _ = attribute_table(lm, rels, subjects, cfg.attributes)
    shared = shared_first_token(lm, rels, subjects) if cfg.attributes == "unembed" else {}
    for name, groups in shared.items():
        if groups:
            logger.warning("%s: objects sharing a first token are one attribute code (their unembedding rows are "
                           "the same): %s", name, "; ".join(" = ".join(g) for g in groups))
    recall = subject_recall(lm, rels, subjects, batch_size=cfg.batch_size)
    known = recall.sum(1) > KNOWN_SHARE * len(rels)
    rule = (f"known: the model's top token on a 3-shot prompt spells the object for more than {KNOWN_SHARE:.0%} "
            f"of the subject's {len(rels)} relations ({int(known.sum())} of {len(subjects)} subjects)")
    logger.info(rule)
    res = LlmSuperpositionResult(lm.name, names, subjects, cfg.attributes, prompt=cfg.prompt,
                                 recalled={s: [n for n, ok in zip(names, recall[k]) if ok]
                                           for k, s in enumerate(subjects)}, known_rule=rule,
                                 standardize=cfg.standardize, drop_massive=cfg.drop_massive, folds=cfg.k_folds,
                                 repeats=cfg.n_splits, n_null=cfg.n_null,
                                 shared_first_token={k: v for k, v in shared.items() if v})
    done = {k: v for k, v in (done or {}).items() if v.get("format") == ROW_FORMAT}
    todo = [l for l in layers if l not in done]
    if todo:
        states = subject_states(lm, subjects, cfg, todo, progress)
        X0 = (states[todo.index(0)] if 0 in todo else subject_states(lm, subjects, cfg, [0])[0]).double().numpy()
        with _one_blas_thread():
            S = _setup(V, P, names, X0, subject_token_counts(lm, subjects, cfg), cfg, seed,
                       [len(set(_objects(r, subjects))) == len(subjects) for r in rels])
    for layer in layers:
        if layer in done:
            row = done[layer]
        else:
            with _one_blas_thread():
                row = {"layer": layer, **_layer_row(states[todo.index(layer)].double().numpy(), S, cfg,
                                                    derive_seed(seed, "llm.superposition.bootstrap", layer), known,
                                                    recall.sum(1))}
            for name, groups in res.shared_first_token.items():
                row["decodability"][name]["shared_first_token"] = groups
                row["decodability"][name]["note"] = ("objects sharing a first token are one class here: "
                                                     + "; ".join(" = ".join(g) for g in groups))
        res.per_layer.append(row)
        if row.get("massive_coordinate"):
            res.massive_coordinate_layers.append(layer)
            if not cfg.standardize and not cfg.drop_massive:
                logger.warning("layer %d: coordinate %d holds %.0f%% of the subject states' variance, so the pooled "
                               "R^2 mostly measures it (a 'massive activation', e.g. of a subject right after BOS); "
                               "--prompt words puts words before the subject, --drop-massive removes it "
                               "(--standardize only evens out the coordinates)", layer, row["top_coordinate"],
                               100 * row["top_coordinate_variance_share"])
        logger.info("layer %d: held-out R^2 %.3f [%.3f, %.3f] p=%.3g (shuffled %.3f, random features %.3f, p=%.3g); "
                    "partial %.3f; alpha %.3g%s; alone: %s; drop-one: %s", layer, row["r2_heldout"],
                    *row["r2_heldout_ci"], row["p_value"], row["control_shuffled_r2_heldout"],
                    row["control_random_features_r2_heldout"], row["null_random_features"]["p_value"],
                    row["partial_r2_heldout"], row["alpha"],
                    f" (grid edge: {row['alpha_edge']})" if row["alpha_at_grid_edge"] else "",
                    ", ".join(f"{k} {v:.3f}" for k, v in row["r2_heldout_each_relation_alone"].items()),
                    ", ".join(f"{k} {v:+.3f}" for k, v in row["delta_r2_drop_one"].items()))
        if on_layer is not None:
            on_layer(res)
    if res.massive_coordinate_layers:
        logger.warning("massive coordinate (over %.0f%% of the states' variance) at layers %s", 100 * MASSIVE_SHARE,
                       ", ".join(map(str, res.massive_coordinate_layers)))
    else:
        logger.info("no massive coordinate (none over %.0f%% of the states' variance) at any layer",
                    100 * MASSIVE_SHARE)
    return res


def run_llm_superposition(cfg: LlmSuperpositionConfig, out, *, device="cpu", seed: int = 0,
                          lm: LanguageModel | None = None, progress: bool = False) -> dict:
    """:func:`llm_superposition` as a run directory: result.json written layer by layer (resumes), a figure."""
    from . import plots

    lm = lm or load_model(cfg.model, device=device, dtype=cfg.dtype)
    run = RunDir(out, cfg, kind="llm.superposition", seed=seed, device=str(lm.device), model_id=lm.model_id)
    prev = run.read_result({"per_layer": []})
    done = {r["layer"]: r for r in prev.get("per_layer", [])}
    res = _run(lm, cfg, cfg.relations, seed, progress, on_layer=lambda r: run.write_result(r.to_dict()), done=done)
    return run.finish(res.to_dict(), plots.plot_superposition_layers, "fig_superposition.png", model=lm.name,
                      model_id=lm.model_id)


def __getattr__(name: str):
    if name == "SuperpositionConfig":  # deprecated: see mechfact.llm.superposition_data
        from . import superposition_data

        return superposition_data.__getattr__(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
