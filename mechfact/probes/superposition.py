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
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..seeding import derive_seed, generator

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


def block_overlap(maps: np.ndarray, energy: float = 0.9) -> tuple[list[list[float]], list[int]]:
    """Mean squared principal-angle cosines between the row spaces of the M_r (see module doc)."""
    bases = []
    for M in maps:
        _, s, vt = np.linalg.svd(M, full_matrices=False)
        cum = np.cumsum(s**2) / max(float((s**2).sum()), 1e-300)
        q = int(np.searchsorted(cum, energy) + 1)
        bases.append(vt[:q].T)
    R = len(bases)
    ov = [[float(np.linalg.norm(bases[a].T @ bases[b]) ** 2 / min(bases[a].shape[1], bases[b].shape[1]))
           for b in range(R)] for a in range(R)]
    return ov, [b.shape[1] for b in bases]


@dataclass
class SuperpositionResult:
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
    perm = np.random.default_rng(derive_seed(seed, "probes.subject_split")).permutation(n)
    k = min(n - 1, max(1, int(round(heldout_fraction * n))))
    return np.sort(perm[k:]), np.sort(perm[:k])
