"""The superposition test's nulls: the vectorised fit equals a per-draw loop, the permutation test finds planted
structure and not noise, the attribute subspace is refitted per draw, and the LLM rows carry every number with
its interval, p-value and chosen alpha."""

import json

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge

from llm_tiny import build_model
from mechfact import stats
from mechfact.llm import superposition as S
from mechfact.llm.relations import Relation
from mechfact.probes import superposition as core
from mechfact.seeding import derive_seed

SUBJECTS = [f"zz{i}" for i in range(40)]


# ---- the vectorised engine against explicit loops -------------------------------------------------------------

def _table(seed=0, n=24, k=6, codes=(4, 5, 24)):
    rng = np.random.default_rng(seed)
    V = rng.standard_normal((sum(codes), k))
    off = np.cumsum((0,) + codes)
    P = np.stack([off[r] + (rng.permutation(n) if c == n else rng.integers(0, c, n)) for r, c in enumerate(codes)])
    return V, P


def _loop_r2(X, designs, folds, nuisance=None):
    """Held-out R^2 and chosen alphas, draw by draw: explicit design, GCV from the explicit hat matrix over the
    grid (unpenalised intercept and nuisance columns profiled out), sklearn Ridge at the chosen alpha when there
    is no nuisance."""
    n = X.shape[0]
    N = np.ones((n, 1)) if nuisance is None else np.column_stack([np.ones(n), nuisance])
    r2, alphas = [], []
    for Z in designs:
        res = tot = 0.0
        chosen = []
        for tr, te in folds:
            m = len(tr)
            Mp = np.eye(m) - N[tr] @ np.linalg.pinv(N[tr])
            Zm, Xm = Mp @ Z[tr], Mp @ X[tr]
            scale = np.trace(Zm @ Zm.T) / (m - N.shape[1])
            best = None
            for a in core.GCV_ALPHAS * scale:
                H = Zm @ np.linalg.solve(Zm.T @ Zm + a * np.eye(Z.shape[1]), Zm.T)
                rss = ((Xm - H @ Xm) ** 2).sum()
                gcv = rss / m / (1 - (N.shape[1] + np.trace(H)) / m) ** 2
                if best is None or gcv < best[0]:
                    best = (gcv, a)
            a = best[1]
            chosen.append(a)
            W = np.linalg.solve(Zm.T @ Zm + a * np.eye(Z.shape[1]), Zm.T @ Xm)
            beta = np.linalg.pinv(N[tr]) @ (X[tr] - Z[tr] @ W)
            pred = N[te] @ beta + Z[te] @ W
            if nuisance is None:
                assert np.allclose(Ridge(alpha=a).fit(Z[tr], X[tr]).predict(Z[te]), pred, atol=1e-8)
            res += ((X[te] - pred) ** 2).sum()
            tot += ((X[te] - X[tr].mean(0)) ** 2).sum()
        r2.append(1 - res / tot)
        alphas.append(chosen)
    return np.array(r2), np.array(alphas)


@pytest.mark.parametrize("with_nuisance", [False, True])
def test_vectorised_null_equals_the_per_draw_loop(with_nuisance, one_thread):
    V, P = _table()
    n = P.shape[1]
    rng = np.random.default_rng(1)
    X = V[P[0]] @ rng.standard_normal((6, 9)) + rng.standard_normal((n, 9))
    nuis = rng.standard_normal((n, 2)) if with_nuisance else None
    folds = core.kfold(n, 4, 1, seed=3)
    pi = core.shuffled_perms(n, 6, seed=2)
    Gr = core.random_code_grams(V.shape[0], V.shape[1], 4, 0.7, seed=5)
    K0 = core.code_kernel(V @ V.T, P)
    K = np.concatenate([K0[None], K0[pi[:, :, None], pi[:, None, :]], core.code_kernel(Gr, P)])
    got = core.cv_r2(K, core.factor(X - X.mean(0)), folds, nuisance=nuis)
    # the same draws, built the slow way: explicit designs; the random tables regenerated from the same stream
    rng_r = np.random.default_rng(derive_seed(5, "probes.superposition.random_features"))
    Vr = rng_r.standard_normal((4, V.shape[0], V.shape[1])) * 0.7
    designs = ([core.design(V, P, np.arange(n))] + [core.design(V, P[:, p], np.arange(n)) for p in pi]
               + [core.design(v, P, np.arange(n)) for v in Vr])
    want, alphas = _loop_r2(X, designs, folds, nuis)
    np.testing.assert_allclose(got["r2"], want, atol=1e-10)
    np.testing.assert_allclose(got["alpha"], alphas, rtol=1e-9)
    assert np.ptp(want) > 0.05  # the draws differ, so agreement is not a coincidence of constant numbers


