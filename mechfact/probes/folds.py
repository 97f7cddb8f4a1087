"""Seeded splits of subjects: one held-out part (:func:`split_indices`), k folds (:func:`group_folds`), and
the (train, test) pairs built from them (:func:`subject_splits`, :func:`kfold`). Every fact of a subject lies
on one side of a split."""

from __future__ import annotations

import numpy as np

from ..config import check_float
from ..seeding import derive_seed

DEALS = ("round-robin", "blocks")


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


def group_folds(groups, k: int, seed: int = 0, strata=None, tag: str = "readout.folds", *,
                deal: str = "round-robin", rep: int | None = None) -> np.ndarray:
    """The fold (0..k-1) of every item; all items of one group (subject) share a fold.

    The groups are taken in a seeded random order (seed ``derive_seed(seed, tag[, rep])``) and dealt to the
    folds: ``round-robin`` from a random first fold, or in ``blocks`` (the first ``n // k`` or ``n // k + 1``
    groups to fold 0, and so on; :func:`kfold`). Fold sizes differ by at most one group. ``strata`` (one label
    per item, e.g. the object; a group takes its first item's; round-robin only): the groups are ordered by
    stratum (strata in random order) before the deal, so each stratum is spread evenly over the folds. A
    stratum of one group lands in a random fold like any other group: no stratum is forced into a fold.
    """
    if deal not in DEALS:
        raise ValueError(f"deal={deal!r}: allowed {', '.join(DEALS)}")
    g = np.asarray(groups)
    if g.ndim != 1 or len(g) == 0:
        raise ValueError(f"groups has shape {g.shape}: expected one label per item")
    uniq, first, inv = np.unique(g, return_index=True, return_inverse=True)
    if not 2 <= k <= len(uniq):
        raise ValueError(f"{len(uniq)} groups (subjects) cannot fill {k} folds (need 2 <= folds <= groups)")
    rng = np.random.default_rng(derive_seed(seed, tag) if rep is None else derive_seed(seed, tag, rep))
    order = rng.permutation(len(uniq))
    fold_of_group = np.empty(len(uniq), dtype=np.int64)
    if deal == "blocks":
        if strata is not None:
            raise ValueError("strata: only a round-robin deal is stratified")
        sizes = [len(part) for part in np.array_split(np.arange(len(uniq)), k)]
        fold_of_group[order] = np.repeat(np.arange(k), sizes)
        return fold_of_group[inv.ravel()]
    if strata is not None:
        s = np.asarray(strata)
        if s.shape != g.shape:
            raise ValueError(f"strata has shape {s.shape}: expected {g.shape}, one label per item")
        _, code = np.unique(s[first], return_inverse=True)
        rank = rng.permutation(int(code.max()) + 1)[code]
        order = order[np.argsort(rank[order], kind="stable")]
    fold_of_group[order] = (np.arange(len(uniq)) + int(rng.integers(k))) % k
    return fold_of_group[inv.ravel()]


def _pairs(fold: np.ndarray, folds) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(np.flatnonzero(fold != f), np.flatnonzero(fold == f)) for f in folds]


def outer_fold_count(heldout_fraction: float) -> int:
    """Folds of the subjects whose one part is the held-out share: ``round(1 / heldout_fraction)``, at least 2."""
    check_float("heldout", heldout_fraction, lo=0, hi=1, lo_open=True, hi_open=True)
    return max(2, int(round(1.0 / heldout_fraction)))


def subject_splits(groups, heldout_fraction: float = 0.25, n_splits: int | None = None, seed: int = 0,
                   strata=None) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) index splits by group (subject): every fact of a subject lies on one side.

    The groups are dealt into ``K = round(1 / heldout_fraction)`` folds (:func:`group_folds`, optionally
    stratified); split ``i`` holds out fold ``i``. The held-out parts are disjoint, so pooled over the splits
    every scored item is scored once; ``n_splits`` (default ``K``, at most ``K``) of them are used.
    """
    k = outer_fold_count(heldout_fraction)
    n_splits = k if n_splits is None else int(n_splits)
    if not 1 <= n_splits <= k:
        raise ValueError(f"--splits {n_splits}: the held-out parts are disjoint folds, between 1 and {k} with "
                         f"--heldout {heldout_fraction:g}")
    return _pairs(group_folds(groups, k, seed, strata, "readout.outer"), range(n_splits))


def kfold(n: int, folds: int = 5, repeats: int = 1, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) index pairs of ``repeats`` seeded k-fold partitions of ``range(n)`` (one subject per
    item, dealt in blocks: :func:`group_folds`); every subject is held out once per repeat."""
    if not 2 <= folds <= n:
        raise ValueError(f"folds={folds}: need 2 <= folds <= {n} subjects")
    items = np.arange(n)
    return [pair for rep in range(repeats) for pair in
            _pairs(group_folds(items, folds, seed, tag="probes.superposition.kfold", deal="blocks", rep=rep),
                   range(folds))]


__all__ = ["split_indices", "group_folds", "outer_fold_count", "subject_splits", "kfold"]
