"""The geometric-recall paper's claim on a pretrained model: is a subject's hidden state a superposition of
the vectors of its attributes under several relations?

(One module of ~680 lines on purpose: the fit, its five null distributions, the partial R^2 and the
decodability table share one set of per-fold kernel matrices, computed once per layer; split apart they would
recompute or pass them around.)

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
* ``r2_heldout_attribute_subspace``: the same fit on the state projected onto the attribute-relevant subspace
  (the span of the per-relation readout directions fitted on the training subjects: the top singular vectors of
  each ridge map h -> a_r, 90% of its energy, at most 8 per relation). The subspace is refitted under every
  null draw (with the shuffled or random attributes), so its null is matched;
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

import numpy as np
import torch

from .. import hooks
from .. import stats
from ..config import DictConfig, check_choice, check_float, check_int, check_int_list
from ..probes import superposition as core
from ..probes.queries import ProbeSet, Site, collect
from ..runs import RunDir
from ..seeding import derive_seed
from .loading import DTYPES, LanguageModel, load_model
from .prompts import build_prompts, object_token_ids
from .relations import Relation, as_relations, shipped_relations_dir

logger = logging.getLogger(__name__)

ATTRIBUTES = ("unembed", "class")
PROMPTS = {"bare": "{}", "words": "Some facts about {}"}  # named prompts: the subject alone, or after words
MASSIVE_SHARE = 0.5  # one coordinate with more than this share of the states' variance: "massive", a warning
DROP_SHARE = 0.1  # drop_massive removes coordinates with more than this share of the training variance
PER_RELATION = 8  # readout directions per relation in the attribute subspace (at most)
ENERGY = 0.9  # ... enough of them for this share of the readout map's energy
ROW_FORMAT = 2  # rows without this "format" (earlier versions) are recomputed on resume


def countries_dir():
    """The shipped multi-relation dataset: 73 countries under five relations."""
    return shipped_relations_dir().parent / "countries"


@dataclass
class SuperpositionConfig(DictConfig):
    model: str = "default"  # hub name, local HF folder, .gguf, short name (mechfact.llm.registry)
    relations: str | None = None  # a folder of relations sharing subjects; None = mechfact/data/countries
    relation_names: list[str] | None = None
    layers: list[int] | None = None  # None = every layer
    prompt: str = "{}"  # relation-neutral prompt with one {} for the subject, or a name in PROMPTS
    attributes: str = "unembed"  # unembed | class
    heldout_fraction: float = 0.2  # sets the folds when folds is None: round(1 / heldout_fraction)
    n_splits: int = 1  # repeats of the k-fold partition (each subject held out once per repeat)
    min_relations: int = 4  # subjects must carry at least this many of the relations (all are used)
    dtype: str = "float32"
    batch_size: int = 16
    cache_states: bool = True
    standardize: bool = False  # z-score every coordinate with the training subjects' mean and std (per fold)
    folds: int | None = None  # k of the k-fold over subjects (None: from heldout_fraction, 5 for 0.2)
    n_null: int = 200  # draws of each null (shuffled, random features, per-relation, decodability)
    nuisance_pcs: int = 3  # principal components of the layer-0 state among the nuisance regressors
    drop_massive: bool = False  # remove coordinates holding > DROP_SHARE of the training subjects' variance

    def __post_init__(self) -> None:
        for name in ("standardize", "drop_massive", "cache_states"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} {getattr(self, name)!r}: must be true or false")
        if isinstance(self.prompt, str) and self.prompt in PROMPTS:
            self.prompt = PROMPTS[self.prompt]
        if not isinstance(self.prompt, str) or self.prompt.count("{}") != 1:
            raise ValueError(f"--prompt {self.prompt!r}: must contain exactly one '{{}}' (the subject), or be one of "
                             f"{', '.join(PROMPTS)}")
        check_choice("attributes", self.attributes, ATTRIBUTES)
        check_float("heldout", self.heldout_fraction, lo=0, hi=1, lo_open=True, hi_open=True)
        check_int("splits", self.n_splits, 1)
        if self.folds is not None:
            check_int("folds", self.folds, 2)
        if isinstance(self.n_null, bool) or not isinstance(self.n_null, int) or self.n_null < 19:
            raise ValueError(f"--n-null {self.n_null}: must be an integer >= 19 (with fewer draws no p-value can be "
                             "below 0.05)")
        check_int("nuisance_pcs", self.nuisance_pcs, 0)
        check_int("min_relations", self.min_relations, 2)
        check_choice("dtype", self.dtype, DTYPES)
        check_int("batch_size", self.batch_size, 1)
        if self.layers is not None:
            check_int_list("layers", self.layers, 0, "give at least one layer, or all")

    @property
    def k_folds(self) -> int:
        return self.folds if self.folds is not None else max(2, int(round(1 / self.heldout_fraction)))


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


def _objects(rel: Relation, subjects: list[str]) -> list[str]:
    obj = dict(zip(rel.subjects, rel.objects))
    return [obj[s] for s in subjects]


def shared_first_token(lm: LanguageModel, rels: list[Relation], subjects: list[str]) -> dict[str, list[list[str]]]:
    """Per relation, the groups of its objects that share a first token (their unembedding rows coincide)."""
    out = {}
    for rel in rels:
        groups: dict[int, list[str]] = {}
        for o in dict.fromkeys(_objects(rel, subjects)):
            groups.setdefault(object_token_ids(lm.tokenizer, o)[0], []).append(o)
        out[rel.name] = [sorted(g) for g in groups.values() if len(g) > 1]
    return out


def attribute_table(lm: LanguageModel, rels: list[Relation], subjects: list[str], kind: str
                    ) -> tuple[np.ndarray, np.ndarray, list[list[str]]]:
    """(V (n_codes, k), perms (R, n_subjects) row indices into V, code names per relation).

    ``unembed``: one code per distinct first token of the relation's objects; objects sharing a first token share
    the code (its name joins theirs with " / "). ``class``: one one-hot code per object."""
    rows, perms, names = [], [], []
    W_U = lm.W_U.detach().float().cpu() if kind == "unembed" else None
    for rel in rels:
        objs = _objects(rel, subjects)
        key = {o: (object_token_ids(lm.tokenizer, o)[0] if kind == "unembed" else o) for o in dict.fromkeys(objs)}
        codes = list(dict.fromkeys(key.values()))
        index = {c: len(rows) + i for i, c in enumerate(codes)}
        if kind == "unembed":
            rows += [W_U[:, c].double().numpy() for c in codes]
        else:
            rows += [None] * len(codes)
        perms.append([index[key[o]] for o in objs])
        names.append([" / ".join(sorted(o for o in key if key[o] == c)) for c in codes])
    V = np.eye(len(rows)) if kind == "class" else np.stack(rows)
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


def subject_token_counts(lm: LanguageModel, subjects: list[str], cfg: SuperpositionConfig) -> np.ndarray:
    """(n_subjects,) tokens of each subject in the prompt."""
    probe = Relation("subjects", [cfg.prompt], [(s, "-") for s in subjects])
    return np.array([p.subject_last - p.subject_first + 1
                     for p in build_prompts(probe, lm.tokenizer, lm.bos_id, k=0)], dtype=np.float64)


def scaled(X: np.ndarray, tr: np.ndarray, standardize: bool) -> np.ndarray:
    """``X`` itself, or every coordinate z-scored with the training subjects' mean and standard deviation (a
    coordinate constant on them is only centred). Pooled R^2 weighs coordinates by their variance, so a few
    large-norm coordinates can decide it; standardised, every coordinate counts the same."""
    if not standardize:
        return X
    sd = X[tr].std(0)
    return (X - X[tr].mean(0)) / np.where(sd > 1e-12 * max(float(sd.max()), 1e-300), sd, 1.0)


def massive_coordinates(X: np.ndarray, tr: np.ndarray, share: float = DROP_SHARE) -> np.ndarray:
    """Coordinates holding more than ``share`` of the training subjects' total variance."""
    var = X[tr].var(0)
    return np.flatnonzero(var > share * max(float(var.sum()), 1e-300))