def test_kfold_holds_every_subject_out_once_per_repeat():
    folds = core.kfold(23, 5, repeats=2, seed=0)
    assert len(folds) == 10
    for rep in range(2):
        held = np.concatenate([te for _, te in folds[5 * rep:5 * rep + 5]])
        assert sorted(held.tolist()) == list(range(23))
        for tr, te in folds[5 * rep:5 * rep + 5]:
            assert not set(tr) & set(te) and len(tr) + len(te) == 23 and 4 <= len(te) <= 5
    assert [te.tolist() for _, te in folds[:5]] != [te.tolist() for _, te in folds[5:]]
    with pytest.raises(ValueError, match="folds=1"):
        core.kfold(10, 1)


@pytest.mark.parametrize("m", [24, 12])  # 12: more readout directions than the training states span (SVD route)
def test_readout_subspace_equals_the_explicit_ridge_maps(m, one_thread):
    """The subspace from Gram algebra equals the one built in state space: per relation a ridge map state -> code
    (alpha by GCV), its top singular vectors (90% of the energy, at most 8), their span; compared as the Gram of
    the projected states."""
    rng = np.random.default_rng(3)
    n, p, k, codes = 30, 50, 12, (3, 24, 7)
    tr = np.arange(m)
    F = rng.standard_normal((n, p))
    V = rng.standard_normal((sum(codes), k))
    off = np.cumsum((0,) + codes)
    local = [rng.integers(0, c, m) for c in codes]
    rel = []
    for r, c in enumerate(codes):
        ev, U = np.linalg.eigh(V[off[r]:off[r + 1]] @ V[off[r]:off[r + 1]].T)
        rel.append((local[r][None], (U * np.sqrt(np.maximum(ev, 0)))[None]))
    Zq, dim = S._readout_subspace(F, tr, rel)
    mu_tr = F[tr].mean(0)
    Ftc = F[tr] - mu_tr
    ev = np.linalg.eigvalsh(Ftc @ Ftc.T)
    scale = ev[ev > 1e-10 * ev.max()].mean()
    dirs = []
    for r in range(len(codes)):
        A = V[off[r]:off[r + 1]][local[r]]
        A = A - A.mean(0)
        best = None
        for a in core.GCV_ALPHAS * scale:
            H = Ftc @ np.linalg.solve(Ftc.T @ Ftc + a * np.eye(p), Ftc.T) + np.ones((m, m)) / m
            gcv = (((np.eye(m) - H) @ A) ** 2).sum() / m / (1 - np.trace(H) / m) ** 2
            if best is None or gcv < best[0]:
                best = (gcv, a)
        coef = Ftc.T @ np.linalg.solve(Ftc @ Ftc.T + best[1] * np.eye(m), A)
        u, sv, _ = np.linalg.svd(coef, full_matrices=False)
        q = min(8, int(np.searchsorted(np.cumsum(sv ** 2) / (sv ** 2).sum(), 0.9) + 1))
        dirs.append(u[:, :q])
    u, sv, _ = np.linalg.svd(np.concatenate(dirs, 1), full_matrices=False)
    Qr = u[:, sv > 1e-8 * sv[0]]
    Y = (F - mu_tr) @ Qr
    assert dim[0] == Qr.shape[1] and Qr.shape[1] >= 5
    np.testing.assert_allclose(Zq[0] @ Zq[0].T, Y @ Y.T, atol=1e-9 * np.abs(Y @ Y.T).max())


# ---- the permutation test ----------------------------------------------------------------------------------------

