"""The layer-wise readout reports a layer chosen without the test data, beside controls chosen the same way.

Plain synthetic features (no model): a relation's states are numpy arrays, one per "layer".
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mechfact import stats
from mechfact.llm import readout as P
from mechfact.llm.relations import Relation
from mechfact.probes import readout as R

SELECTED = ("readout_accuracy", "control_accuracy", "chance", "prior_baseline", "ceiling", "best_on_test_upper_bound",
            "control_best_on_test_upper_bound")


@pytest.fixture(autouse=True)
def _one_blas_thread():
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        yield


def _states(rel: Relation, layers: list[np.ndarray], known=None) -> P.RelationStates:
    n = len(rel)
    return P.RelationStates(relation=rel, prompts=[SimpleNamespace(subject=s) for s in rel.subjects],
                            states=torch.tensor(np.stack(layers), dtype=torch.float32),
                            layers=list(range(len(layers))), next_token=torch.zeros(n, dtype=torch.long),
                            object_first=list(range(n)), known=np.ones(n, bool) if known is None else known)


def _signal_layers(y: np.ndarray, strengths, d: int = 8, seed: int = 0) -> list[np.ndarray]:
    """One (n, d) array per strength: the object's class mean times the strength, plus unit noise."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(int(y.max()) + 1, d))
    return [s * means[y] + rng.normal(size=(len(y), d)) for s in strengths]


def _colours(n: int, k: int) -> Relation:
    return Relation("syn", ["{} is"], [(f"s{i}", f"o{i % k}") for i in range(n)])


# ---- (a) shuffled labels score at the baseline, with an interval that says so -------------------------------


def test_shuffled_labels_score_at_chance_with_a_wide_interval_and_real_ones_do_not():
    n, k = 48, 4
    rel = _colours(n, k)
    y = np.arange(n) % k
    layers = _signal_layers(y, [0.0, 0.2, 0.5, 1.0, 2.0, 1.0, 0.5, 0.0, 0.0, 0.0])
    cfg = P.ProbeConfig(n_splits=4)  # every fact scored once
    rows, real = P.relation_readout(_states(rel, layers), None, cfg, seed=0)
    perm = np.random.default_rng(1).permutation(n)
    _, shuf = P.relation_readout(_states(rel, [X[perm] for X in layers]), None, cfg, seed=0)
    for row in (real, shuf):
        stats.check_reported(row, SELECTED)
        assert row["selected_on"] == "validation" and row["readout_accuracy_n"] == n == row["n_test"]
    # the real relation: read out far above the majority rate and the control, at a layer with signal
    assert real["readout_accuracy_ci"][0] > max(real["chance_ci"][1], real["control_accuracy_ci"][1]), real
    assert real["selected_layer"] in (3, 4, 5), real
    # the shuffled one: its interval is wide and contains the majority rate and the prior baseline
    lo, hi = shuf["readout_accuracy_ci"]
    assert lo <= shuf["chance"] <= hi and lo <= shuf["prior_baseline"] <= hi, shuf
    assert hi - lo > 0.15 and shuf["readout_accuracy"] < 0.45, shuf
    assert shuf["best_on_test_upper_bound"] >= shuf["readout_accuracy"]


@pytest.mark.slow  # seconds of training: the slow tier keeps the fast one under 5 minutes
def test_selection_on_noise_stays_at_chance_where_the_best_on_test_layer_does_not():
    """Twenty layers of pure noise, five seeds: the validation-chosen layer scores at the prior baseline on
    average (and so does the control, chosen the same way), while the best layer on the test data scores
    well above it -- the number a test-set selection would report."""
    n, k, n_layers = 48, 4, 20
    y = np.arange(n) % k
    groups = np.arange(n)
    sel, ctrl, upper, prior = [], [], [], []
    for seed in range(5):
        rng = np.random.default_rng(100 + seed)
        layers = [rng.normal(size=(n, 6)) for _ in range(n_layers)]
        splits = R.subject_splits(groups, 0.25, seed=seed)
        out = R.nested_layer_readout(layers, y, groups, splits, seed=seed)["selected"]
        stats.check_reported(out, ["accuracy", "control_accuracy", "best_on_test_upper_bound"])
        assert out["accuracy_n"] == n
        sel.append(out["accuracy"])
        ctrl.append(out["control_accuracy"])
        upper.append(out["best_on_test_upper_bound"])
        prior.append(out["prior_baseline"])
    assert abs(np.mean(sel) - np.mean(prior)) < 0.07, (sel, prior)
    assert abs(np.mean(ctrl) - np.mean(prior)) < 0.07, (ctrl, prior)
    assert np.mean(upper) > np.mean(prior) + 0.07, (upper, prior)  # a test-set selection fails the first band


# ---- (b) the scored split never reaches the selector ---------------------------------------------------------


