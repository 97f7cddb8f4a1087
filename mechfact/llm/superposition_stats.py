"""Every number of one layer of the superposition test on a pretrained language model
(:mod:`mechfact.llm.superposition`): the codes' kernels of every null draw and the folds, set up once per run
(:func:`_setup`), then per layer and fold the ridge fit in its kernel form, the partial R^2 beyond the nuisance
regressors, the fit in the attribute subspace, the decodability readouts, and their intervals, p-values and
controls (:func:`_layer_row`). The fit, its nulls, the partial R^2 and the decodability table share one set of
per-fold kernel matrices, computed once per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import stats
from ..probes import superposition as core
from ..seeding import derive_seed
from .superposition_data import LlmSuperpositionConfig

MASSIVE_SHARE = 0.5  # one coordinate with more than this share of the states' variance: "massive", a warning
DROP_SHARE = 0.1  # drop_massive removes coordinates with more than this share of the training variance
PER_RELATION = 8  # readout directions per relation in the attribute subspace (at most)
ENERGY = 0.9  # ... enough of them for this share of the readout map's energy
ROW_FORMAT = 6  # rows without this "format" (earlier versions) are recomputed on resume


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
    layer0: list  # per fold: FoldKernels of the ridge on the whole layer-0 state (+ token count): the training
    # subjects' inner folds (out-of-fold residuals), and training -> held-out
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
           cfg: LlmSuperpositionConfig, seed: int, one_to_one: list[bool] | None = None) -> _Setup:
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
    layer0 = []  # the whole layer-0 state, centred on the training subjects, and the token count unpenalised
    for k, (tr, te) in enumerate(folds):
        Xc = X0 - X0[tr].mean(0)
        K0x = Xc @ Xc.T
        # the training subjects' residuals out of fold (an inner k-fold), as the held-out ones are: an in-sample
        # fit's residuals are shrunk by the fit, and the attributes would be fitted to residuals of another kind
        inner = core.kfold(len(tr), cfg.k_folds, 1, derive_seed(seed, "llm.superposition.layer0_inner", k))
        layer0.append(([core.fold_kernels(K0x, tr[a], tr[b], tokens[:, None]) for a, b in inner],
                       core.fold_kernels(K0x, tr, te, tokens[:, None])))
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
    return _Setup(names, V, P, G_all, folds, fk, fk_nuis, layout, pi, (gi, sub), nuis, layer0, codes,
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


def _fold_states(X: np.ndarray, tr: np.ndarray, cfg: LlmSuperpositionConfig) -> tuple[np.ndarray, np.ndarray, list]:
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


MIN_GROUP = 5  # subjects each side of the known / unknown contrast, at least
N_PERM = 5000


def known_contrast(res: np.ndarray, sst: np.ndarray, known: np.ndarray | None, seed: int,
                   null_res: np.ndarray | None = None, recalled: np.ndarray | None = None) -> dict | None:
    """What the attributes explain of the held-out states of the subjects the model knows against those it does
    not: each group's pooled R^2 (``1 - sum res / sum sst`` over its subjects, bootstrapped over them; with
    ``null_res`` (B, n) the shuffled-attribute draws, each group's p against them), the difference known minus
    unknown and its p from relabelling the subjects (two-sided, ``N_PERM`` draws). The fits are the same for
    both groups (every subject is held out once); only the scoring is split. ``recalled`` (n,): how many of its
    relations the model recalls per subject; with it, ``recall_spearman``: Spearman's rho over every subject of
    that count against the share of the subject's held-out state the fit explains (``1 - res / sst``), a graded
    test that needs no group size. None without ``known``; no group numbers when a group has fewer than
    ``MIN_GROUP`` subjects."""
    if known is None:
        return None
    k = np.asarray(known, dtype=bool)
    out = {"n_known": int(k.sum()), "n_unknown": int((~k).sum()), "min_group": MIN_GROUP}
    if recalled is not None and np.ptp(np.asarray(recalled, float)) == 0:
        out["recall_spearman"] = {"rho": None, "p_value": None,
                                  "note": "every subject recalls as many relations: nothing to rank"}
    elif recalled is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(sst > 0, 1 - res / np.where(sst > 0, sst, 1), 0.0)
        out["recall_spearman"] = stats.spearman(np.asarray(recalled, float), share, seed=seed)
    if k.sum() < MIN_GROUP or (~k).sum() < MIN_GROUP:
        return out
    for name, g in (("known", k), ("unknown", ~k)):
        out.update(stats.fields(f"r2_{name}", _ratio_ci(res[g], sst[g], seed)))
        if null_res is not None:
            out[f"null_{name}"] = stats.null_summary(out[f"r2_{name}"], 1 - null_res[:, g].sum(1) / sst[g].sum())
    diff = out["r2_known"] - out["r2_unknown"]
    rng = np.random.default_rng(seed)
    perm = np.stack([rng.permutation(k) for _ in range(N_PERM)])
    tot = lambda m, v: (v[None] * m).sum(1)  # noqa: E731
    null = (1 - tot(perm, res) / tot(perm, sst)) - (1 - tot(~perm, res) / tot(~perm, sst))
    out.update(diff=float(diff), p_value=stats.permutation_pvalue(abs(diff), np.abs(null)), n_perm=N_PERM)
    return out


def _layer_row(X: np.ndarray, S: _Setup, cfg: LlmSuperpositionConfig, seed: int, known: np.ndarray | None = None,
               recalled: np.ndarray | None = None) -> dict:
    """Every number of one layer (states ``X`` (n, d)); see :mod:`mechfact.llm.superposition`. ``known`` (n,):
    the subjects the model recalls and ``recalled`` how many relations each, for :func:`known_contrast`."""
    n, R, B = X.shape[0], len(S.names), cfg.n_null
    L = S.layout
    res = np.zeros((L[f"drop_null.{R - 1}"].stop, n))
    sst = np.zeros(n)
    part_res, part_nuis = np.zeros((1 + B, n)), np.zeros(n)
    l0_res, l0_sst, l0_only = np.zeros((1 + B, n)), np.zeros(n), np.zeros(n)
    observed_and_shuffled = np.r_[0, np.arange(L["shuffled"].start, L["shuffled"].stop)]
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
        # beyond the whole layer-0 state: the states ridge-residualised on it (alpha by GCV on the training
        # subjects), then the attributes' fit to what is left, against the shuffled draws
        inner, a_te = S.layer0[k]
        left = F.copy()
        for fi in inner:
            left[fi.te] -= core.fit_fold(fi, F, predict=True)["pred"][0]
        left[te] -= core.fit_fold(a_te, F, predict=True)["pred"][0]
        l0_only[te] += (left[te] ** 2).sum(1)
        b = core.fit_fold(fk.select(observed_and_shuffled), left)
        l0_res[:, te] += b["res"]
        l0_sst[te] += b["sst"][0]
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
    # beyond the whole layer-0 state (ridge-residualised) and the token count
    lz = _ratio_ci(l0_res[0], l0_sst, seed)
    row.update(stats.fields("r2_heldout_beyond_layer0", lz))
    row["null_beyond_layer0"] = stats.null_summary(lz.value, 1 - l0_res[1:].sum(1) / l0_sst.sum())
    row.update(stats.fields("r2_heldout_layer0_only", _ratio_ci(l0_only, sst, seed)))
    # known against unknown subjects: the full fit, and beyond the layer-0 state
    row["known_contrast"] = known_contrast(res[0], sst, known, seed, res[L["shuffled"]], recalled)
    row["known_contrast_beyond_layer0"] = known_contrast(l0_res[0], l0_sst, known, seed, l0_res[1:], recalled)
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
                               "r2_heldout_beyond_layer0", "r2_heldout_layer0_only",
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