def _planted(seed, n=60, d=30, noise=0.3, codes=(6, 10, 60), k=8, relations=(0, 1, 2)):
    V, P = _table(seed, n=n, k=k, codes=codes)
    rng = np.random.default_rng(seed + 100)
    X = sum(V[P[r]] @ rng.standard_normal((k, d)) for r in relations) + noise * rng.standard_normal((n, d))
    return X, V, P


def test_permutation_test_finds_planted_superposition_and_not_noise(one_thread):
    X, V, P = _planted(0)
    out = core.superposition_null(X, V, P, n_null=200, seed=0)
    assert out["n_null"] == 200 and out["null"].shape == (200,)
    assert out["r2_heldout"] >= 0.7 and out["null_q99"] <= 0.1, out
    assert out["p_value"] < 0.01 and out["p_value"] == stats.permutation_pvalue(out["r2_heldout"], out["null"])
    # the one-to-one relation generalises through the codes' geometry: random codes of the same size cannot
    rf = core.superposition_null(X, V, P, n_null=200, null="random_features", seed=0)
    assert rf["r2_heldout"] == out["r2_heldout"] and rf["p_value"] < 0.01 and rf["null_q99"] < out["r2_heldout"] - 0.2
    noise = np.random.default_rng(7).standard_normal(X.shape)
    out0 = core.superposition_null(noise, V, P, n_null=200, seed=0)
    assert out0["p_value"] > 0.05 and abs(out0["r2_heldout"]) < 0.1, out0
    with pytest.raises(ValueError, match="null 'other'"):
        core.superposition_null(X, V, P, n_null=20, null="other")


def test_permutation_test_is_calibrated_on_noise(one_thread):
    """Pure-noise states, 20 data sets: p-values are spread over (0, 1] (a null that forgets the alpha choice or
    reuses the true fit's pieces gives small p far more often than the nominal rate)."""
    V, P = _table(1, n=30, codes=(3, 5, 30))
    ps = [core.superposition_null(np.random.default_rng(s).standard_normal((30, 12)), V, P, n_null=99, seed=s,
                                  folds=3)["p_value"] for s in range(20)]
    assert sum(p <= 0.1 for p in ps) <= 5 and 0.3 <= np.mean(ps) <= 0.7, ps


# ---- on a (tiny) pretrained model ---------------------------------------------------------------------------------

def _relations(objects=None):
    rng = np.random.default_rng(0)
    rels = []
    for r, n_obj in enumerate((4, 6, 40, 5)):
        objs = objects[r] if objects and r in objects else [f"o{r}x{j}" for j in range(n_obj)]
        pick = np.arange(40) if n_obj == 40 else rng.integers(0, len(objs), 40)
        rels.append(Relation(f"rel{r}", ["{} has"], [(s, objs[k]) for s, k in zip(SUBJECTS, pick)]))
    return rels


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    from mechfact.llm.models.loading import load_model

    return load_model(str(build_model("llama", tmp_path_factory.mktemp("spn") / "llama")))


def _states(monkeypatch, X):
    monkeypatch.setattr(S, "subject_states",
                        lambda lm_, subjects, cfg, layers, progress=False: torch.tensor(X)[None].repeat(
                            len(layers), 1, 1).float())


def _class_states(lm, rels, seed, noise=0.05, planted=(0, 1, 3)):
    subjects, _ = S.shared_subjects(rels, 4)
    V, P, _ = S.attribute_table(lm, rels, subjects, "class")
    g = torch.Generator().manual_seed(seed)
    if planted:
        X = sum(V[P[r]] @ torch.randn(V.shape[1], lm.d_model, generator=g).double().numpy() for r in planted)
    else:
        X = np.zeros((40, lm.d_model))
    return X + noise * torch.randn(40, lm.d_model, generator=g).double().numpy()


REPORTED = ["r2_heldout", "r2_train", "control_shuffled_r2_heldout", "control_random_features_r2_heldout",
            "partial_r2_heldout", "r2_heldout_nuisance_only", "r2_heldout_attribute_subspace",
            "control_shuffled_r2_heldout_attribute_subspace", "alpha"]