def test_the_selector_only_ever_sees_training_rows(monkeypatch):
    n, k = 40, 4
    rel = _colours(n, k)
    y = np.arange(n) % k
    layers = _signal_layers(y, [0.3, 1.0, 0.3])
    for X in layers:
        X[:, 0] = np.arange(n) + 1000.0  # a row's identity, readable from any features handed over
    splits_made, seen = [], []
    real_splits, real_select = R.subject_splits, R.select_layer

    def record_splits(*a, **kw):
        out = real_splits(*a, **kw)
        splits_made.extend(out)
        return out

    def record_select(layer_rows, objects, groups, **kw):
        ids = {int(round(v)) - 1000 for X in layer_rows for v in np.asarray(X)[:, 0]}
        seen.append((ids, set(np.asarray(groups).tolist())))
        return real_select(layer_rows, objects, groups, **kw)

    monkeypatch.setattr(P, "subject_splits", record_splits)
    monkeypatch.setattr(R, "select_layer", record_select)
    _, sel = P.relation_readout(_states(rel, layers), None, P.ProbeConfig(n_splits=3), seed=0)
    assert len(splits_made) == 3 and len(seen) == 2 * 3  # the readout and the control, per split
    for s, (tr, te) in enumerate(splits_made):
        for ids, subjects in seen[2 * s:2 * s + 2]:
            assert ids == set(tr.tolist()) and not ids & set(te.tolist())
            assert subjects == {rel.subjects[i] for i in tr}
    assert sel["n_test"] == sum(len(te) for _, te in splits_made)


def test_a_layer_perfect_on_the_test_subjects_only_is_not_selected():
    """Layer 0 carries the object weakly in the training subjects and strongly in the test subjects: the best
    layer on the test data. Layer 1 carries it moderately everywhere: the better layer on validation folds."""
    rng = np.random.default_rng(0)
    n, d = 120, 6
    y = np.arange(n) % 2
    groups = np.arange(n)
    te = np.arange(0, n, 4)
    tr = np.setdiff1d(np.arange(n), te)
    sign = 2.0 * y - 1
    leak = rng.normal(size=(n, d))
    leak[tr, 0] += 0.3 * sign[tr]
    leak[te, 0] += 6.0 * sign[te]
    steady = rng.normal(size=(n, d))
    steady[:, 0] += 1.5 * sign
    out = R.nested_layer_readout([leak, steady], y, groups, [(tr, te)], seed=0)
    per_layer, sel = out["per_layer"], out["selected"]
    assert per_layer[0]["accuracy"] >= 0.95 and per_layer[0]["accuracy"] > per_layer[1]["accuracy"]  # on test
    assert out["selected"]["best_on_test_layer"] == 0 and sel["best_on_test_upper_bound"] == per_layer[0]["accuracy"]
    assert sel["selected_layer"] == 1 and sel["accuracy"] == per_layer[1]["accuracy"]
    _, val = R.select_layer([leak[tr], steady[tr]], y[tr], groups[tr], seed=0)
    assert val[1] > val[0] + 0.15, val


# ---- (c) splits by subject, one-to-many relations too ---------------------------------------------------------


def _several_objects(kind: str, n_subj: int = 30) -> Relation:
    """Subjects with 1-3 objects each: unique objects (one-to-many) or objects shared across subjects."""
    obj = (lambda i, j: f"o{i}_{j}") if kind == "one_to_many" else (lambda i, j: f"o{(i + j) % 7}")
    return Relation("many", ["{} is"], [(f"s{i}", obj(i, j)) for i in range(n_subj) for j in range(1 + i % 3)])


@pytest.mark.parametrize("kind", ["one_to_many", "many_to_many"])
@pytest.mark.parametrize("split", ["random", "stratified"])
def test_a_subject_never_sits_in_both_train_and_test(kind, split, monkeypatch):
    rel = _several_objects(kind)
    assert rel.kind == kind and len(rel) > len(set(rel.subjects))
    n = len(rel)
    objs = sorted(set(rel.objects))
    first = {o: i + 7 for i, o in enumerate(objs)}  # a distinct "first token" per object
    lm = SimpleNamespace(bridge=SimpleNamespace(W_U=torch.randn(8, 100, generator=torch.Generator().manual_seed(0))))
    rs = _states(rel, _signal_layers(np.array([objs.index(o) for o in rel.objects]), [0.5, 1.0], d=8))
    rs.object_first = [first[o] for o in rel.objects]
    made = []
    real = R.subject_splits
    monkeypatch.setattr(P, "subject_splits", lambda *a, **kw: made.extend(real(*a, **kw)) or made)
    for seed in range(5):
        made.clear()
        rows, sel = P.relation_readout(rs, lm, P.ProbeConfig(n_splits=4, split=split), seed=seed)
        assert rows and sel["readout_kind"] == ("vector" if kind == "one_to_many" else "classifier")
        assert sel["n_test"] == n  # four disjoint folds: every fact scored once
        for tr, te in made:
            assert not {rel.subjects[i] for i in tr} & {rel.subjects[i] for i in te}
    # a split by fact would separate a subject's facts: the readout refuses it
    subj = np.array(rel.subjects)
    by_fact = R.split_indices(n, 0.25, seed=0)
    assert set(subj[by_fact[0]]) & set(subj[by_fact[1]])
    with pytest.raises(ValueError, match="both the training and the test part"):
        R.nested_layer_readout([np.asarray(rs.states[0])], np.arange(n) % 3, subj, [by_fact])