# ---- the pieces of one layer ---------------------------------------------------------------------------------

@dataclass
class _Setup:
    """Everything that does not depend on the layer: codes, kernels of every draw, folds (eigendecomposed)."""

    names: list[str]
    V: np.ndarray
    P: np.ndarray
    G_all: np.ndarray  # (1 + n_null, c, c): the codes' Gram, then each random-features draw's
    folds: list
    fk: list  # FoldKernels of the main stack, per fold
    fk_nuis: list  # FoldKernels of [observed, shuffled draws] with the nuisance regressors, per fold
    layout: dict  # name -> slice into the main stack
    pi: np.ndarray  # (n_null, n) subject permutations of the shuffled null
    sub_draws: tuple  # subspace draws [observed, shuffled..., random...]: Gram index, per relation and fold codes
    nuisance: list  # (n, c) nuisance regressors per fold
    codes: list  # per relation: (code 0..c-1 per subject, its rows of V, one-to-one?, Gram factor per Gram)
    n_features: int


def _nuisance(X0: np.ndarray, tokens: np.ndarray, tr: np.ndarray, pcs: int) -> np.ndarray:
    """(n, c): the subject's token count and the first ``pcs`` principal components of its layer-0 state (fitted
    on the training subjects)."""
    cols = [tokens[:, None]]
    if pcs:
        mu = X0[tr].mean(0)
        _, _, vt = np.linalg.svd(X0[tr] - mu, full_matrices=False)
        cols.append((X0 - mu) @ vt[:pcs].T)
    return np.concatenate(cols, 1)