@pytest.mark.parametrize("planted", [True, False])
def test_llm_rows_carry_p_values_intervals_and_matched_nulls(lm, monkeypatch, planted, one_thread):
    rels = _relations()
    _states(monkeypatch, _class_states(lm, rels, 1, planted=(0, 1, 3) if planted else ()))
    res = S.llm_superposition(lm, rels, layers=[0], cache_states=False, attributes="class", n_null=199)
    row = res.records[0]
    stats.check_reported(row, REPORTED)
    assert all(row[f"{k}_ci"] is not None and len(row[f"{k}_ci"]) == 2 for k in REPORTED)
    assert row["r2_heldout_n"] == 40 and row["null_shuffled"]["n_null"] == 199 and res.folds == 5
    lo, hi = row["r2_heldout_ci"]
    assert lo <= row["r2_heldout"] <= hi
    assert len(row["alpha_per_fold"]) == 5 and row["alpha_n"] == 5 and isinstance(row["alpha_at_grid_edge"], bool)
    for name in ("rel0", "rel1", "rel2", "rel3"):
        stats.check_reported(row["each_relation"][name], ["r2_heldout_alone", "delta_r2_drop_one"])
        assert row["delta_r2_drop_one"][name] == row["each_relation"][name]["delta_r2_drop_one"]
    if planted:
        assert row["r2_heldout"] >= 0.8 and lo >= 0.6 and row["p_value"] < 0.01, row
        assert row["null_shuffled"]["null_q99"] <= 0.2
        assert row["r2_heldout_attribute_subspace"] >= 0.8
        assert row["null_shuffled_attribute_subspace"]["p_value"] < 0.01
        assert row["control_shuffled_r2_heldout_attribute_subspace"] <= 0.2
        assert row["partial_r2_heldout"] >= 0.6 and row["null_partial"]["p_value"] < 0.01
        # a planted relation matters; the one-to-one relation (not planted, one-hot codes) adds nothing
        assert row["delta_r2_drop_one"]["rel1"] >= 0.1 and row["each_relation"]["rel1"]["drop_one_p_value"] < 0.01
        assert abs(row["delta_r2_drop_one"]["rel2"]) <= 0.05
        assert row["each_relation"]["rel2"]["drop_one_p_value"] > 0.05
        assert row["decodability"]["rel1"]["accuracy"] >= 0.8 and row["decodability"]["rel1"]["p_value"] < 0.01
    else:
        assert abs(row["r2_heldout"]) <= 0.1 and row["p_value"] > 0.05, row
        assert row["null_shuffled_attribute_subspace"]["p_value"] > 0.05
        assert row["null_partial"]["p_value"] > 0.05
        assert row["decodability"]["rel1"]["p_value"] > 0.05


@pytest.mark.slow  # seconds of training: the slow tier keeps the fast one under 5 minutes
def test_attribute_subspace_null_is_matched(lm, monkeypatch, one_thread):
    """Noise states: the attribute subspace fitted with the true attributes overfits them on the training subjects,
    so held-out R^2 in it falls below what shuffled attributes get in that same subspace; a null that reused it
    gave p = 1 on every data set. Refitted under each draw, the observed value sits inside its null."""
    rels = _relations()
    ps = []
    for seed in range(6):
        _states(monkeypatch, _class_states(lm, rels, seed, noise=1.0, planted=()))
        row = S.llm_superposition(lm, rels, layers=[0], cache_states=False, attributes="class",
                                  n_null=39).records[0]
        ps.append(row["null_shuffled_attribute_subspace"]["p_value"])
    assert np.mean(ps) <= 0.8 and min(ps) <= 0.5 and sum(p >= 0.95 for p in ps) <= 2, ps


