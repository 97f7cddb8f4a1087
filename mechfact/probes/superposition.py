"""Superposition test: is each subject embedding a linear superposition of its R attribute vectors?

Model (geometric memorisation)::

    x_s  ~=  c + sum_r  v_{pi_r(s)} M_r          x_s (d,), v_e (k,), M_r (k, d)

``x_s`` is subject s's input embedding and ``v_e`` the attribute vector of
entity e. For a trained model the attribute vectors are the UNEMBEDDING columns
``v_e = W_U[:, e]``: the selector writes (a map of) ``v_{pi_r(s)}`` into the
residual stream so that the logit of ``pi_r(s)`` wins, and at a stationary point
of an L2-regularised loss the embedding gradient is ``sum_r J_r^T (v_{pi_r(s)} -
E_p v)``, a superposition of exactly these vectors. For the explicit
construction ``W_U[:, e] = [a_e; 0]``, so the maps are the block placements.

The maps are fitted by ridge regression (multi-output, alpha chosen by
generalised cross-validation on the training subjects) and scored by R^2 on
held-out subjects. The fit has ``R * rank(V)`` features per output coordinate
(``n_features``): with fewer training subjects than that it is underdetermined
and held-out R^2 drops even on the construction (N = 64, R = 3, b = 24: 0.70).
Control: the same fit with each relation's attribute assignment shuffled
across subjects (held-out R^2 near 0 or below). The fitted maps BUILD
embeddings for any new facts: :meth:`SuperpositionFit.build`.

Block structure: the row space of each ``M_r`` is where relation r's attribute
is written; ``block_overlap[r][r']`` is the mean squared cosine of the principal
angles between those subspaces (1 on the diagonal; 0 off it for disjoint
blocks, about q/d for random q-dimensional subspaces).

Null distributions (:func:`superposition_null`, and ``mechfact llm superposition``): the same ridge in its kernel
form, k-fold over subjects, vectorised over null draws (attributes shuffled across subjects, or random attribute
vectors): :func:`kfold`, :func:`code_kernel`, :func:`fold_kernels`, :func:`fit_fold`, :func:`cv_r2`. There the
ridge strength is chosen by generalised cross-validation (GCV) over :data:`GCV_ALPHAS`, relative to each
kernel's scale, for the observed fit and every draw alike.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..results import Result, scalar_row
from ..seeding import derive_seed, generator
from .folds import kfold, split_indices  # noqa: F401 (kfold: its home was here)

ALPHAS = np.logspace(-8, 2, 11)


def _np(x) -> np.ndarray:
    return np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x, dtype=np.float64)


def design(attributes: np.ndarray, perms: np.ndarray, subjects: np.ndarray) -> np.ndarray:
    """Rows ``[v_{pi_0(s)}, ..., v_{pi_{R-1}(s)}]`` for each subject, (n, R k)."""
    return np.concatenate([attributes[perms[r, subjects]] for r in range(perms.shape[0])], axis=1)


def r2(X: np.ndarray, pred: np.ndarray, mean: np.ndarray) -> float:
    """1 - SS_res / SS_tot, pooled over coordinates, SS_tot around ``mean`` (the training mean)."""
    tot = float(((X - mean) ** 2).sum())
    return 1.0 - float(((X - pred) ** 2).sum()) / tot if tot > 0 else float("nan")


@dataclass
class SuperpositionFit:
    """Fitted maps: ``coef_`` (R k, d), ``intercept_`` (d,), ``alpha_``; R and k."""

    n_relations: int
    coef_: np.ndarray
    intercept_: np.ndarray
    alpha_: float

    @property
    def maps(self) -> np.ndarray:
        """(R, k, d): M_r."""
        return self.coef_.reshape(self.n_relations, -1, self.coef_.shape[1])

    def predict(self, attributes: np.ndarray, perms, subjects=None) -> np.ndarray:
        perms = _np(perms).astype(np.int64)
        subjects = np.arange(perms.shape[1]) if subjects is None else np.asarray(subjects)
        return design(_np(attributes), perms, subjects) @ self.coef_ + self.intercept_

    def build(self, attributes, perms) -> torch.Tensor:
        """Embeddings (N, d) that encode the bijections ``perms`` (R, N): the zero-shot construction."""
        return torch.tensor(self.predict(attributes, perms), dtype=torch.float32)


def fit_superposition(embeddings, attributes, perms, subjects, alphas=ALPHAS) -> SuperpositionFit:
    """Ridge fit of ``embeddings[s]`` on ``[v_{pi_r(s)}]_r`` over ``subjects``."""
    from sklearn.linear_model import RidgeCV

    X, V, P = _np(embeddings), _np(attributes), _np(perms).astype(np.int64)
    subjects = np.asarray(subjects)
    Z = design(V, P, subjects)
    scale = float((Z**2).sum() / max(Z.shape[1], 1)) or 1.0  # alphas relative to the mean feature energy
    reg = RidgeCV(alphas=alphas * scale, fit_intercept=True).fit(Z, X[subjects])
    return SuperpositionFit(P.shape[0], np.asarray(reg.coef_.T), np.asarray(reg.intercept_), float(reg.alpha_))


def _svd(M: np.ndarray, full_matrices: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.linalg.svd(M, full_matrices)``. numpy's divide-and-conquer driver (gesdd) now and then fails to
    converge on a finite matrix (seen on a fitted map of a model at N = 4096, d = 84); QR iteration (gesvd) is then
    used, as LAPACK advises."""
    if not np.isfinite(M).all():
        raise ValueError(f"a matrix of shape {M.shape} given to the SVD holds non-finite values")
    try:
        return np.linalg.svd(M, full_matrices=full_matrices)
    except np.linalg.LinAlgError:
        import scipy.linalg

        return scipy.linalg.svd(M, full_matrices=full_matrices, lapack_driver="gesvd")