def _setup(V: np.ndarray, P: np.ndarray, names: list[str], X0: np.ndarray, tokens: np.ndarray,
           cfg: SuperpositionConfig, seed: int, one_to_one: list[bool] | None = None) -> _Setup:
    """``one_to_one``: per relation, whether every subject has its own object (default: its own code)."""
    n, R, B = P.shape[1], P.shape[0], cfg.n_null
    G = V @ V.T
    Gr = core.random_code_grams(V.shape[0], V.shape[1], B, float(np.sqrt((V ** 2).mean())), seed,
                                tag="llm.superposition.random_features")
    G_all = np.concatenate([G[None], Gr])
    pi = core.shuffled_perms(n, B, seed, tag="llm.superposition.shuffled")
    K0 = core.code_kernel(G, P)
    alone = np.stack([G[np.ix_(P[r], P[r])] for r in range(R)])
    stack = [K0[None], alone, K0[None] - alone, K0[pi[:, :, None], pi[:, None, :]], core.code_kernel(Gr, P)]
    # relation r alone shuffled, the others in place: the null of its drop-one Delta R^2
    pr = np.stack([core.shuffled_perms(n, B, seed, tag=f"llm.superposition.drop.{r}") for r in range(R)])
    stack += [K0[None] - alone[r][None] + alone[r][pr[r][:, :, None], pr[r][:, None, :]] for r in range(R)]
    sizes = [1, R, R, B, B] + [B] * R
    keys = ["observed", "alone", "drop", "shuffled", "random"] + [f"drop_null.{r}" for r in range(R)]
    starts = np.cumsum([0] + sizes)
    layout = {k: slice(int(a), int(b)) for k, a, b in zip(keys, starts[:-1], starts[1:])}
    K = np.concatenate(stack)
    folds = core.kfold(n, cfg.k_folds, cfg.n_splits, seed)
    nuis = [_nuisance(X0, tokens, tr, cfg.nuisance_pcs) for tr, _ in folds]
    Kn = np.concatenate([K0[None], K[layout["shuffled"]]])
    fk = [core.fold_kernels(K, tr, te) for tr, te in folds]
    fk_nuis = [core.fold_kernels(Kn, tr, te, N) for (tr, te), N in zip(folds, nuis)]
    # the subspace draws: observed, shuffled, random features; per relation its codes' Gram factor per Gram
    gi = np.r_[0, np.zeros(B, dtype=int), 1 + np.arange(B)]
    subj = np.concatenate([np.arange(n)[None], pi, np.tile(np.arange(n), (B, 1))])  # whose attributes each gets
    codes, sub = [], []
    for r in range(R):
        uniq = np.unique(P[r])
        Gr_ = G_all[:, uniq[:, None], uniq[None, :]]
        ev, U = core._eigh(Gr_)
        fac = U * np.sqrt(np.maximum(ev, 0))[:, None, :]  # (1 + B, c_r, c_r): fac fac^T = the codes' Gram
        local = np.searchsorted(uniq, P[r])
        codes.append((local, uniq, bool(len(uniq) == n if one_to_one is None else one_to_one[r]), fac))
        sub.append([local[subj[:, tr]] for tr, _ in folds])  # per fold (1 + 2B, m) codes of the training subjects
    return _Setup(names, V, P, G_all, folds, fk, fk_nuis, layout, pi, (gi, sub), nuis, codes,
                  R * int(np.linalg.matrix_rank(V)))


