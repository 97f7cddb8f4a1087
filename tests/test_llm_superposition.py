"""The superposition test on a pretrained model: finds planted structure, not absent structure; CLI run directory."""

import json

import numpy as np
import pytest
import torch

from llm_tiny import build_model
from mechfact.cli import main
from mechfact.llm import superposition as S
from mechfact.llm.relations import Relation

SUBJECTS = [f"zz{i}" for i in range(40)]


def _relations():
    rng = np.random.default_rng(0)
    rels = []
    for r, n_obj in enumerate((4, 6, 40, 5)):
        objs = [f"o{r}x{j}" for j in range(n_obj)]
        pick = np.arange(40) if n_obj == 40 else rng.integers(0, n_obj, 40)
        rels.append(Relation(f"rel{r}", ["{} has"], [(s, objs[k]) for s, k in zip(SUBJECTS, pick)]))
    return rels


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    from mechfact.llm.models.loading import load_model

    return load_model(str(build_model("llama", tmp_path_factory.mktemp("sp") / "llama")))


@pytest.mark.slow  # seconds: the slow tier keeps the fast one under 5 minutes
@pytest.mark.parametrize("planted", [True, False])
def test_finds_planted_superposition_and_not_random_states(lm, monkeypatch, planted, one_thread):
    """States built as c + sum_r a_r(s) M_r + noise: held-out R^2 high, controls low; random states: R^2 ~ 0.

    One-hot class codes (the tiny tokenizer gives every made-up object the same first token, so unembedding rows
    would coincide); the one-to-one relation rel2 cannot help on held-out subjects, so it is left out of X."""
    rels = _relations()
    subjects, _ = S.shared_subjects(rels, 4)  # the order the test uses
    V, P, _ = S.attribute_table(lm, rels, subjects, "class")
    g = torch.Generator().manual_seed(1)
    d = lm.d_model
    if planted:
        M = [torch.randn(V.shape[1], d, generator=g).double().numpy() for _ in rels]
        X = sum(V[P[r]] @ M[r] for r in (0, 1, 3)) + 0.05 * torch.randn(40, d, generator=g).double().numpy()
    else:
        X = torch.randn(40, d, generator=g).double().numpy()
    monkeypatch.setattr(S, "subject_states",
                        lambda lm_, subjects, cfg, layers, progress=False: torch.tensor(X)[None].float())
    res = S.llm_superposition(lm, rels, layers=[0], n_splits=2, cache_states=False, attributes="class")
    row = res.records[0]
    if planted:
        assert row["r2_heldout"] >= 0.8 and row["r2_heldout_attribute_subspace"] >= 0.8, row
        assert row["control_shuffled_r2_heldout"] <= 0.2 and row["control_shuffled_r2_heldout_attribute_subspace"] <= 0.2
        # one-hot codes carry object identity only, so random codes of the same size do as well (by design)
        assert abs(row["control_random_features_r2_heldout"] - row["r2_heldout"]) <= 0.1, row
        assert row["decodability"]["rel1"]["accuracy"] >= 0.8  # a 6-object relation is decodable from the state
    else:
        assert abs(row["r2_heldout"]) <= 0.1 and row["decodability"]["rel1"]["accuracy"] <= 0.6, row


def _planted(lm, seed: int):
    """(relations, subjects, states c + sum_r a_r(s) M_r + noise over the non-one-to-one relations, generator)."""
    rels = _relations()
    subjects, _ = S.shared_subjects(rels, 4)
    V, P, _ = S.attribute_table(lm, rels, subjects, "class")
    g = torch.Generator().manual_seed(seed)
    d = lm.d_model
    M = [torch.randn(V.shape[1], d, generator=g).double().numpy() for _ in rels]
    X = sum(V[P[r]] @ M[r] for r in (0, 1, 3)) + 0.05 * torch.randn(40, d, generator=g).double().numpy()
    return rels, subjects, X, g


@pytest.mark.parametrize("only_known", [True, False])
def test_known_subjects_are_scored_apart_from_unknown_ones(lm, monkeypatch, only_known, one_thread):
    """The attributes planted in the states of the 20 subjects the model "recalls" only (the other 20: noise of
    the same size): the known group's held-out R^2 is high, the unknown group's about 0, and relabelling the
    subjects finds the difference; planted in every subject, the two groups agree (no difference called). The
    rule (most relations spelled on a 3-shot prompt) is the module's; the recall itself is planted here."""
    rels, subjects, X, g = _planted(lm, 3)
    known = np.arange(40) % 2 == 0
    if only_known:
        X[~known] = X[known].std() * torch.randn(20, lm.d_model, generator=g).double().numpy() + X[known].mean(0)
    recall = np.repeat(known[:, None], len(rels), 1)
    monkeypatch.setattr(S, "subject_recall", lambda lm_, rels_, subjects_, **kw: recall)
    monkeypatch.setattr(S, "subject_states",
                        lambda lm_, subjects, cfg, layers, progress=False: torch.tensor(X)[None].float())
    res = S.llm_superposition(lm, rels, layers=[0], cache_states=False, attributes="class")
    c = res.records[0]["known_contrast"]
    assert c["n_known"] == c["n_unknown"] == 20 and "20 of 40 subjects" in res.known_rule
    assert res.recalled[subjects[0]] == [r.name for r in rels] and res.recalled[subjects[1]] == []
    assert c["null_known"]["p_value"] < 0.05, c
    if only_known:  # (the fit is trained on both groups, so the noise halves the known group's R^2 too)
        assert c["r2_known"] > 0.15 and c["r2_unknown"] < 0 and c["diff"] > 0.2 and c["p_value"] < 0.01, c
        assert c["null_unknown"]["p_value"] > 0.05, c
        assert c["recall_spearman"]["rho"] > 0.5 and c["recall_spearman"]["p_value"] < 0.01, c
    else:
        assert c["r2_known"] > 0.8 and abs(c["diff"]) < 0.1 and c["p_value"] > 0.05, c
        assert c["recall_spearman"]["p_value"] > 0.05, c
    assert res.records[0]["known_contrast_beyond_layer0"]["n_known"] == 20