def block_overlap(maps: np.ndarray, energy: float = 0.9) -> tuple[list[list[float]], list[int]]:
    """Mean squared principal-angle cosines between the row spaces of the M_r (see module doc)."""
    bases = []
    for M in maps:
        _, s, vt = _svd(M)
        cum = np.cumsum(s**2) / max(float((s**2).sum()), 1e-300)
        q = int(np.searchsorted(cum, energy) + 1)
        bases.append(vt[:q].T)
    R = len(bases)
    ov = [[float(np.linalg.norm(bases[a].T @ bases[b]) ** 2 / min(bases[a].shape[1], bases[b].shape[1]))
           for b in range(R)] for a in range(R)]
    return ov, [b.shape[1] for b in bases]


@dataclass(frozen=True)
class SuperpositionResult(Result):
    r2_train: float
    r2_heldout: float
    control_r2_heldout: float  # same fit, attribute assignment from unrelated random permutations
    control_r2_train: float
    per_relation_variance_share: list[float]  # var of each relation's term / var of the embeddings
    block_overlap: list[list[float]]
    block_rank: list[int]  # dimensions per relation subspace (90% of the map's energy)
    alpha: float
    n_train: int
    n_heldout: int
    n_features: int  # R * numerical rank of the attribute vectors: the fit is well posed only if n_train >> this
    attribute_coadaptation_r2: float  # held-out R^2 of v_{pi_b(s)} from v_{pi_a(s)}, mean over a != b (0: independent)
    attribute_source: str
    fit: SuperpositionFit | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("fit")
        return d

    @property
    def records(self) -> list[dict]:
        """One row: the fit's scalar numbers (R^2 and controls, alpha, sizes)."""
        return [scalar_row(self)]