def test_alpha_at_the_grid_edge_is_flagged(lm, monkeypatch, one_thread):
    """Exact superposition (no noise): GCV wants the least shrinkage, the grid's low end. Noisy planted states
    with a grid that stops far below the strength they need: its high end. Both flagged; a wide grid: neither."""
    rels = _relations()
    run = lambda: S.llm_superposition(lm, rels, layers=[0], cache_states=False, attributes="class",  # noqa: E731
                                      n_null=19).records[0]
    _states(monkeypatch, _class_states(lm, rels, 2, noise=0.0))
    exact = run()
    assert exact["alpha_at_grid_edge"] and exact["alpha_edge"] == "low", exact["alpha_per_fold"]
    assert min(exact["alpha_relative_per_fold"]) == core.GCV_ALPHAS[0]
    _states(monkeypatch, _class_states(lm, rels, 2, noise=3.0))
    wide = run()
    assert not wide["alpha_at_grid_edge"] and wide["alpha_edge"] is None, wide["alpha_relative_per_fold"]
    assert min(wide["alpha_relative_per_fold"]) >= 1.0  # these states want alpha >= 1 (relative)
    monkeypatch.setattr(core, "GCV_ALPHAS", np.logspace(-2, -1, 3))
    low = run()
    assert low["alpha_at_grid_edge"] and low["alpha_edge"] == "high" and low["alpha_grid_relative"] == [0.01, 0.1]
    assert low["alpha_relative_per_fold"] == [0.1] * 5


def test_objects_sharing_a_first_token_are_one_code_with_a_note(lm, monkeypatch, one_thread):
    """On the tiny tokenizer 'ax1' and 'ax2' share their first token (and so their unembedding row), 'cat' and
    'blue' do not: rel0 gets 3 codes, not 4 identical-in-part rows, and the decodability entry says so."""
    from mechfact.llm.prompts import object_token_ids

    objs = ["ax1", "ax2", "cat", "blue"]
    first = [object_token_ids(lm.tokenizer, o)[0] for o in objs]
    assert first[0] == first[1] and len(set(first)) == 3  # the premise
    rels = _relations({0: objs})
    subjects, _ = S.shared_subjects(rels, 4)
    V, P, names = S.attribute_table(lm, rels, subjects, "unembed")
    rows0 = V[np.unique(P[0])]
    assert len(rows0) == 3 and len({r.tobytes() for r in rows0}) == 3
    assert "ax1 / ax2" in names[0]
    shared = S.shared_first_token(lm, rels, subjects)
    assert shared["rel0"] == [["ax1", "ax2"]]
    _states(monkeypatch, np.random.default_rng(0).standard_normal((40, lm.d_model)))
    res = S.llm_superposition(lm, rels, layers=[0], cache_states=False, n_null=19)
    dec = res.records[0]["decodability"]["rel0"]
    assert dec["shared_first_token"] == [["ax1", "ax2"]] and "ax1 = ax2" in dec["note"] and dec["n_codes"] == 3
    assert res.shared_first_token["rel0"] == [["ax1", "ax2"]]


def test_massive_coordinate_dropped_and_options_recorded(lm, monkeypatch, one_thread, caplog):
    rels = _relations()
    X = _class_states(lm, rels, 3)
    X[:, 5] = 1000.0 * np.random.default_rng(1).standard_normal(40)
    _states(monkeypatch, X)
    raw = S.llm_superposition(lm, rels, layers=[0], cache_states=False, attributes="class", n_null=19)
    dropped = S.llm_superposition(lm, rels, layers=[0], cache_states=False, attributes="class", n_null=19,
                                  drop_massive=True, prompt="words")
    assert raw.records[0]["massive_coordinate"] and raw.massive_coordinate_layers == [0]
    assert raw.records[0]["r2_heldout"] <= 0.1 and raw.records[0]["dropped_coordinates"] is None
    row = dropped.records[0]
    assert row["dropped_coordinates"] == [5] and row["r2_heldout"] >= 0.6, row["r2_heldout"]
    assert dropped.drop_massive and not dropped.standardize and dropped.prompt == "Some facts about {}"
    assert raw.prompt == "{}" and row["states"] == "raw"
    assert S.LlmSuperpositionConfig(prompt="words").prompt == S.PROMPTS["words"]
    with pytest.raises(ValueError, match="exactly one"):
        S.LlmSuperpositionConfig(prompt="no subject")
    with pytest.raises(ValueError, match="n_null|n-null"):
        S.LlmSuperpositionConfig(n_null=5)


