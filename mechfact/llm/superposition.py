"""The geometric-recall paper's claim on a pretrained model: is a subject's hidden state a superposition of
the vectors of its attributes under several relations?

For subjects that carry R relations (default: the 73 countries of ``mechfact/data/countries`` under capital,
continent, language, currency and demonym), at every layer::

    h_s  ~=  c + sum_r  a_r(s) M_r

``h_s`` is the state at the subject's last token of a relation-neutral prompt (default ``"{}"``: the subject
alone after BOS, so no relation is named). The attribute code ``a_r(s)`` is the model's unembedding row of the
object's first token (``attributes="unembed"``) or a one-hot code of the object within its relation
(``"class"``; one-to-one relations then add nothing for held-out subjects). The maps ``M_r`` are fitted by
ridge regression (strength by generalised cross-validation) on training subjects and scored by R^2 on
held-out subjects (:func:`mechfact.probes.superposition.superposition_test`, the same test as on fact models),
averaged over ``n_splits`` random subject splits. Controls, each at every layer:

* shuffled: each relation's attributes reassigned to other subjects (the structure is gone);
* each relation alone (what one relation explains without the others);
* random features of the same size: every object gets a random Gaussian vector of the same width instead
  of its unembedding row (tells object identity from the model's own object geometry);

plus the overlap of the relations' subspaces (``block_overlap``; 0 = disjoint, about q/d for random).

The raw state's variance is dominated by directions unrelated to any attribute, so a plain R^2 over all
coordinates can be near 0 while every attribute is decodable. Two more numbers per layer say which is the case:

* ``decodability``: per relation, the held-out accuracy of a linear readout of the attribute from the SAME
  state (classifier for many-to-one relations, ridge onto the attribute vectors decoded as the nearest for
  one-to-one ones; :func:`mechfact.probes.readout.linear_readout`), with its shuffled-label control and chance;
* ``r2_heldout_attribute_subspace``: the same superposition fit on the state projected onto the
  attribute-relevant subspace (the span of the per-relation readout directions fitted on the training
  subjects: the top right-singular vectors of each ridge map h -> a_r, 90% of its energy, at most 8 per
  relation), with the shuffled and random-feature controls there too.

A subject state can be dominated by one "massive activation" coordinate: on Qwen2.5 a subject right after BOS
(the default prompt) puts about 90% of the states' variance into coordinate 62, which follows the subject's token
count. Each layer records ``top_coordinate`` and its ``top_coordinate_variance_share`` (a warning above 0.5);
``standardize=True`` z-scores every coordinate on the training subjects, and a prompt with words before the
subject keeps it off position 1.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from .. import hooks
from ..config import DictConfig, check_choice, check_float, check_int, check_int_list
from ..probes.queries import ProbeSet, Site, collect
from ..runs import RunDir
from ..seeding import derive_seed, generator
from .loading import DTYPES, LanguageModel, load_model
from .prompts import build_prompts, object_token_ids
from .relations import Relation, as_relations, shipped_relations_dir

logger = logging.getLogger(__name__)

ATTRIBUTES = ("unembed", "class")
MASSIVE_SHARE = 0.5  # one coordinate with more than this share of the states' variance gets a warning


def countries_dir():
    """The shipped multi-relation dataset: 73 countries under five relations."""
    return shipped_relations_dir().parent / "countries"


@dataclass
class SuperpositionConfig(DictConfig):
    model: str = "default"  # hub name, local HF folder, .gguf, short name (mechfact.llm.registry)
    relations: str | None = None  # a folder of relations sharing subjects; None = mechfact/data/countries
    relation_names: list[str] | None = None
    layers: list[int] | None = None  # None = every layer
    prompt: str = "{}"  # relation-neutral prompt with one {} for the subject
    attributes: str = "unembed"  # unembed | class
    heldout_fraction: float = 0.2
    n_splits: int = 3
    min_relations: int = 4  # subjects must carry at least this many of the relations (all are used)
    dtype: str = "float32"
    batch_size: int = 16
    cache_states: bool = True
    standardize: bool = False  # z-score every coordinate with the training subjects' mean and std (per split)

    def __post_init__(self) -> None:
        if not isinstance(self.standardize, bool):
            raise ValueError(f"standardize {self.standardize!r}: must be true or false")
        if not isinstance(self.prompt, str) or self.prompt.count("{}") != 1:
            raise ValueError(f"--prompt {self.prompt!r}: must contain exactly one '{{}}' (the subject)")
        check_choice("attributes", self.attributes, ATTRIBUTES)
        check_float("heldout", self.heldout_fraction, lo=0, hi=1, lo_open=True, hi_open=True)
        check_int("splits", self.n_splits, 1)
        check_int("min_relations", self.min_relations, 2)
        check_choice("dtype", self.dtype, DTYPES)
        check_int("batch_size", self.batch_size, 1)
        if self.layers is not None:
            check_int_list("layers", self.layers, 0, "give at least one layer, or all")


def shared_subjects(rels: list[Relation], min_relations: int) -> tuple[list[str], list[Relation]]:
    """Subjects present in every relation (sorted), and the relations; ValueError when too few."""
    if len(rels) < min_relations:
        raise ValueError(f"--relations: {len(rels)} relations given; the test needs at least {min_relations} "
                         "relations that share subjects")
    common = set(rels[0].subjects)
    for r in rels[1:]:
        common &= set(r.subjects)
    subjects = sorted(common)
    if len(subjects) < 20:
        raise ValueError(f"--relations: only {len(subjects)} subjects are in all of {', '.join(r.name for r in rels)}; "
                         "need at least 20 to fit on some and score the rest")
    return subjects, rels


def attribute_table(lm: LanguageModel, rels: list[Relation], subjects: list[str], kind: str
                    ) -> tuple[np.ndarray, np.ndarray, list[list[str]]]:
    """(V (n_codes, k), perms (R, n_subjects) row indices into V, object names per relation)."""
    rows, perms, names = [], [], []
    for rel in rels:
        obj = dict(zip(rel.subjects, rel.objects))
        objs = [obj[s] for s in subjects]
        uniq = list(dict.fromkeys(objs))
        index = {o: len(rows) + i for i, o in enumerate(uniq)}
        if kind == "unembed":
            W_U = lm.W_U.detach().float().cpu()
            rows += [W_U[:, object_token_ids(lm.tokenizer, o)[0]].double().numpy() for o in uniq]
        else:
            rows += [None] * len(uniq)
        perms.append([index[o] for o in objs])
        names.append(uniq)
    if kind == "class":
        V = np.eye(len(rows))
    else:
        V = np.stack(rows)
    return V, np.array(perms), names


def subject_states(lm: LanguageModel, subjects: list[str], cfg: SuperpositionConfig, layers: list[int],
                   progress: bool = False) -> torch.Tensor:
    """(layers, n_subjects, d_model) states at the subject's last token of the neutral prompt."""
    probe = Relation("subjects", [cfg.prompt], [(s, "-") for s in subjects])
    prompts = build_prompts(probe, lm.tokenizer, lm.bos_id, k=0)
    ps = ProbeSet.from_prompts(prompts, pad_id=lm.pad_id)
    sites = [Site(hooks.resid(layer, "post"), "subject") for layer in layers]
    acts = collect(lm, ps, sites, batch_size=cfg.batch_size, cache=cfg.cache_states, progress=progress,
                   desc="subject states")
    return torch.stack([acts[s] for s in sites])