def superposition_test(embeddings, attributes, perms, train_subjects, heldout_subjects, *, seed: int = 0,
                       attribute_source: str = "W_U columns", coadaptation: bool = True,
                       structure: bool = True) -> SuperpositionResult:
    """Fit on ``train_subjects``, score on ``heldout_subjects``; control with unrelated permutations.

    ``coadaptation=False`` skips :func:`attribute_coadaptation` (NaN; it costs R (R-1) fits);
    ``structure=False`` skips the block overlap and the rank of the attribute table (empty / 0).
    """
    X, V, P = _np(embeddings), _np(attributes), _np(perms).astype(np.int64)
    if X.shape[0] != P.shape[1] or P.min() < 0 or P.max() >= V.shape[0]:
        raise ValueError(f"embeddings {X.shape}, attributes {V.shape} and perms {P.shape} disagree: perms must be "
                         "(relations, subjects) indices into the attribute rows")
    tr, te = np.asarray(train_subjects), np.asarray(heldout_subjects)
    f = fit_superposition(X, V, P, tr)
    mean = X[tr].mean(0)
    R = P.shape[0]
    # each relation's assignment shuffled across subjects: same attribute frequencies (also for pool worlds)
    ctrl_perms = np.stack([P[r][torch.randperm(P.shape[1], generator=generator(seed, "probes.superposition.control",
                                                                               r)).numpy()] for r in range(R)])
    fc = fit_superposition(X, V, ctrl_perms, tr)
    Z = design(V, P, np.arange(P.shape[1]))
    k = V.shape[1]
    tot = float(((X - X.mean(0)) ** 2).sum())
    share = [float(((Z[:, r * k:(r + 1) * k] @ f.coef_[r * k:(r + 1) * k]) ** 2).sum()
                   - len(X) * ((Z[:, r * k:(r + 1) * k] @ f.coef_[r * k:(r + 1) * k]).mean(0) ** 2).sum()) / tot
             for r in range(R)]
    ov, ranks = block_overlap(f.maps) if structure else ([], [])
    return SuperpositionResult(
        r2_train=r2(X[tr], f.predict(V, P, tr), mean), r2_heldout=r2(X[te], f.predict(V, P, te), mean),
        control_r2_heldout=r2(X[te], fc.predict(V, ctrl_perms, te), mean),
        control_r2_train=r2(X[tr], fc.predict(V, ctrl_perms, tr), mean),
        per_relation_variance_share=share, block_overlap=ov, block_rank=ranks, alpha=f.alpha_,
        n_train=int(len(tr)), n_heldout=int(len(te)), n_features=R * int(np.linalg.matrix_rank(V)) if structure else 0,
        attribute_coadaptation_r2=attribute_coadaptation(V, P, tr, te) if coadaptation else float("nan"),
        attribute_source=attribute_source, fit=f)


def attribute_coadaptation(attributes, perms, train_subjects, heldout_subjects) -> float:
    """Do the attribute vectors of ONE subject's facts predict each other?

    Held-out R^2 of ``v_{pi_b(s)}`` regressed on ``v_{pi_a(s)}`` across subjects,
    averaged over relation pairs a != b. Independent attribute vectors (the
    construction, any random table) give ~0; a trained unembedding that has
    co-adapted with the facts gives > 0, and then embeddings built for NEW
    bijections (whose attribute combinations lack that correlation) fail.
    """
    from sklearn.linear_model import RidgeCV

    V, P = _np(attributes), _np(perms).astype(np.int64)
    tr, te = np.asarray(train_subjects), np.asarray(heldout_subjects)
    R = P.shape[0]
    if R < 2:
        return float("nan")
    out = []
    for a in range(R):
        for b in range(R):
            if a != b:
                A, B = V[P[a]], V[P[b]]
                reg = RidgeCV(alphas=np.logspace(-6, 2, 9)).fit(A[tr], B[tr])
                out.append(r2(B[te], reg.predict(A[te]), B[tr].mean(0)))
    return float(np.mean(out))