def test_stratified_folds_spread_objects_without_forcing_rare_ones_into_test():
    """A two-subject object lands in the held-out fold about half the time with four folds (the forced
    stratification put one of its subjects there every time); every object's subjects are spread evenly."""
    y = np.repeat(np.arange(5), [20, 8, 4, 2, 1])
    groups = np.arange(len(y))
    hits_pair = hits_single = 0
    trials = 400
    for seed in range(trials):
        fold = R.group_folds(groups, 4, seed=seed, strata=y)
        assert np.bincount(fold).max() - np.bincount(fold).min() <= 1
        for c, m in ((0, 20), (1, 8), (2, 4)):
            assert sorted(np.bincount(fold[y == c], minlength=4)) == [m // 4] * 4
        hits_pair += int((fold[y == 3] == 0).any())
        hits_single += int((fold[y == 4] == 0).any())
    assert 0.4 < hits_pair / trials < 0.6 and 0.15 < hits_single / trials < 0.35


def test_ceiling_counts_test_facts_whose_object_is_absent_from_training():
    rng = np.random.default_rng(0)
    y = np.array([0] * 10 + [1] * 10 + [2] * 4)
    groups = np.arange(len(y))
    te = np.array([0, 1, 10, 11, 20, 21, 22, 23])  # every fact of object 2 is held out
    tr = np.setdiff1d(groups, te)
    X = rng.normal(size=(len(y), 5))
    X[:, 0] += 3 * y
    sel = R.nested_layer_readout([X, X + rng.normal(size=X.shape)], y, groups, [(tr, te)], seed=0)["selected"]
    assert sel["ceiling"] == pytest.approx(0.5) and sel["accuracy"] <= sel["ceiling"]
    assert sel["ceiling_n"] == 8 and sel["ceiling_ci"][0] < 0.5 < sel["ceiling_ci"][1]


# ---- --known-only and the result's keys ------------------------------------------------------------------------


def test_known_only_scores_the_known_facts_only():
    n, k = 60, 3
    rel = _colours(n, k)
    y = np.arange(n) % k
    known = np.arange(n) % 3 != 1  # 40 known facts
    rs = _states(rel, _signal_layers(y, [0.5, 1.5]), known=known)
    rows, sel = P.relation_readout(rs, None, P.ProbeConfig(known_only=True, n_splits=4), seed=0)
    assert sel["facts"] == "known" and sel["n_test"] == int(known.sum()) == 40
    assert all(r["facts"] == "known" and r["readout_accuracy_n"] == 40 for r in rows)
    _, every = P.relation_readout(rs, None, P.ProbeConfig(n_splits=4), seed=0)
    assert every["facts"] == "all" and every["n_test"] == n
    _, few = P.relation_readout(_states(rel, _signal_layers(y, [1.0]), known=np.arange(n) < 3), None,
                                P.ProbeConfig(known_only=True), seed=0)
    assert few is None  # three known facts: nothing to fit, skipped with a warning
    with pytest.raises(ValueError, match="--known-only"):
        P.ProbeConfig(known_only="yes")
    with pytest.raises(ValueError, match="--splits 5"):
        P.ProbeConfig(n_splits=5)  # the held-out folds are disjoint: at most 4 with --heldout 0.25


def test_best_layers_report_the_validation_choice_and_keep_the_keys_readers_use():
    n, k = 40, 4
    rel = _colours(n, k)
    y = np.arange(n) % k
    cfg = P.ProbeConfig(n_splits=2)
    rs = _states(rel, _signal_layers(y, [0.0, 2.0, 0.0]))
    rows, sel = P.relation_readout(rs, None, cfg, seed=0)
    result = {"relations": [P._relation_record(rel, rs, sel)], "per_layer": rows}
    best = P.best_layers(result)[0]
    assert best["selected_on"] == "validation" and best["best_layer"] == best["selected_layer"] == 1
    for key in ("relation", "kind", "readout_accuracy", "control_accuracy", "chance", "prior_baseline", "n_test",
                "n_train", "best_on_test_layer", "control_selected_layer"):
        assert key in best, key
    stats.check_reported(best, SELECTED)
    curves = [c for c in P.mean_curves(result) if c["group"] == "all"]
    assert [c["layer"] for c in curves] == [0, 1, 2]
    for c, r in zip(curves, rows):
        stats.check_reported(c, ["mean_readout_accuracy", "mean_control_accuracy", "mean_chance", "mean_ceiling"])
        assert c["mean_readout_accuracy"] == r["readout_accuracy"] and c["mean_readout_accuracy_n"] == 1
    assert max(r["readout_accuracy"] for r in rows) == best["best_on_test_upper_bound"]
