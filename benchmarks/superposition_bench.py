"""The superposition test's null, vectorised against a per-draw loop: same draws, same folds, side by side.

    python benchmarks/superposition_bench.py [--n-null 200] [--threads 1] [--layers 1]

Data: the sizes of ``mechfact llm superposition`` on the shipped countries (73 subjects, five relations with
73 / 6 / 34 / 73 / 36 distinct objects, codes and states 576 wide), synthetic: each state is a weak planted
superposition of its attribute codes plus noise. The statistic: held-out R^2, 5-fold over subjects, of the
observed assignment and of ``--n-null`` shuffled ones (the subjects' attribute tuples permuted).

Three ways to get the same numbers, each timed in this process with ``--threads`` BLAS and torch threads:

* vectorised (``mechfact.probes.superposition.cv_r2``): every draw's kernel eigendecomposed once per fold,
  alpha by GCV over the grid, held-out residuals from small products;
* loop, sklearn: one ``sklearn.linear_model.Ridge`` per draw and fold on the explicit design (n x R k), at the
  alpha the vectorised fit chose for that draw and fold (sklearn has no GCV of this kind; the alpha grid is
  then the vectorised run's, a fixed value per fit);
* loop, numpy: per draw and fold, the dual ridge solved with ``numpy.linalg.solve`` for every alpha of the grid,
  GCV from the explicit hat matrix, the chosen alpha's held-out residuals: the whole procedure, draw by draw.

Printed: the time of each, the ratio of each loop to the vectorised run, and the largest difference of the
held-out R^2 (and how often the chosen alpha agrees).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

# distinct objects per relation, as in the countries (capital, continent, currency, demonym, language)
CODES = (73, 6, 34, 73, 36)


def data(n: int = 73, width: int = 576, seed: int = 0, signal: float = 0.3):
    """States (n, width), codes V (sum CODES, width), assignment P (R, n)."""
    rng = np.random.default_rng(seed)
    V = rng.standard_normal((sum(CODES), width)) / np.sqrt(width)
    off = np.cumsum((0,) + CODES)
    P = np.stack([off[r] + (np.arange(n) % c if c >= n else rng.integers(0, c, n)) for r, c in enumerate(CODES)])
    M = [rng.standard_normal((width, width)) / np.sqrt(width) for _ in CODES]
    X = signal * sum(V[P[r]] @ M[r] for r in range(len(CODES))) + rng.standard_normal((n, width)) / np.sqrt(width)
    return X, V, P


def _design(V, P, perm):
    from mechfact.probes.superposition import design

    return design(V, P[:, perm], np.arange(P.shape[1]))


def loop_sklearn(X, V, P, folds, perms, alpha):
    """alpha: (draws, folds) absolute strengths."""
    from sklearn.linear_model import Ridge

    r2 = []
    for b, perm in enumerate(perms):
        Z = _design(V, P, perm)
        res = tot = 0.0
        for f, (tr, te) in enumerate(folds):
            pred = Ridge(alpha=float(alpha[b, f])).fit(Z[tr], X[tr]).predict(Z[te])
            res += ((X[te] - pred) ** 2).sum()
            tot += ((X[te] - X[tr].mean(0)) ** 2).sum()
        r2.append(1 - res / tot)
    return np.array(r2)


def loop_numpy(X, V, P, folds, perms, alphas):
    """The whole procedure draw by draw: dual ridge per alpha by numpy.linalg.solve, GCV, held-out R^2."""
    r2, chosen = [], []
    for perm in perms:
        Z = _design(V, P, perm)
        res = tot = 0.0
        ch = []
        for tr, te in folds:
            m = len(tr)
            zm, xm = Z[tr].mean(0), X[tr].mean(0)
            Zc, Xc = Z[tr] - zm, X[tr] - xm
            Kc = Zc @ Zc.T
            scale = np.trace(Kc) / (m - 1)
            best = None
            for a in alphas * scale:
                H = np.linalg.solve(Kc + a * np.eye(m), Kc).T  # hat matrix of the centred part
                rss = ((Xc - H @ Xc) ** 2).sum()
                gcv = rss / m / (1 - (1 + np.trace(H)) / m) ** 2
                if best is None or gcv < best[0]:
                    best = (gcv, a)
            a = best[1]
            ch.append(a)
            pred = xm + (Z[te] - zm) @ Zc.T @ np.linalg.solve(Kc + a * np.eye(m), Xc)
            res += ((X[te] - pred) ** 2).sum()
            tot += ((X[te] - xm) ** 2).sum()
        r2.append(1 - res / tot)
        chosen.append(ch)
    return np.array(r2), np.array(chosen)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-null", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1, help="BLAS and torch threads (default 1)")
    ap.add_argument("--layers", type=int, default=1, help="layers timed (the loops redo everything per layer; "
                                                          "the vectorised run reuses the kernels' eigenvectors)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import torch
    from threadpoolctl import threadpool_limits

    from mechfact.probes import superposition as core

    torch.set_num_threads(a.threads)
    with threadpool_limits(limits=a.threads):
        X, V, P = data(seed=a.seed)
        n = X.shape[0]
        folds = core.kfold(n, 5, 1, a.seed)
        perms = np.concatenate([np.arange(n)[None], core.shuffled_perms(n, a.n_null, a.seed)])
        alphas = core.GCV_ALPHAS
        print(f"{n} subjects, {len(CODES)} relations, design {n} x {len(CODES) * V.shape[1]}, states {X.shape[1]} "
              f"wide; 1 observed + {a.n_null} shuffled draws, 5 folds, {len(alphas)} alphas; {a.threads} thread(s)")

        t0 = time.perf_counter()
        from mechfact.probes.superposition import code_kernel, cv_r2, factor, fit_fold, fold_kernels

        K0 = code_kernel(V @ V.T, P)
        K = K0[perms[:, :, None], perms[:, None, :]]
        fks = [fold_kernels(K, tr, te) for tr, te in folds]
        for _ in range(a.layers):
            F = factor(X - X.mean(0))
            res = np.zeros(len(perms))
            tot = 0.0
            alpha = []
            for fk in fks:
                f = fit_fold(fk, F, alphas)
                res += f["res"].sum(1)
                tot += f["sst"][0].sum()
                alpha.append(f["alpha"])
            vec = 1 - res / tot
        alpha = np.stack(alpha, 1)
        t_vec = time.perf_counter() - t0
        check = cv_r2(K, factor(X - X.mean(0)), folds, alphas=alphas)["r2"]
        assert np.allclose(check, vec)

        t0 = time.perf_counter()
        for _ in range(a.layers):
            sk = loop_sklearn(X, V, P, folds, perms, alpha)
        t_sk = time.perf_counter() - t0

        t0 = time.perf_counter()
        for _ in range(a.layers):
            npy, chosen = loop_numpy(X, V, P, folds, perms, alphas)
        t_np = time.perf_counter() - t0

    same_alpha = float(np.mean(np.isclose(chosen, alpha, rtol=1e-9)))
    print(f"{'method':<44}{'seconds':>10}{'x vectorised':>14}{'max |dR^2|':>14}")
    print(f"{'vectorised (kernel eigendecomposition, GCV)':<44}{t_vec:>10.2f}{1.0:>14.1f}{0.0:>14.1e}")
    print(f"{'loop: sklearn Ridge per draw and fold':<44}{t_sk:>10.2f}{t_sk / t_vec:>14.1f}"
          f"{np.abs(sk - vec).max():>14.1e}")
    print(f"{'loop: numpy solve per draw, fold and alpha':<44}{t_np:>10.2f}{t_np / t_vec:>14.1f}"
          f"{np.abs(npy - vec).max():>14.1e}")
    print(f"the numpy loop chose the vectorised run's alpha in {100 * same_alpha:.1f}% of (draw, fold)s; observed "
          f"R^2 {vec[0]:.4f}, shuffled null median {np.median(vec[1:]):.4f}, p = "
          f"{(1 + (vec[1:] >= vec[0]).sum()) / (1 + len(vec) - 1):.4f}")
    agree = np.abs(sk - vec).max() < 1e-8 and np.abs(npy - vec).max() < 1e-8 and same_alpha == 1.0
    print("numbers agree" if agree else "NUMBERS DISAGREE")
    if not agree:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
