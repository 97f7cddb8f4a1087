"""The fits behind the linear readouts (:mod:`.readout`): a multinomial logistic classifier or a ridge map
onto object vectors decoded by the nearest candidate, and the baselines every score is reported with
(``chance``, ``prior_baseline``, ``ceiling``)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from .. import stats
from ..config import check_float
from ..seeding import derive_seed

KINDS = ("classifier", "vector")


def _check_strengths(alpha: float, C: float) -> None:
    """Ridge ``alpha`` and logistic ``C``: finite and positive (scikit-learn's own errors name neither flag)."""
    check_float("alpha", alpha, lo=0, lo_open=True)
    check_float("C", C, lo=0, lo_open=True)


def _as2d(x, name: str) -> np.ndarray:
    a = np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name} has shape {a.shape}: expected (n, features)")
    return a


def _predict_classifier(X_tr, y_tr, X_te, C: float, max_iter: int) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    if len(np.unique(y_tr)) < 2:  # nothing to learn: predict the only class
        return np.full(len(X_te), y_tr[0], dtype=np.int64)
    scaler = StandardScaler().fit(X_tr)
    Z_tr, Z_te = scaler.transform(X_tr), scaler.transform(X_te)
    if Z_tr.shape[1] > Z_tr.shape[0]:
        # fewer items than features: the L2-penalised weights lie in the span of the (centred) training rows, so
        # the fit in the coordinates of that span has the same optimum, and is found faster
        _, sv, Vt = np.linalg.svd(Z_tr, full_matrices=False)
        basis = Vt[sv > sv[0] * 1e-10].T if sv[0] > 0 else Vt[:1].T
        Z_tr, Z_te = Z_tr @ basis, Z_te @ basis
    with warnings.catch_warnings():  # small inner folds: many classes for few items is expected, not a mistake
        warnings.filterwarnings("ignore", message="The number of unique classes", category=UserWarning)
        clf = LogisticRegression(C=C, max_iter=max_iter).fit(Z_tr, y_tr)
    return np.asarray(clf.predict(Z_te), dtype=np.int64)


def _predict_vector(X_tr, V_tr, X_te, candidates: np.ndarray, alpha: float) -> np.ndarray:
    from sklearn.linear_model import Ridge

    reg = Ridge(alpha=alpha, fit_intercept=True).fit(X_tr, V_tr)
    pred = reg.predict(X_te)
    pn = pred / np.maximum(np.linalg.norm(pred, axis=1, keepdims=True), 1e-12)
    cn = candidates / np.maximum(np.linalg.norm(candidates, axis=1, keepdims=True), 1e-12)
    return np.argmax(pn @ cn.T, axis=1).astype(np.int64)


@dataclass
class _Fitter:
    """One kind of readout: ``predict(X_tr, y_tr, X_te)`` -> predicted object ids of ``X_te``."""

    kind: str
    candidates: np.ndarray | None = None  # (K, k) object vectors, vector kind
    C: float = 1.0
    alpha: float = 1.0
    max_iter: int = 2000

    def predict(self, X_tr, y_tr, X_te) -> np.ndarray:
        if self.kind == "classifier":
            return _predict_classifier(X_tr, y_tr, X_te, self.C, self.max_iter)
        return _predict_vector(X_tr, self.candidates[y_tr], X_te, self.candidates, self.alpha)


def _fitter(kind: str, y: np.ndarray, object_vectors, C: float, alpha: float, max_iter: int) -> _Fitter:
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: allowed {KINDS}")
    _check_strengths(alpha, C)
    if kind == "classifier":
        return _Fitter(kind, None, C, alpha, max_iter)
    if object_vectors is None:
        raise ValueError("kind='vector' needs object_vectors (n_objects, k)")
    V = _as2d(object_vectors, "object_vectors")
    if len(y) and (y.min() < 0 or y.max() >= V.shape[0]):
        raise ValueError(f"object ids span {y.min()}..{y.max()}: allowed 0..{V.shape[0] - 1} (rows of object_vectors)")
    return _Fitter(kind, V, C, alpha, max_iter)


def _baselines(fit: _Fitter, y_tr: np.ndarray, y_te: np.ndarray) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """Per test item: (majority guess right -- None for the vector kind, whose chance is 1 / #candidates --,
    probability of its object under the training prior, whether the readout can name its object at all)."""
    if fit.kind == "vector":
        k = fit.candidates.shape[0]
        return None, np.full(len(y_te), 1.0 / k), np.ones(len(y_te), dtype=bool)
    vals, counts = np.unique(y_tr, return_counts=True)
    p_train = dict(zip(vals.tolist(), (counts / counts.sum()).tolist()))
    return (y_te == vals[np.argmax(counts)], np.array([p_train.get(int(v), 0.0) for v in y_te]),
            np.isin(y_te, vals))


def _exact(value: float, n: int) -> stats.Estimate:
    return stats.Estimate(value, value, value, n, "exact")


def _baseline_estimates(fit: _Fitter, majority, prior: np.ndarray, reach: np.ndarray, seed: int) -> dict:
    """``chance`` (Wilson of the majority guess; exact 1 / #candidates for the vector kind), ``prior_baseline``
    (bootstrap over test items of each item's prior probability; exact for the vector kind), ``ceiling`` (Wilson;
    exact 1 for the vector kind)."""
    n = len(prior)
    if fit.kind == "vector":
        c = float(prior[0]) if n else None
        return {"chance": _exact(c, n), "prior_baseline": _exact(c, n), "ceiling": _exact(1.0 if n else None, n)}
    return {"chance": stats.accuracy(majority),
            "prior_baseline": stats.bootstrap(prior, seed=derive_seed(seed, "readout.prior")),
            "ceiling": stats.accuracy(reach)}
