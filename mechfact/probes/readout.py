"""Linear readouts: from representations to object identity, scored on held-out subjects.

Two kinds, chosen by the data:

* ``classifier`` -- objects repeat across subjects (many-to-one relations of
  pretrained models): multinomial logistic regression on standardised features,
  scored by test accuracy. Chance = accuracy of always predicting the most
  frequent TRAINING object, measured on the test set.
* ``vector`` -- every object is unique (bijections): a held-out subject's object
  is a class never seen in training, so a classifier cannot name it. Ridge
  regression maps the representation onto the object's VECTOR (an attribute /
  unembedding vector), and the prediction is decoded as the nearest candidate
  vector (cosine) among ALL the relation's objects. Chance = 1 / #candidates.

Every score comes with a shuffled-label control: the same fit with the training
targets permuted (seeded), scored on the same test set. A readout means
something only when ``accuracy`` is well above both ``chance`` and
``control_accuracy``. Beside them: ``prior_baseline`` (the expected accuracy of
guessing by the training objects' frequencies) and ``ceiling`` (the share of
test items whose object the readout can name at all: for the classifier, those
whose object occurs among the training objects; the vector readout decodes
among every object of the relation, so its ceiling is 1). Every number carries
``<name>_ci`` and ``<name>_n`` (:mod:`mechfact.stats`).

Choosing among many representations (the layers of a model) is a fit like any
other: :func:`nested_layer_readout` picks the layer by cross-validation inside
the training subjects (:func:`select_layer`, which is only ever given training
rows) and scores the chosen layer once on the held-out subjects; the
shuffled-label control goes through the same selection. Splits keep every fact
of a subject on one side (:func:`group_folds`, :func:`subject_splits`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

from .. import hooks, stats
from ..config import check_float
from ..results import Result
from ..seeding import derive_seed
from .fitters import KINDS, _as2d, _baseline_estimates, _baselines, _check_strengths, _fitter
from .folds import group_folds, outer_fold_count, split_indices, subject_splits  # noqa: F401 (their home was here)

REPORTED = ("accuracy", "control_accuracy", "chance", "prior_baseline", "ceiling")


def _no_ci() -> list:
    return [None, None]


@dataclass
class ReadoutScore:
    kind: str
    accuracy: float  # held-out accuracy
    control_accuracy: float  # same fit on shuffled training targets
    chance: float  # majority-class rate: share of test items with the training split's most frequent object
    n_train: int
    n_test: int
    n_classes: int  # distinct objects (classifier) or candidate vectors (vector)
    prior_baseline: float = float("nan")  # expected accuracy of guessing by the training class prior
    ceiling: float = float("nan")  # share of test items whose object the readout can name (see the module doc)
    accuracy_ci: list = field(default_factory=_no_ci)
    control_accuracy_ci: list = field(default_factory=_no_ci)
    chance_ci: list = field(default_factory=_no_ci)
    prior_baseline_ci: list = field(default_factory=_no_ci)
    ceiling_ci: list = field(default_factory=_no_ci)

    def to_dict(self) -> dict:
        """The fields, plus ``<name>_n`` (= ``n_test``, the test items) of every reported number."""
        out = asdict(self)
        out.update({f"{k}_n": self.n_test for k in REPORTED})
        return out


def linear_readout(features, objects: Sequence[int], train_idx, test_idx, *, kind: str = "classifier",
                   object_vectors=None, C: float = 1.0, alpha: float = 1.0, max_iter: int = 2000,
                   seed: int = 0) -> ReadoutScore:
    """Fit a linear readout ``features[i] -> objects[i]`` on ``train_idx``, score on ``test_idx``.

    ``features``: (n, d) representations, one row per (subject) query.
    ``objects``: (n,) integer object ids. For ``kind="vector"`` they index the
    rows of ``object_vectors`` (n_objects, k), which are also the candidates the
    prediction is decoded against. ``C`` (logistic) and ``alpha`` (ridge) are the
    regularisation strengths. Every number comes with its interval over the test items.
    """
    X = _as2d(features, "features")
    y = np.asarray(objects, dtype=np.int64)
    if y.shape != (X.shape[0],):
        raise ValueError(f"objects has shape {y.shape}: expected ({X.shape[0]},), one per feature row")
    fit = _fitter(kind, y, object_vectors, C, alpha, max_iter)
    tr, te = np.asarray(train_idx, dtype=np.int64), np.asarray(test_idx, dtype=np.int64)
    if len(tr) == 0 or len(te) == 0:
        raise ValueError(f"train ({len(tr)}) and test ({len(te)}) sets must both be non-empty")
    rng = np.random.default_rng(derive_seed(seed, "readout.control"))
    y_shuf = y[tr][rng.permutation(len(tr))]
    acc = stats.accuracy(fit.predict(X[tr], y[tr], X[te]) == y[te])
    ctrl = stats.accuracy(fit.predict(X[tr], y_shuf, X[te]) == y[te])
    base = _baseline_estimates(fit, *_baselines(fit, y[tr], y[te]), seed=seed)
    n_classes = int(len(np.unique(y))) if kind == "classifier" else int(fit.candidates.shape[0])
    ci = {f"{k}_ci": [e.low, e.high] for k, e in (("accuracy", acc), ("control_accuracy", ctrl), *base.items())}
    return ReadoutScore(kind=kind, accuracy=acc.value, control_accuracy=ctrl.value, chance=base["chance"].value,
                        n_train=int(len(tr)), n_test=int(len(te)), n_classes=n_classes,
                        prior_baseline=base["prior_baseline"].value, ceiling=base["ceiling"].value, **ci)


# ---- choosing a layer without the test data ------------------------------------------------


def select_layer(layers: Sequence, objects, groups, *, kind: str = "classifier", object_vectors=None,
                 folds: int = 3, strata=None, C: float = 1.0, alpha: float = 1.0, max_iter: int = 2000,
                 seed: int = 0) -> tuple[int, list[float]]:
    """The layer a readout should use, chosen from TRAINING data only.

    ``layers``: one (n, d) feature array per candidate layer, holding the training rows only (the caller
    never passes held-out rows); ``objects`` and ``groups`` (subjects) label those rows. Cross-validation
    over ``folds`` folds of the groups (:func:`group_folds`): each layer's readout is fitted on the other
    folds and scored on the left-out one, the right answers pooled. Returns (the index of the layer with the
    highest validation accuracy, the lowest index among ties; the validation accuracy of every layer).
    """
    y = np.asarray(objects, dtype=np.int64)
    g = np.asarray(groups)
    if g.shape != y.shape:
        raise ValueError(f"groups has shape {g.shape}: expected {y.shape}, one per training row")
    k = min(int(folds), len(np.unique(g)))
    if k < 2:
        raise ValueError(f"select_layer: {len(np.unique(g))} training subject(s); cross-validation needs 2")
    fit = _fitter(kind, y, object_vectors, C, alpha, max_iter)
    fold = group_folds(g, k, seed, strata, "readout.inner")
    acc = []
    for X in layers:
        X = _as2d(X, "features")
        if X.shape[0] != len(y):
            raise ValueError(f"features have {X.shape[0]} rows: expected {len(y)}, one per training row")
        right = sum(int((fit.predict(X[fold != f], y[fold != f], X[fold == f]) == y[fold == f]).sum())
                    for f in range(k))
        acc.append(right / len(y))
    if not acc:
        raise ValueError("select_layer: no layer to choose from")
    return int(np.argmax(acc)), acc


def _mode(values: list) -> object:
    """The most frequent value; among ties, the one seen first in sorted order."""
    counts = Counter(values)
    top = max(counts.values())
    return min(v for v, c in counts.items() if c == top)


def nested_layer_readout(layers: Sequence, objects, groups, splits, *, kind: str = "classifier",
                         object_vectors=None, inner_folds: int = 3, strata=None, C: float = 1.0,
                         alpha: float = 1.0, max_iter: int = 2000, seed: int = 0,
                         layer_names: Sequence | None = None) -> dict:
    """A readout at every layer, and at the layer chosen without the test data (nested cross-validation).

    ``layers``: one (n, d) feature array per layer (rows = facts); ``objects``: (n,) object ids (rows of
    ``object_vectors`` for ``kind="vector"``); ``groups``: (n,) subject of each fact; ``splits``: (train,
    test) index pairs with disjoint test parts (:func:`subject_splits`), so that pooled over the splits every
    scored fact is scored once and a Wilson interval over the scored facts applies.

    Per split: the real readout and the shuffled-label control (training targets permuted, seeded per split)
    are fitted on the training part at every layer and scored on the test part (``per_layer``: descriptive
    curves). :func:`select_layer` -- given the training rows only -- chooses the layer by inner
    cross-validation over the training subjects; the control chooses its own layer the same way from its
    permuted targets. The chosen layer's test predictions are those of the per-layer fit (the same fit on the
    same training part). The majority (``chance``), ``prior_baseline`` and ``ceiling`` do not depend on a layer;
    they are scored on the same test facts.

    Returns ``{"per_layer": [row per layer], "selected": row}``. The selected row: ``selected_on``
    ("validation"), ``selected_layer`` (the layer most splits chose; ties: the lower), ``selected_layers``
    (each split's), ``accuracy`` / ``control_accuracy`` (at the chosen layers), ``chance``,
    ``prior_baseline``, ``ceiling``, ``best_on_test_upper_bound`` and ``control_best_on_test_upper_bound``
    (the largest per-layer test accuracy: the layer picked on the test data, an optimistic bound and no
    estimate), each with ``_ci`` and ``_n``; ``n_train`` (mean training facts per split), ``n_test``
    (scored facts), ``n_classes``.
    """
    Xs = [_as2d(X, "features") for X in layers]
    if not Xs:
        raise ValueError("nested_layer_readout: no layer")
    y = np.asarray(objects, dtype=np.int64)
    n = len(y)
    g = np.asarray(groups)
    if any(X.shape[0] != n for X in Xs) or g.shape != (n,):
        raise ValueError(f"every layer's features and groups need one row per object ({n})")
    st = None if strata is None else np.asarray(strata)
    names = list(range(len(Xs))) if layer_names is None else list(layer_names)
    if len(names) != len(Xs):
        raise ValueError(f"{len(names)} layer names for {len(Xs)} layers")
    fit = _fitter(kind, y, object_vectors, C, alpha, max_iter)
    splits = [(np.asarray(tr, dtype=np.int64), np.asarray(te, dtype=np.int64)) for tr, te in splits]
    if not splits:
        raise ValueError("nested_layer_readout: no split")
    seen = np.zeros(n, dtype=np.int64)
    for tr, te in splits:
        if len(tr) == 0 or len(te) == 0:
            raise ValueError(f"train ({len(tr)}) and test ({len(te)}) sets must both be non-empty")
        if np.intersect1d(g[tr], g[te]).size:
            raise ValueError("a subject lies in both the training and the test part of a split")
        seen[te] += 1
    if seen.max() > 1:
        raise ValueError("the test parts of the splits overlap: pooled scores need disjoint test parts")
    L = len(Xs)
    pred = np.full((L, n), -1, dtype=np.int64)
    pred_ctrl = np.full((L, n), -1, dtype=np.int64)
    chosen = np.full(n, -1, dtype=np.int64)
    chosen_ctrl = np.full(n, -1, dtype=np.int64)
    majority = np.zeros(n, dtype=bool)
    prior = np.zeros(n)
    reach = np.zeros(n, dtype=bool)
    sel, sel_ctrl, per_split = [], [], []
    for s, (tr, te) in enumerate(splits):
        y_shuf = y[tr][np.random.default_rng(derive_seed(seed, "readout.control", s)).permutation(len(tr))]
        for j, X in enumerate(Xs):
            pred[j, te] = fit.predict(X[tr], y[tr], X[te])
            pred_ctrl[j, te] = fit.predict(X[tr], y_shuf, X[te])
        train_rows = [X[tr] for X in Xs]
        opts = dict(kind=kind, object_vectors=object_vectors, folds=inner_folds,
                    strata=None if st is None else st[tr], C=C, alpha=alpha, max_iter=max_iter,
                    seed=derive_seed(seed, "readout.select", s))
        j_real, _ = select_layer(train_rows, y[tr], g[tr], **opts)
        j_ctrl, _ = select_layer(train_rows, y_shuf, g[tr], **opts)
        chosen[te], chosen_ctrl[te] = j_real, j_ctrl
        sel.append(j_real)
        sel_ctrl.append(j_ctrl)
        m, p, r = _baselines(fit, y[tr], y[te])
        if m is not None:
            majority[te] = m
        prior[te], reach[te] = p, r
        per_split.append((len(tr), te))
    scored = np.flatnonzero(seen == 1)
    ys = y[scored]
    base = _baseline_estimates(fit, majority[scored] if kind == "classifier" else None, prior[scored],
                               reach[scored], seed)
    base_fields = {k: v for name, e in base.items() for k, v in stats.fields(name, e).items()}
    n_classes = int(len(np.unique(y))) if kind == "classifier" else int(fit.candidates.shape[0])
    n_train = int(round(float(np.mean([t for t, _ in per_split]))))
    common = {"n_train": n_train, "n_test": int(len(scored)), "n_classes": n_classes}

    def split_range(p: np.ndarray, truth: np.ndarray) -> list[float]:
        accs = [float(np.mean(p[te] == truth[te])) for _, te in per_split]
        return [min(accs), max(accs)]

    rows = []
    layer_acc = []
    for j in range(L):
        acc = stats.accuracy(pred[j, scored] == ys)
        ctrl = stats.accuracy(pred_ctrl[j, scored] == ys)
        layer_acc.append((acc, ctrl))
        rows.append({"layer": names[j], **stats.fields("accuracy", acc), **stats.fields("control_accuracy", ctrl),
                     **base_fields, "accuracy_range": split_range(pred[j], y), **common})
    best = int(np.argmax([a.value for a, _ in layer_acc]))
    best_ctrl = int(np.argmax([c.value for _, c in layer_acc]))
    acc = stats.accuracy(pred[chosen[scored], scored] == ys)
    ctrl = stats.accuracy(pred_ctrl[chosen_ctrl[scored], scored] == ys)
    selected = {"selected_on": "validation", "selected_layer": names[_mode(sel)],
                "selected_layers": [names[j] for j in sel], "inner_folds": int(inner_folds),
                **stats.fields("accuracy", acc),
                "control_selected_layer": names[_mode(sel_ctrl)],
                "control_selected_layers": [names[j] for j in sel_ctrl],
                **stats.fields("control_accuracy", ctrl), **base_fields,
                **stats.fields("best_on_test_upper_bound", layer_acc[best][0]), "best_on_test_layer": names[best],
                **stats.fields("control_best_on_test_upper_bound", layer_acc[best_ctrl][1]),
                "n_splits": len(splits), **common}
    return {"per_layer": rows, "selected": selected}


# ---- the probe on a hooked model ------------------------------------------------------

# the one-layer fact model's sites: the subject embedding, then the answer position around the MLP
DEFAULT_SITES = (f"{hooks.embed()}@subject", f"{hooks.resid(0, 'mid')}@last", f"{hooks.mlp_post(0)}@last",
                 f"{hooks.resid(0, 'post')}@last")


@dataclass(frozen=True)
class ReadoutResult(Result):
    per_relation: list  # dicts: relation, site, accuracy, control_accuracy, chance, prior_baseline, ceiling (each
    # with _ci, _n), kind, n_train, n_test, n_classes
    sites: list
    kind: str
    object_vectors: str
    heldout_fraction: float

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def records(self) -> list[dict]:
        """One row per (relation, site)."""
        return self.per_relation

    def table(self) -> dict:
        """{site: {relation: accuracy}}."""
        out: dict = {}
        for row in self.per_relation:
            out.setdefault(row["site"], {})[row["relation"]] = row["accuracy"]
        return out


def object_table(model, ps) -> tuple[np.ndarray, np.ndarray]:
    """(object index per query, object vectors (K, d)): unembedding columns of each distinct object token."""
    W_U = getattr(model, "W_U", None)
    if W_U is None:
        raise ValueError(f"{type(model).__name__} has no W_U: pass object_vectors explicitly")
    toks = ps.object_tokens.numpy()
    uniq, inv = np.unique(toks, return_inverse=True)
    V = W_U[:, uniq].T.detach().float().cpu().double().numpy()
    return inv, V


def readout(model, queries, sites=None, *, relations=None, kind: str = "auto", heldout_fraction: float = 0.25,
            alpha: float = 1.0, C: float = 1.0, seed: int = 0) -> ReadoutResult:
    """Per relation and site: a linear readout from the site's activation to the object, on held-out subjects.

    ``queries``: a :class:`~mechfact.probes.queries.ProbeSet` or a FactWorld.
    ``sites``: :class:`~mechfact.probes.queries.Site` objects or ``"hook@position"`` strings
    (default :data:`DEFAULT_SITES`).
    ``kind="auto"``: ``vector`` (ridge onto the object's unembedding column, nearest
    object decoding) when every object of the relation is unique, else ``classifier``.
    Held-out subjects are the same for every relation and site. Features are
    scaled to unit RMS first (``alpha`` is then comparable across sites).
    """
    from .queries import Site, as_probe_set, check_relation, collect

    if kind not in ("auto", *KINDS):
        raise ValueError(f"kind={kind!r}: allowed auto, {', '.join(KINDS)}")
    _check_strengths(alpha, C)
    check_float("heldout", heldout_fraction, lo=0, hi=1, lo_open=True, hi_open=True)
    ps = as_probe_set(queries)
    sites = [Site.parse(s) for s in (DEFAULT_SITES if sites is None else sites)]
    rels = ps.relation_ids if relations is None else [int(r) for r in relations]
    for r in rels:
        check_relation(ps, r)
    acts = collect(model, ps, sites)
    feats = {s: acts[s].double().numpy() for s in sites}
    subj = np.unique(ps.subjects.numpy())
    tr_s, te_s = split_indices(len(subj), heldout_fraction, seed, "readout.subjects")
    test_subjects = set(subj[te_s].tolist())
    obj_idx = vecs = None
    rows, kinds = [], set()
    for r in rels:
        sel = np.nonzero(ps.relations.numpy() == r)[0]
        is_test = np.array([int(s) in test_subjects for s in ps.subjects.numpy()[sel]])
        tr, te = np.nonzero(~is_test)[0], np.nonzero(is_test)[0]
        objs = ps.object_tokens.numpy()[sel]
        k = kind if kind != "auto" else ("vector" if len(np.unique(objs)) == len(objs) else "classifier")
        kinds.add(k)
        if k == "vector" and vecs is None:
            obj_idx, vecs = object_table(model, ps)
        for s in sites:
            X = feats[s][sel]
            X = X / max(float(np.sqrt((X**2).mean())), 1e-12)
            y = obj_idx[sel] if k == "vector" else objs
            if k == "vector":  # candidates: this relation's objects only
                cand = np.unique(y)
                remap = {int(c): i for i, c in enumerate(cand)}
                sc = linear_readout(X, [remap[int(v)] for v in y], tr, te, kind="vector",
                                    object_vectors=vecs[cand], alpha=alpha, seed=seed)
            else:
                sc = linear_readout(X, y, tr, te, kind="classifier", C=C, seed=seed)
            rows.append({"relation": int(r), "site": str(s), **sc.to_dict()})
    return ReadoutResult(rows, [str(s) for s in sites], "/".join(sorted(kinds)), "W_U columns of the objects",
                         heldout_fraction)