def _readout_subspace(F: np.ndarray, tr: np.ndarray, rel_codes: list[tuple[np.ndarray, np.ndarray]],
                      alphas: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Coordinates (B, n, q) of the states ``F`` (n, p) in the attribute-relevant subspace of each draw, and its
    dimension (B,). ``rel_codes``: per relation, the draw's code (B, m) of every training subject (0..c-1) and a
    factor (B, c, c) of the draw's Gram of those codes. The subspace: per relation, the top singular vectors
    (ENERGY of the energy, at most PER_RELATION) of the ridge map state -> code (alpha by GCV) fitted on the
    training subjects; their span, all relations."""
    m = len(tr)
    Ftc = F[tr] - F[tr].mean(0)
    mu, Ux = np.linalg.eigh(Ftc @ Ftc.T)
    keep = mu > 1e-10 * max(float(mu.max()), 1e-300)
    mu, Ux = mu[keep], Ux[:, keep]
    r = len(mu)
    alphas = np.asarray(core.GCV_ALPHAS if alphas is None else alphas)
    Z = ((F - F[tr].mean(0)) @ Ftc.T) @ (Ux / np.sqrt(mu))  # (n, r): coordinates in the training states' span
    s = mu[None] / (mu[None] + alphas[:, None] * mu.mean())  # (A, r)
    df = 1 + s.sum(1)
    dirs = []
    for local, fac in rel_codes:
        onehot = np.eye(fac.shape[1])[local]  # (B, m, c)
        LC = (Ux.T @ onehot) @ fac  # (B, r, c): T = Ux^T K Ux = LC LC^T, K the codes' kernel over training subjects
        cnt = onehot.sum(1)  # (B, c)
        trK = (cnt * (fac ** 2).sum(-1)).sum(1) - ((cnt[:, None, :] @ fac)[:, 0] ** 2).sum(1) / m
        rss = trK[:, None] - ((2 * s - s ** 2)[None] * (LC ** 2).sum(-1)[:, None, :]).sum(-1)
        gcv = np.where(df < m, rss / m / np.maximum(1 - df / m, 1e-12) ** 2, np.inf)
        alpha = alphas[np.argmin(gcv, 1)] * mu.mean()
        A = (np.sqrt(mu)[None] / (mu[None] + alpha[:, None]))[:, :, None] * LC  # the map's factor: A A^T
        if A.shape[2] < r:  # few codes: the small side
            ev, W = core._eigh(np.swapaxes(A, 1, 2) @ A)
            ev, W = np.maximum(ev[:, ::-1], 0), W[:, :, ::-1][:, :, :PER_RELATION]
            E = (A @ W) / np.sqrt(np.where(ev[:, :W.shape[2]] > 0, ev[:, :W.shape[2]], 1.0))[:, None, :]
        else:
            ev, E = core._eigh(A @ np.swapaxes(A, 1, 2))
            ev, E = np.maximum(ev[:, ::-1], 0), E[:, :, ::-1][:, :, :PER_RELATION]
        tot = ev.sum(1, keepdims=True)
        cum = np.cumsum(ev, 1) / np.where(tot > 0, tot, 1.0)
        q = np.where(tot[:, 0] > 0, np.minimum(PER_RELATION, (cum < ENERGY).sum(1) + 1), 0)
        q = np.minimum(q, (ev > 1e-12 * np.maximum(ev[:, :1], 1e-300)).sum(1))
        dirs.append((E, np.arange(E.shape[2])[None] < q[:, None]))
    D = np.concatenate([E for E, _ in dirs], 2)  # (B, r, <= R * PER_RELATION)
    used = np.concatenate([u for _, u in dirs], 1)  # (B, columns)
    if D.shape[2] <= r:  # used columns first, then an orthonormal basis of their span by QR
        order = np.argsort(~used, axis=1, kind="stable")
        Qb, Rb = np.linalg.qr(np.take_along_axis(D, order[:, None, :], 2))
        keep = np.take_along_axis(used, order, 1) & (np.abs(np.diagonal(Rb, axis1=1, axis2=2)) > 1e-8)
    else:
        Qb, sv, _ = np.linalg.svd(D * used[:, None, :], full_matrices=False)
        keep = sv > 1e-8 * np.maximum(sv[:, :1], 1e-300)
    return Z @ (Qb * keep[:, None, :]), keep.sum(1)


def _fold_states(X: np.ndarray, tr: np.ndarray, cfg: SuperpositionConfig) -> tuple[np.ndarray, np.ndarray, list]:
    """The factors (n, <= n) of the states the fit sees and of the z-scored states the readouts see; the dropped
    coordinates."""
    dropped = massive_coordinates(X, tr) if cfg.drop_massive else np.array([], dtype=int)
    Xk = np.delete(X, dropped, axis=1) if len(dropped) else X
    mu = Xk[tr].mean(0)
    z = scaled(Xk, tr, True)
    fit = z if cfg.standardize else Xk - mu
    return core.factor(fit), core.factor(z), dropped.tolist()


def _decode(fk: core.FoldKernels, S: _Setup, r: int, perms: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Held-out correctness (1 + n_null, t) of the readout of relation r, for the true labels and each shuffled
    relabelling; and the fold's chance hits (majority training label, or 1 / #codes)."""
    idx, uniq, one_to_one, fac = S.codes[r]
    lab = np.concatenate([idx[None], idx[perms]])  # (B, n)
    tr, te = fk.tr, fk.te
    if one_to_one:  # nearest code (cosine) among all of the relation's codes
        C = fac[0]  # rows: the codes, with their Gram
        T = C[lab]  # (B, n, c)
        pred = core.fit_fold(fk, T, predict=True)["pred"]
        cn = C / np.maximum(np.linalg.norm(C, axis=1, keepdims=True), 1e-12)
        score = pred @ cn.T / np.maximum(np.linalg.norm(pred, axis=2, keepdims=True), 1e-12)
        chance = len(te) / len(uniq)
    else:  # one-hot classes; classes absent from the training subjects cannot be predicted
        T = np.eye(len(uniq))[lab]
        pred = core.fit_fold(fk, T, predict=True)["pred"]
        present = T[:, tr].sum(1) > 0  # (B, C)
        score = np.where(present[:, None, :], pred, -np.inf)
        counts = np.bincount(idx[tr], minlength=len(uniq))
        chance = float((idx[te] == counts.argmax()).sum())
    return score.argmax(2) == lab[:, te], chance


def _q(null: np.ndarray) -> list[float]:
    lo, hi = np.quantile(null, [0.025, 0.975])
    return [float(lo), float(hi)]


def _ratio_ci(num: np.ndarray, den: np.ndarray, seed: int, minus: np.ndarray | None = None) -> stats.Estimate:
    """``1 - sum num / sum den`` (or ``(sum minus - sum num) / sum den``) over subjects, bootstrapped over them."""
    cols = [num, den] + ([] if minus is None else [minus])
    if minus is None:
        stat = lambda a: 1 - a[:, 0].sum() / a[:, 1].sum()  # noqa: E731
    else:
        stat = lambda a: (a[:, 2].sum() - a[:, 0].sum()) / a[:, 1].sum()  # noqa: E731
    return stats.bootstrap(np.stack(cols, 1), stat, seed=seed)


def _layer_row(X: np.ndarray, S: _Setup, cfg: SuperpositionConfig, seed: int) -> dict:
    """Every number of one layer (states ``X`` (n, d)); see the module docstring."""
    n, R, B = X.shape[0], len(S.names), cfg.n_null
    L = S.layout
    res = np.zeros((L[f"drop_null.{R - 1}"].stop, n))
    sst = np.zeros(n)
    part_res, part_nuis = np.zeros((1 + B, n)), np.zeros(n)
    sub_res, sub_sst = np.zeros((1 + 2 * B, n)), np.zeros((1 + 2 * B, n))
    correct = np.zeros((R, 1 + B, n))
    chance = np.zeros(R)
    fold_r2, r2_train, alpha, alpha_idx, dims, dropped = [], [], [], [], [], set()
    shares, overlaps = [], []
    sub_idx = np.r_[0, np.arange(L["shuffled"].start, L["shuffled"].stop), np.arange(L["random"].start,
                                                                                      L["random"].stop)]
    for k, ((tr, te), fk, fkn) in enumerate(zip(S.folds, S.fk, S.fk_nuis)):
        F, Fz, drop = _fold_states(X, tr, cfg)
        dropped.update(drop)
        f = core.fit_fold(fk, F)
        res[:, te] += f["res"]
        sst[te] += f["sst"][0]
        fold_r2.append(1 - f["res"][0].sum() / f["sst"][0].sum())
        r2_train.append(float(f["r2_train"][0]))
        alpha.append(float(f["alpha"][0]))
        alpha_idx.append(int(f["alpha_index"][0]))
        sh, ov = _structure(fk, F, S)
        shares.append(sh)
        overlaps.append(ov)
        g = core.fit_fold(fkn, F)
        part_res[:, te] += g["res"]
        part_nuis[te] += g["nuis"][0]
        # the attribute subspace, refitted under every draw
        gi, sub = S.sub_draws
        Zq, dim = _readout_subspace(F, tr, [(sub[r][k], S.codes[r][3][gi]) for r in range(R)])
        dims.append(float(dim[0]))
        h = core.fit_fold(fk.select(sub_idx), Zq)
        sub_res[:, te] += h["res"]
        sub_sst[:, te] += h["sst"]
        # decodability from the z-scored states
        fkd = core.fold_kernels(Fz @ Fz.T, tr, te)
        for r in range(R):
            ok, ch = _decode(fkd, S, r, S.pi)
            correct[r][:, te] += ok
            chance[r] += ch
    reps = cfg.n_splits
    row = {"format": ROW_FORMAT}
    var = X.var(0)
    share = float(var.max() / max(float(var.sum()), 1e-300))
    row.update({"top_coordinate": int(var.argmax()), "top_coordinate_variance_share": share,
                "massive_coordinate": share > MASSIVE_SHARE,
                "states": "standardised" if cfg.standardize else "raw",
                "dropped_coordinates": sorted(int(c) for c in dropped) if cfg.drop_massive else None})
    # the full fit and its nulls
    obs = _ratio_ci(res[0], sst, seed)
    row.update(stats.fields("r2_heldout", obs))
    null_s = 1 - res[L["shuffled"]].sum(1) / sst.sum()
    null_r = 1 - res[L["random"]].sum(1) / sst.sum()
    row["r2_heldout_range"] = [float(min(fold_r2)), float(max(fold_r2))]
    row["r2_heldout_folds"] = [float(v) for v in fold_r2]
    row.update(stats.fields("r2_train", stats.bootstrap(r2_train, seed=seed)))
    row["p_value"] = stats.permutation_pvalue(obs.value, null_s)
    row["null_shuffled"] = stats.null_summary(obs.value, null_s)
    row["null_random_features"] = stats.null_summary(obs.value, null_r)
    for key, null in (("control_shuffled_r2_heldout", null_s), ("control_random_features_r2_heldout", null_r)):
        row.update({key: float(null.mean()), f"{key}_ci": _q(null), f"{key}_n": int(null.size)})
    # alpha
    grid = core.GCV_ALPHAS
    edges = sorted({"low" if i == 0 else "high" for i in alpha_idx if i in (0, len(grid) - 1)})
    row.update({"alpha": float(np.exp(np.mean(np.log(alpha)))), "alpha_ci": [min(alpha), max(alpha)],
                "alpha_n": len(alpha), "alpha_per_fold": alpha,
                "alpha_relative_per_fold": [float(grid[i]) for i in alpha_idx],
                "alpha_grid_relative": [float(grid[0]), float(grid[-1])],
                "alpha_at_grid_edge": bool(edges), "alpha_edge": ",".join(edges) or None})
    # each relation alone, and dropped
    each, alone_v, drop_v = {}, {}, {}
    for r, name in enumerate(S.names):
        a = _ratio_ci(res[L["alone"].start + r], sst, seed)
        d = _ratio_ci(res[0], sst, seed, minus=res[L["drop"].start + r])
        dnull = (res[L["drop"].start + r].sum() - res[L[f"drop_null.{r}"]].sum(1)) / sst.sum()
        e = {**stats.fields("r2_heldout_alone", a), **stats.fields("delta_r2_drop_one", d),
             **{f"drop_one_{k}": v for k, v in stats.null_summary(d.value, dnull).items()}}
        stats.check_reported(e, ["r2_heldout_alone", "delta_r2_drop_one"])
        each[name] = e
        alone_v[name], drop_v[name] = a.value, d.value
    row["r2_heldout_each_relation_alone"] = alone_v
    row["delta_r2_drop_one"] = drop_v
    row["each_relation"] = each
    # beyond the nuisance regressors
    pr = _ratio_ci(part_res[0], part_nuis, seed)
    row.update(stats.fields("partial_r2_heldout", pr))
    row["null_partial"] = stats.null_summary(pr.value, 1 - part_res[1:].sum(1) / part_nuis.sum())
    row.update(stats.fields("r2_heldout_nuisance_only", _ratio_ci(part_nuis, sst, seed)))
    row["nuisance"] = {"token_count": True, "layer0_pcs": cfg.nuisance_pcs}
    # in the attribute subspace (refitted under every draw)
    so = _ratio_ci(sub_res[0], sub_sst[0], seed)
    row.update(stats.fields("r2_heldout_attribute_subspace", so))
    ns = 1 - sub_res[1:1 + B].sum(1) / sub_sst[1:1 + B].sum(1)
    nr = 1 - sub_res[1 + B:].sum(1) / sub_sst[1 + B:].sum(1)
    row["null_shuffled_attribute_subspace"] = stats.null_summary(so.value, ns)
    row["null_random_features_attribute_subspace"] = stats.null_summary(so.value, nr)
    for key, null in (("control_shuffled_r2_heldout_attribute_subspace", ns),
                      ("control_random_features_r2_heldout_attribute_subspace", nr)):
        row.update({key: float(null.mean()), f"{key}_ci": _q(null), f"{key}_n": int(null.size)})
    row["attribute_subspace_dim"] = float(np.mean(dims))
    # decodability
    dec = {}
    for r, name in enumerate(S.names):
        uniq, one_to_one = S.codes[r][1:3]
        acc = correct[r][0] / reps
        est = stats.wilson(int(correct[r][0].sum()), n) if reps == 1 else stats.bootstrap(acc, seed=seed)
        null = correct[r][1:].sum(1) / (n * reps)
        dec[name] = {"kind": "vector" if one_to_one else "classifier", **stats.fields("accuracy", est),
                     "control_accuracy": float(null.mean()), "control_accuracy_ci": _q(null),
                     "control_accuracy_n": int(null.size), "chance": float(chance[r] / (n * reps)),
                     **stats.null_summary(est.value, null), "n_codes": int(len(uniq))}
    row["decodability"] = dec
    row["variance_share"] = dict(zip(S.names, np.mean(shares, 0).tolist()))
    ov = np.mean(overlaps, 0)
    row["block_overlap_offdiag"] = (float(np.mean([ov[a][b] for a in range(R) for b in range(R) if a != b]))
                                    if R > 1 else None)
    row["block_overlap"] = ov.tolist()
    row["n_features"] = S.n_features
    stats.check_reported(row, ["r2_heldout", "r2_train", "control_shuffled_r2_heldout",
                               "control_random_features_r2_heldout", "partial_r2_heldout", "r2_heldout_nuisance_only",
                               "r2_heldout_attribute_subspace", "alpha"])
    return row


def _structure(fk: core.FoldKernels, F: np.ndarray, S: _Setup) -> tuple[list[float], list[list[float]]]:
    """Per relation, the variance share of its term over all subjects, and the maps' block overlap (observed fit
    of one fold)."""
    tr = fk.tr
    f0 = fk.select(slice(0, 1))
    out = core.fit_fold(f0, F)
    lam, U = f0.lam[0], f0.U[0]
    D = 1.0 / (lam + out["alpha"][0])
    c = fk.Q @ (U * D) @ U.T @ (fk.Q.T @ F[tr])  # (m, p) dual coefficients
    tot = float(((F - F.mean(0)) ** 2).sum())
    shares, maps = [], []
    for r in range(len(S.names)):
        Zr = S.V[S.P[r]]  # (n, k)
        term = (Zr @ Zr[tr].T) @ c
        shares.append(float(((term - term.mean(0)) ** 2).sum()) / tot if tot > 0 else float("nan"))
        maps.append(Zr[tr].T @ c)
    ov, _ = core.block_overlap(np.stack(maps))
    return shares, ov


def _one_blas_thread():
    """numpy's BLAS / LAPACK on one thread: every matrix here is small (n_subjects wide), and threaded LAPACK on
    small matrices is 4-50x slower, far more on loaded cores."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - sklearn depends on threadpoolctl
        from contextlib import nullcontext

        return nullcontext()
    return threadpool_limits(limits=1)


# ---- the run ----------------------------------------------------------------------------------------------------

@dataclass
class LlmSuperpositionResult:
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
    res = LlmSuperpositionResult(lm.name, names, subjects, cfg.attributes, prompt=cfg.prompt,
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
                                                    derive_seed(seed, "llm.superposition.bootstrap", layer))}
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