def test_rows_of_an_earlier_format_are_recomputed_on_resume(lm, monkeypatch, one_thread):
    rels = _relations()
    _states(monkeypatch, _class_states(lm, rels, 4))
    cfg = S.LlmSuperpositionConfig(layers=[0], cache_states=False, attributes="class", n_null=19)
    old = {"layer": 0, "r2_heldout": 9.0, "control_shuffled_r2_heldout": 0.0}
    res = S._run(lm, cfg, rels, 0, False, done={0: old})
    assert res.per_layer[0]["format"] == S.ROW_FORMAT and res.per_layer[0]["r2_heldout"] < 1.0
    kept = S._run(lm, cfg, rels, 0, False, done={0: res.per_layer[0]})
    assert json.dumps(kept.per_layer[0]) == json.dumps(res.per_layer[0])


def test_beyond_layer0_separates_recalled_attributes_from_lexical_ones(one_thread):
    """States that are a linear function of a layer-0 state which already carries the attributes (lexical
    geometry): the attributes fit the states (held-out R^2 high) but explain nothing beyond the whole layer-0 state;
    states that add the attributes to an attribute-free layer-0 state: the statistic finds them, with its null."""
    from mechfact.llm.superposition_data import LlmSuperpositionConfig
    from mechfact.llm.superposition_stats import _layer_row, _setup

    n, k, d, d0 = 60, 6, 30, 24
    V, P = _table(3, n=n, k=k, codes=(4, 5, n))
    rng = np.random.default_rng(11)
    attrs = sum(V[P[r]] @ rng.standard_normal((k, d0)) for r in range(3))
    tokens = rng.integers(1, 4, n).astype(float)
    cfg = LlmSuperpositionConfig(n_null=39, folds=5)
    lexical0 = attrs + 0.3 * rng.standard_normal((n, d0))
    M = rng.standard_normal((d0, d))
    recalled0 = rng.standard_normal((n, d0))
    wide0 = rng.standard_normal((n, 200))  # more coordinates than subjects
    cases = {"lexical": (lexical0, lexical0 @ M + 0.05 * rng.standard_normal((n, d))),
             "recalled": (recalled0, recalled0 @ M + attrs @ rng.standard_normal((d0, d))
                          + 0.05 * rng.standard_normal((n, d))),
             "recalled_wide": (wide0, wide0 @ rng.standard_normal((200, d)) / 4 + attrs @ rng.standard_normal((d0, d))
                               + 0.05 * rng.standard_normal((n, d)))}
    rows = {}
    for name, (X0, X) in cases.items():
        S_ = _setup(V, P, ["a", "b", "c"], X0, tokens, cfg, 0, [False, False, True])
        rows[name] = _layer_row(X, S_, cfg, 0)
    lex, rec = rows["lexical"], rows["recalled"]
    assert lex["r2_heldout"] > 0.6 and lex["p_value"] <= 0.05, lex["r2_heldout"]  # the attributes fit the states
    assert lex["r2_heldout_layer0_only"] > 0.9  # ... because layer 0 already holds them
    # three principal components of the layer-0 state do not take that geometry out: the partial R^2 stays high
    assert lex["partial_r2_heldout"] > 0.5
    assert lex["r2_heldout_beyond_layer0"] < 0.1 and lex["null_beyond_layer0"]["p_value"] > 0.05, \
        (lex["r2_heldout_beyond_layer0"], lex["null_beyond_layer0"])
    assert rec["r2_heldout_beyond_layer0"] > 0.3 and rec["null_beyond_layer0"]["p_value"] <= 1 / 40, \
        (rec["r2_heldout_beyond_layer0"], rec["null_beyond_layer0"])
    lo, hi = rec["r2_heldout_beyond_layer0_ci"]
    assert lo <= rec["r2_heldout_beyond_layer0"] <= hi and lo > 0
    # a layer-0 state wider than the subjects are many (its training residuals out of fold): still found
    wide = rows["recalled_wide"]
    assert wide["r2_heldout_beyond_layer0"] > 0.3 and wide["null_beyond_layer0"]["p_value"] <= 1 / 40, \
        (wide["r2_heldout_beyond_layer0"], wide["null_beyond_layer0"])