def _splits(n: int, cfg: SuperpositionConfig, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from ..probes.superposition import split_entities

    return [split_entities(n, cfg.heldout_fraction, derive_seed(seed, "llm.superposition.split", k))
            for k in range(cfg.n_splits)]


def _readout_basis(X: np.ndarray, V: np.ndarray, P: np.ndarray, tr: np.ndarray, per_relation: int = 8) -> np.ndarray:
    """(d, q) orthonormal basis of the attribute-relevant subspace, from ridge maps h -> a_r on training subjects."""
    from sklearn.linear_model import RidgeCV

    dirs = []
    for r in range(P.shape[0]):
        reg = RidgeCV(alphas=np.logspace(-3, 5, 9)).fit(X[tr], V[P[r, tr]])
        _, sv, vt = np.linalg.svd(np.atleast_2d(reg.coef_), full_matrices=False)  # coef_: (k, d)
        cum = np.cumsum(sv ** 2) / max(float((sv ** 2).sum()), 1e-300)
        dirs.append(vt[:min(per_relation, int(np.searchsorted(cum, 0.9) + 1))])
    q, _ = np.linalg.qr(np.concatenate(dirs).T)
    return q


def scaled(X: np.ndarray, tr: np.ndarray, standardize: bool) -> np.ndarray:
    """``X`` itself, or every coordinate z-scored with the training subjects' mean and standard deviation (a
    coordinate constant on them is only centred). Pooled R^2 weighs coordinates by their variance, so a few
    large-norm coordinates can decide it; standardised, every coordinate counts the same."""
    if not standardize:
        return X
    sd = X[tr].std(0)
    return (X - X[tr].mean(0)) / np.where(sd > 1e-12 * max(float(sd.max()), 1e-300), sd, 1.0)


def _decodability(Xs: list[np.ndarray], V: np.ndarray, P: np.ndarray, splits, names: list[str], seed: int) -> dict:
    """Per relation, the readout of its attribute from the states ``Xs[k]`` of split ``k`` (mean over splits)."""
    from ..probes.readout import linear_readout

    out = {}
    for r, name in enumerate(names):
        y = P[r] - P[r].min()
        many = len(np.unique(y)) < len(y)
        rows = [linear_readout(X, y, tr, te, kind="classifier" if many else "vector",
                               object_vectors=None if many else V[P[r].min():P[r].max() + 1], seed=seed)
                for X, (tr, te) in zip(Xs, splits)]
        out[name] = {"kind": rows[0].kind, **{k: float(np.mean([getattr(s, k) for s in rows]))
                                              for k in ("accuracy", "control_accuracy", "chance")}}
    return out


def _layer_row(X0: np.ndarray, V: np.ndarray, P: np.ndarray, V_rand: np.ndarray, splits, names: list[str],
               seed: int, standardize: bool = False) -> dict:
    from ..probes.superposition import superposition_test

    def test(X_, V_, P_, tr, te, structure=False):
        return superposition_test(X_, V_, P_, tr, te, seed=seed, coadaptation=False, structure=structure)

    full, rand, alone = [], [], {n: [] for n in names}
    sub, sub_rand, dims = [], [], []
    Xs = [scaled(X0, tr, standardize) for tr, _ in splits]  # the states each split fits (z-scored on its train)
    for X, (tr, te) in zip(Xs, splits):
        full.append(test(X, V, P, tr, te, structure=True))
        rand.append(test(X, V_rand, P, tr, te))
        for r, name in enumerate(names):
            alone[name].append(test(X, V, P[[r]], tr, te).r2_heldout)
        B = _readout_basis(X, V, P, tr)
        dims.append(B.shape[1])
        sub.append(test(X @ B, V, P, tr, te))
        sub_rand.append(test(X @ B, V_rand, P, tr, te))
    mean = lambda v: float(np.mean(v))  # noqa: E731
    spread = lambda v: [float(np.min(v)), float(np.max(v))]  # noqa: E731
    ov = np.mean([f.block_overlap for f in full], 0)
    R = len(names)
    var = X0.var(0)
    return {
        "top_coordinate": int(var.argmax()),
        "top_coordinate_variance_share": float(var.max() / max(float(var.sum()), 1e-300)),
        "r2_heldout_attribute_subspace": mean([f.r2_heldout for f in sub]),
        "control_shuffled_r2_heldout_attribute_subspace": mean([f.control_r2_heldout for f in sub]),
        "control_random_features_r2_heldout_attribute_subspace": mean([f.r2_heldout for f in sub_rand]),
        "attribute_subspace_dim": mean(dims),
        "decodability": _decodability(Xs, V, P, splits, names, seed),
        "r2_heldout": mean([f.r2_heldout for f in full]), "r2_heldout_range": spread([f.r2_heldout for f in full]),
        "r2_train": mean([f.r2_train for f in full]),
        "control_shuffled_r2_heldout": mean([f.control_r2_heldout for f in full]),
        "control_random_features_r2_heldout": mean([f.r2_heldout for f in rand]),
        "r2_heldout_each_relation_alone": {n: mean(v) for n, v in alone.items()},
        "variance_share": dict(zip(names, np.mean([f.per_relation_variance_share for f in full], 0).tolist())),
        "block_overlap_offdiag": float(np.mean([ov[a][b] for a in range(R) for b in range(R) if a != b]))
        if R > 1 else None,
        "block_overlap": ov.tolist(), "n_features": full[0].n_features, "alpha": mean([f.alpha for f in full]),
    }


@dataclass
class LlmSuperpositionResult:
    """Per layer: held-out R^2 of the superposition fit beside its controls (see the module docstring)."""

    model: str
    relations: list[str]
    subjects: list[str]
    attributes: str
    per_layer: list[dict] = field(default_factory=list)  # layer, r2_heldout, controls, overlap, ...

    @property
    def records(self) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "block_overlap"} for r in self.per_layer]

    def to_dict(self) -> dict:
        return asdict(self)