@pytest.mark.slow  # seconds of training: the slow tier keeps the fast one under 5 minutes
def test_standardize_keeps_one_massive_coordinate_from_deciding_r2(lm, monkeypatch, one_thread, caplog):
    """Planted structure plus one coordinate 1000x larger that varies with something else (as a position-dependent
    'massive activation' would): raw pooled R^2 is decided by that coordinate (about 0 or below), standardised it
    sees the planted structure again; the shuffled control stays low both ways."""
    rels, subjects, X, g = _planted(lm, 2)
    X[:, 0] = 1000.0 * torch.randn(40, generator=g).double().numpy()
    monkeypatch.setattr(S, "subject_states",
                        lambda lm_, subjects, cfg, layers, progress=False: torch.tensor(X)[None].float())
    rows = {std: S.llm_superposition(lm, rels, layers=[0], n_splits=2, cache_states=False, attributes="class",
                                     standardize=std).records[0] for std in (False, True)}
    assert rows[False]["r2_heldout"] <= 0.1, rows[False]
    assert rows[False]["top_coordinate"] == 0 and rows[False]["top_coordinate_variance_share"] > 0.9
    warned = [r.getMessage() for r in caplog.records if "holds" in r.getMessage()]
    assert len(warned) == 1 and "coordinate 0 holds" in warned[0] and "--standardize" in warned[0], warned
    assert rows[True]["r2_heldout"] >= 0.6 and rows[True]["control_shuffled_r2_heldout"] <= 0.2, rows[True]
    with pytest.raises(ValueError, match="standardize 'yes'"):
        S.LlmSuperpositionConfig(standardize="yes")


def test_superposition_cli_writes_a_run_directory(lm, tmp_path, monkeypatch, one_thread, capsys):
    monkeypatch.setenv("MECHFACT_CACHE", str(tmp_path / "cache"))
    rels = tmp_path / "rels"
    rels.mkdir()
    for r in _relations():
        (rels / f"{r.name}.json").write_text(json.dumps(r.to_dict()))
    out = tmp_path / "sp"
    argv = ["llm", "superposition", "--model", lm.name, "--relations", str(rels), "--layers", "0,2", "--splits", "1",
            "--folds", "4", "--n-null", "19", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    res = json.loads((out / "result.json").read_text())
    assert [r["layer"] for r in res["per_layer"]] == [0, 2] and len(res["subjects"]) == 40
    assert res["folds"] == 4 and res["n_null"] == 19 and res["prompt"] == "{}" and res["standardize"] is False
    row = res["per_layer"][0]
    assert set(row["r2_heldout_each_relation_alone"]) == {"rel0", "rel1", "rel2", "rel3"}
    assert set(row["delta_r2_drop_one"]) == {"rel0", "rel1", "rel2", "rel3"} and len(row["alpha_per_fold"]) == 4
    assert row["null_shuffled"]["n_null"] == 19 and 0 < row["p_value"] <= 1 and len(row["r2_heldout_ci"]) == 2
    assert (out / "fig_superposition.png").stat().st_size > 1000
    assert main(argv) == 0  # resumes: same result
    assert json.loads((out / "result.json").read_text()) == res
    capsys.readouterr()
    assert main(argv[:-3] + ["--min-relations", "5", "--out", str(tmp_path / "bad"), "--quiet"]) == 2
    assert "4 relations given; the test needs at least 5" in capsys.readouterr().err
    assert main(argv[:-3] + ["--standardize", "--drop-massive", "--prompt", "words", "--out", str(tmp_path / "std"),
                             "--quiet"]) == 0
    cfg = json.loads((tmp_path / "std" / "config.json").read_text())["config"]
    assert cfg["standardize"] is True and cfg["drop_massive"] is True and cfg["prompt"] == "Some facts about {}"
    std = json.loads((tmp_path / "std" / "result.json").read_text())
    assert std["standardize"] and std["drop_massive"] and std["per_layer"][0]["states"] == "standardised"


def test_the_llm_config_has_its_own_name_and_the_old_one_warns():
    from mechfact.probes.experiments import SuperpositionConfig as FactConfig

    with pytest.warns(DeprecationWarning, match="now LlmSuperpositionConfig"):
        old = S.SuperpositionConfig
    assert old is S.LlmSuperpositionConfig and old is not FactConfig


def test_probe_superposition_on_a_pretrained_model_is_llm_superposition(lm, tmp_path, monkeypatch, one_thread):
    """`mechfact probe superposition --model <pretrained>` runs `mechfact llm superposition` (same numbers)."""
    monkeypatch.setenv("MECHFACT_CACHE", str(tmp_path / "cache"))
    rels = tmp_path / "rels"
    rels.mkdir()
    for r in _relations():
        (rels / f"{r.name}.json").write_text(json.dumps(r.to_dict()))
    common = ["--model", lm.name, "--relations", str(rels), "--layers", "0,2", "--folds", "4", "--n-null", "19",
              "--quiet"]
    assert main(["llm", "superposition", *common, "--out", str(tmp_path / "llm")]) == 0
    assert main(["probe", "superposition", *common, "--out", str(tmp_path / "probe")]) == 0
    a, b = (json.loads((tmp_path / d / "result.json").read_text()) for d in ("llm", "probe"))
    assert a["per_layer"] and a["per_layer"] == b["per_layer"]