def split_entities(n: int, heldout_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) subjects of the superposition fit (:func:`~mechfact.probes.folds.split_indices`)."""
    return split_indices(n, heldout_fraction, seed, "probes.subject_split")


# ---- cross-validated kernel ridge, vectorised over null draws -----------------------------------------------
#
# The fit ``h_s ~ c + sum_r a_r(s) M_r`` is a ridge regression whose design enters only through the kernel
# ``K[s, t] = sum_r <a_r(s), a_r(t)>`` (subjects x subjects), and whose targets enter only through their Gram
# ``H H^T``. So every draw of a null (attributes shuffled across subjects, random attribute vectors) is a new
# ``n x n`` kernel; per fold it is eigendecomposed once (the centred training block, m x m), and then the GCV
# choice of alpha over a whole grid, the in-sample fit and the held-out residuals of any targets cost a few
# small matrix products per draw. Nothing of size d_model or R * k is formed per draw.

GCV_ALPHAS = np.logspace(-4, 4, 17)  # ridge strengths, relative to the mean eigenvalue of the centred training kernel


def code_kernel(gram: np.ndarray, perms: np.ndarray) -> np.ndarray:
    """``K[s, t] = sum_r gram[perms[r, s], perms[r, t]]``: the design's kernel from the Gram of the attribute codes.

    ``gram`` (c, c) or one per draw (B, c, c); ``perms`` (R, n) or one per draw (B, R, n). Returns (n, n) or
    (B, n, n)."""
    g, p = np.asarray(gram, dtype=np.float64), np.asarray(perms, dtype=np.int64)
    if g.ndim == 2 and p.ndim == 2:
        return sum(g[np.ix_(p[r], p[r])] for r in range(p.shape[0]))
    B = g.shape[0] if g.ndim == 3 else p.shape[0]
    g = np.broadcast_to(g, (B,) + g.shape[-2:]) if g.ndim == 2 else g
    p = np.broadcast_to(p, (B,) + p.shape[-2:]) if p.ndim == 2 else p
    b = np.arange(B)[:, None, None]
    return sum(g[b, p[:, r, :, None], p[:, r, None, :]] for r in range(p.shape[1]))


def factor(X: np.ndarray) -> np.ndarray:
    """(n, q) with ``F F^T = X X^T`` (q <= n): a thin stand-in for wide targets (every fit here depends on the
    targets only through their Gram)."""
    X = np.asarray(X, dtype=np.float64)
    if X.shape[-1] <= X.shape[-2]:
        return X
    u, s, _ = _svd(X)
    return u * s[..., None, :]


def _eigh(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Batched symmetric eigendecomposition on one BLAS thread (threaded LAPACK is 4-50x slower on small stacks)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - sklearn depends on threadpoolctl
        return np.linalg.eigh(a)
    with threadpool_limits(limits=1):
        return np.linalg.eigh(a)


@dataclass
class FoldKernels:
    """The kernel side of one fold, for B kernels: ``Q`` (m, m') orthonormal basis of what the fixed regressors
    (intercept, nuisance) leave of the training rows; ``Nt`` (t, m) their held-out prediction ``N_te N_tr^+``;
    ``lam``/``U`` the eigenpairs of ``Q^T K_tr Q``; ``Pt`` (B, t, m') ``(K_te,tr - Nt K_tr) Q U``; ``scale`` (B,)
    the mean eigenvalue (alphas are relative to it)."""

    tr: np.ndarray
    te: np.ndarray
    Q: np.ndarray
    Nt: np.ndarray
    n_fixed: int
    lam: np.ndarray
    U: np.ndarray
    Pt: np.ndarray
    scale: np.ndarray

    def select(self, idx) -> "FoldKernels":
        """The same fold for a subset of the kernels."""
        return FoldKernels(self.tr, self.te, self.Q, self.Nt, self.n_fixed, self.lam[idx], self.U[idx], self.Pt[idx],
                           self.scale[idx])


def fold_kernels(kernels: np.ndarray, tr, te, nuisance: np.ndarray | None = None) -> FoldKernels:
    """Eigendecompose the training block of every kernel (B, n, n) for one fold. ``nuisance`` (n, c): regressors
    fitted without penalty beside the intercept (None: the intercept alone)."""
    K = np.asarray(kernels, dtype=np.float64)
    K = K[None] if K.ndim == 2 else K
    tr, te = np.asarray(tr), np.asarray(te)
    m = len(tr)
    N = np.ones((K.shape[1], 1)) if nuisance is None else np.column_stack([np.ones(K.shape[1]), nuisance])
    u, s, _ = _svd(N[tr], full_matrices=True)
    rank = int((s > 1e-10 * s[0]).sum())
    Q = u[:, rank:]
    Nt = N[te] @ np.linalg.pinv(N[tr], rcond=1e-10)
    Ktr = K[:, tr][:, :, tr]
    Kq = Q.T @ Ktr @ Q
    lam, U = _eigh((Kq + np.swapaxes(Kq, 1, 2)) / 2)
    lam = np.maximum(lam, 0.0)
    Pt = ((K[:, te][:, :, tr] - Nt @ Ktr) @ Q) @ U
    scale = lam.mean(1)
    scale = np.where(scale > 0, scale, 1.0)
    return FoldKernels(tr, te, Q, Nt, rank, lam, U, Pt, scale)


def fit_fold(fk: FoldKernels, F: np.ndarray, alphas: np.ndarray | None = None, predict: bool = False) -> dict:
    """Ridge of targets ``F`` (n, p), or one per draw (B, n, p), on each of the fold's kernels; alpha by GCV over
    ``alphas`` (relative to each kernel's mean eigenvalue; default :data:`GCV_ALPHAS`).

    Returns per draw: ``res`` (B, t) held-out squared residual per test subject, ``sst`` (B|1, t) its squared
    distance from the training mean, ``nuis`` (B|1, t) the residual of the fixed regressors alone, ``alpha_index``
    / ``alpha`` (absolute) / ``r2_train`` (B,), and with ``predict`` the held-out predictions ``pred`` (B, t, p).
    """
    F = np.asarray(F, dtype=np.float64)
    Ft, Fe = F[..., fk.tr, :], F[..., fk.te, :]
    m = len(fk.tr)
    A0 = np.swapaxes(fk.Q, 0, 1) @ Ft  # (B|1, m', p)
    UA = np.swapaxes(fk.U, 1, 2) @ A0  # (B, m', p)
    d = (UA ** 2).sum(-1)  # (B, m')
    a = np.asarray(GCV_ALPHAS if alphas is None else alphas, dtype=np.float64)
    s = fk.lam[:, None, :] / (fk.lam[:, None, :] + a[None, :, None] * fk.scale[:, None, None])  # (B, A, m')
    rss = (((1 - s) ** 2) * d[:, None, :]).sum(-1)
    df = fk.n_fixed + s.sum(-1)
    gcv = np.where(df < m, rss / m / np.maximum(1 - df / m, 1e-12) ** 2, np.inf)
    ia = np.argmin(gcv, axis=1)
    B = len(ia)
    alpha = a[ia] * fk.scale
    Dst = 1.0 / (fk.lam + alpha[:, None])
    Rn = Fe - fk.Nt @ Ft  # (B|1, t, p): the residual of the fixed regressors
    r = Rn - (fk.Pt * Dst[:, None, :]) @ UA
    mu = Ft.mean(-2, keepdims=True)
    tss_tr = ((Ft - mu) ** 2).sum((-1, -2))
    out = {"res": (r ** 2).sum(-1), "sst": np.atleast_2d(((Fe - mu) ** 2).sum(-1)),
           "nuis": np.atleast_2d((Rn ** 2).sum(-1)), "alpha_index": ia,
           "alpha": alpha, "r2_train": 1 - rss[np.arange(B), ia] / np.where(tss_tr > 0, tss_tr, np.nan)}
    if predict:
        out["pred"] = Fe - r
    return out


def cv_r2(kernels: np.ndarray, F: np.ndarray, folds, *, nuisance: np.ndarray | None = None,
          alphas: np.ndarray | None = None) -> dict:
    """Held-out R^2 of targets ``F`` (n, p) on each kernel (B, n, n), pooled over ``folds``: ``1 - sum res /
    sum sst`` (sst around each fold's training mean). Returns ``r2`` (B,), per subject ``res`` (B, n) and
    ``sst`` (n,) summed over repeats, ``alpha`` (B, folds) and ``r2_train`` (B, folds)."""
    K = np.asarray(kernels, dtype=np.float64)
    K = K[None] if K.ndim == 2 else K
    n = K.shape[1]
    res, sst = np.zeros((K.shape[0], n)), np.zeros(n)
    alpha, r2_train = [], []
    for tr, te in folds:
        f = fit_fold(fold_kernels(K, tr, te, nuisance), F, alphas)
        np.add.at(res, (slice(None), te), f["res"])
        np.add.at(sst, te, f["sst"][0])
        alpha.append(f["alpha"])
        r2_train.append(f["r2_train"])
    return {"r2": 1 - res.sum(1) / sst.sum(), "res": res, "sst": sst, "alpha": np.stack(alpha, 1),
            "r2_train": np.stack(r2_train, 1)}


def shuffled_perms(n: int, n_draws: int, seed: int = 0, tag: str = "probes.superposition.null") -> np.ndarray:
    """(n_draws, n) seeded permutations of the subjects."""
    rng = np.random.default_rng(derive_seed(seed, tag))
    return np.argsort(rng.random((n_draws, n)), axis=1)


def random_code_grams(n_codes: int, width: int, n_draws: int, scale: float, seed: int = 0,
                      tag: str = "probes.superposition.random_features", chunk: int = 32) -> np.ndarray:
    """(n_draws, n_codes, n_codes) Grams of random Gaussian code tables (entries N(0, scale^2), ``width`` wide)."""
    rng = np.random.default_rng(derive_seed(seed, tag))
    out = np.empty((n_draws, n_codes, n_codes))
    for i in range(0, n_draws, chunk):
        b = min(chunk, n_draws - i)
        Vr = rng.standard_normal((b, n_codes, width)) * scale
        out[i:i + b] = Vr @ np.swapaxes(Vr, 1, 2)
    return out


def superposition_null(embeddings, attributes, perms, *, folds: int = 5, repeats: int = 1, n_null: int = 200,
                       null: str = "shuffled", seed: int = 0, alphas: np.ndarray | None = None) -> dict:
    """Permutation test of the superposition fit: held-out R^2 (k-fold over subjects) against ``n_null`` draws.

    ``null="shuffled"``: the subjects' attribute tuples reassigned to other subjects' states (one permutation of
    the subjects per draw: all relations move together, so the design keeps its own correlations);
    ``"random_features"``: every attribute code replaced by a random Gaussian vector of the same width and mean
    square. Returns ``r2_heldout``, ``null`` (n_null,) and :func:`mechfact.stats.null_summary`'s fields.
    """
    from ..stats import null_summary

    X, V, P = _np(embeddings), _np(attributes), _np(perms).astype(np.int64)
    n = X.shape[0]
    G = V @ V.T
    K0 = code_kernel(G, P)
    if null == "shuffled":
        pi = shuffled_perms(n, n_null, seed)
        Kn = K0[pi[:, :, None], pi[:, None, :]]
    elif null == "random_features":
        Gr = random_code_grams(V.shape[0], V.shape[1], n_null, float(np.sqrt((V ** 2).mean())), seed)
        Kn = code_kernel(Gr, P)
    else:
        raise ValueError(f"null {null!r}: allowed values are shuffled, random_features")
    out = cv_r2(np.concatenate([K0[None], Kn]), factor(X - X.mean(0)), kfold(n, folds, repeats, seed),
                alphas=alphas)
    obs, draws = float(out["r2"][0]), out["r2"][1:]
    return {"r2_heldout": obs, "null": draws, **null_summary(obs, draws)}