def llm_superposition(lm: LanguageModel, relations=None, layers="all", *, seed: int = 0, progress: bool = False,
                      **options) -> LlmSuperpositionResult:
    """The superposition test at every layer of ``lm`` (module docstring); ``options``: SuperpositionConfig fields."""
    cfg = SuperpositionConfig(layers=None if layers == "all" else list(layers), **options)
    return _run(lm, cfg, relations, seed, progress)


def _prepare(lm: LanguageModel, cfg: SuperpositionConfig, relations):
    rels = as_relations(countries_dir() if relations is None else relations, cfg.relation_names)
    subjects, rels = shared_subjects(rels, cfg.min_relations)
    layers = list(range(lm.n_layers)) if cfg.layers is None else [lm.check_layer(int(l), "--layers")
                                                                   for l in cfg.layers]
    return rels, subjects, layers


def _run(lm, cfg, relations, seed, progress, on_layer=None, done=None) -> LlmSuperpositionResult:
    rels, subjects, layers = _prepare(lm, cfg, relations)
    V, P, _ = attribute_table(lm, rels, subjects, cfg.attributes)
    g = generator(seed, "llm.superposition.random_features")
    V_rand = torch.randn(V.shape, generator=g, dtype=torch.float64).numpy() * float(np.sqrt((V ** 2).mean()))
    states = subject_states(lm, subjects, cfg, layers, progress)
    splits = _splits(len(subjects), cfg, seed)
    res = LlmSuperpositionResult(lm.name, [r.name for r in rels], subjects, cfg.attributes)
    done = done or {}
    for j, layer in enumerate(layers):
        row = done.get(layer) or {"layer": layer, **_layer_row(states[j].double().numpy(), V, P, V_rand, splits,
                                                               [r.name for r in rels], seed, cfg.standardize)}
        res.per_layer.append(row)
        share = row.get("top_coordinate_variance_share", 0.0)
        if share > MASSIVE_SHARE and not cfg.standardize:
            logger.warning("layer %d: coordinate %d holds %.0f%% of the subject states' variance, so the pooled R^2 "
                           "mostly measures it (a 'massive activation', e.g. of a subject right after BOS); a --prompt with "
                           "words before the subject removes it (--standardize only evens out the coordinates)", layer,
                           row["top_coordinate"], 100 * share)
        logger.info("layer %d: held-out R^2 %.3f (shuffled %.3f, random features %.3f)", layer, row["r2_heldout"],
                    row["control_shuffled_r2_heldout"], row["control_random_features_r2_heldout"])
        if on_layer is not None:
            on_layer(res)
    return res


def run_llm_superposition(cfg: SuperpositionConfig, out, *, device="cpu", seed: int = 0,
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
