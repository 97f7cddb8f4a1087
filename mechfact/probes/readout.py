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
``control_accuracy``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from .. import hooks
from ..config import check_float
from ..seeding import derive_seed

KINDS = ("classifier", "vector")


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

    def to_dict(self) -> dict:
        return asdict(self)


def split_indices(n: int, heldout_fraction: float = 0.25, seed: int = 0, tag: str = "readout.split"
                  ) -> tuple[np.ndarray, np.ndarray]:
    """A seeded (train, test) split of ``range(n)``; both parts non-empty."""
    if n < 2:
        raise ValueError(f"n={n}: a train/test split needs at least 2 items")
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction={heldout_fraction}: must lie in (0, 1)")
    perm = np.random.default_rng(derive_seed(seed, tag)).permutation(n)
    n_test = min(n - 1, max(1, int(round(heldout_fraction * n))))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def stratified_split_indices(labels, heldout_fraction: float = 0.25, seed: int = 0, tag: str = "readout.split"
                             ) -> tuple[np.ndarray, np.ndarray]:
    """A seeded (train, test) split balanced by label (object): each label with n >= 2 items puts
    ``round(fraction * n)`` of them (at least 1, at most n - 1) in the test part; labels seen once are split
    at random in the same proportion. Both parts non-empty. As the LRE authors split by object."""
    y = np.asarray(labels)
    if len(y) < 2:
        raise ValueError(f"n={len(y)}: a train/test split needs at least 2 items")
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction={heldout_fraction}: must lie in (0, 1)")
    rng = np.random.default_rng(derive_seed(seed, tag + ".stratified"))
    test, singles = [], []
    for c in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == c))
        if len(members) == 1:
            singles.append(int(members[0]))
        else:
            test += members[:min(len(members) - 1, max(1, int(round(heldout_fraction * len(members)))))].tolist()
    singles = rng.permutation(np.array(singles, dtype=np.int64))
    test += singles[:int(round(heldout_fraction * len(singles)))].tolist()
    if not test:
        test = [int(rng.integers(len(y)))]
    if len(test) == len(y):
        test = test[1:]
    te = np.sort(np.array(test, dtype=np.int64))
    return np.setdiff1d(np.arange(len(y)), te), te


def _check_strengths(alpha: float, C: float) -> None:
    """Ridge ``alpha`` and logistic ``C``: finite and positive (scikit-learn's own errors name neither flag)."""
    check_float("alpha", alpha, lo=0, lo_open=True)
    check_float("C", C, lo=0, lo_open=True)


def _as2d(x, name: str) -> np.ndarray:
    a = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name} has shape {a.shape}: expected (n, features)")
    return a


def _classifier(X_tr, y_tr, X_te, y_te, C: float, max_iter: int) -> float:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if len(np.unique(y_tr)) < 2:  # nothing to learn: predict the only class
        return float(np.mean(y_te == y_tr[0]))
    clf = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter))
    clf.fit(X_tr, y_tr)
    return float(np.mean(clf.predict(X_te) == y_te))


def _vector(X_tr, V_tr, X_te, y_te, candidates: np.ndarray, alpha: float) -> float:
    from sklearn.linear_model import Ridge

    reg = Ridge(alpha=alpha, fit_intercept=True).fit(X_tr, V_tr)
    pred = reg.predict(X_te)
    pn = pred / np.maximum(np.linalg.norm(pred, axis=1, keepdims=True), 1e-12)
    cn = candidates / np.maximum(np.linalg.norm(candidates, axis=1, keepdims=True), 1e-12)
    return float(np.mean(np.argmax(pn @ cn.T, axis=1) == y_te))


def linear_readout(features, objects: Sequence[int], train_idx, test_idx, *, kind: str = "classifier",
                   object_vectors=None, C: float = 1.0, alpha: float = 1.0, max_iter: int = 2000,
                   seed: int = 0) -> ReadoutScore:
    """Fit a linear readout ``features[i] -> objects[i]`` on ``train_idx``, score on ``test_idx``.

    ``features``: (n, d) representations, one row per (subject) query.
    ``objects``: (n,) integer object ids. For ``kind="vector"`` they index the
    rows of ``object_vectors`` (n_objects, k), which are also the candidates the
    prediction is decoded against. ``C`` (logistic) and ``alpha`` (ridge) are the
    regularisation strengths.
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: allowed {KINDS}")
    _check_strengths(alpha, C)
    X = _as2d(features, "features")
    y = np.asarray(objects, dtype=np.int64)
    if y.shape != (X.shape[0],):
        raise ValueError(f"objects has shape {y.shape}: expected ({X.shape[0]},), one per feature row")
    tr, te = np.asarray(train_idx, dtype=np.int64), np.asarray(test_idx, dtype=np.int64)
    if len(tr) == 0 or len(te) == 0:
        raise ValueError(f"train ({len(tr)}) and test ({len(te)}) sets must both be non-empty")
    rng = np.random.default_rng(derive_seed(seed, "readout.control"))
    y_shuf = y[tr][rng.permutation(len(tr))]
    if kind == "classifier":
        acc = _classifier(X[tr], y[tr], X[te], y[te], C, max_iter)
        ctrl = _classifier(X[tr], y_shuf, X[te], y[te], C, max_iter)
        vals, counts = np.unique(y[tr], return_counts=True)
        chance = float(np.mean(y[te] == vals[np.argmax(counts)]))
        p_train = dict(zip(vals.tolist(), (counts / counts.sum()).tolist()))
        prior = float(np.mean([p_train.get(int(v), 0.0) for v in y[te]]))
        n_classes = int(len(np.unique(y)))
    else:
        if object_vectors is None:
            raise ValueError("kind='vector' needs object_vectors (n_objects, k)")
        V = _as2d(object_vectors, "object_vectors")
        if y.min() < 0 or y.max() >= V.shape[0]:
            raise ValueError(f"object ids span {y.min()}..{y.max()}: allowed 0..{V.shape[0] - 1} (rows of object_vectors)")
        acc = _vector(X[tr], V[y[tr]], X[te], y[te], V, alpha)
        ctrl = _vector(X[tr], V[y_shuf], X[te], y[te], V, alpha)
        chance = prior = 1.0 / V.shape[0]
        n_classes = int(V.shape[0])
    return ReadoutScore(kind=kind, accuracy=acc, control_accuracy=ctrl, chance=chance,
                        n_train=int(len(tr)), n_test=int(len(te)), n_classes=n_classes, prior_baseline=prior)


# ---- the probe on a hooked model ------------------------------------------------------

# the one-layer fact model's sites: the subject embedding, then the answer position around the MLP
DEFAULT_SITES = (f"{hooks.embed()}@subject", f"{hooks.resid(0, 'mid')}@last", f"{hooks.mlp_post(0)}@last",
                 f"{hooks.resid(0, 'post')}@last")


@dataclass
class ReadoutResult:
    per_relation: list  # dicts: relation, site, accuracy, control_accuracy, chance, kind, n_train, n_test, n_classes
    sites: list
    kind: str
    object_vectors: str
    heldout_fraction: float

    def to_dict(self) -> dict:
        return asdict(self)

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
