"""The threshold study's plumbing on a tiny world: d from d*, both regimes, resume, the table."""

import json

import pytest

from synthetic import threshold_study as T


def test_threshold_study_trains_at_multiples_of_d_star_resumes_and_tabulates(tmp_path, one_thread, capsys):
    cap = tmp_path / "cap"
    cap.mkdir()
    (cap / "result.json").write_text(json.dumps({"thresholds": [
        {"subjects": 32, "relations": 2, "attributes": 4, "embeddings": "trainable", "threshold": t, "seed": s}
        for s, t in enumerate((3, 4, 6))]}))
    assert T.d_star_from(cap, 32, 2, 4) == 4
    with pytest.raises(ValueError, match="no trainable-embedding threshold for N=32, R=2, A=8"):
        T.d_star_from(cap, 32, 2, 8)
    argv = ["--out", str(tmp_path / "t"), "--subjects", "32", "--relations", "2", "--attributes", "4", "--capacity",
            str(cap), "--factors", "1", "2.5", "--seeds", "0", "--steps", "100", "--mlp-width", "16"]
    T.main(argv)
    rows = T.collect(tmp_path / "t")
    assert sorted((r["regime"], r["d"]) for r in rows) == [("default", 4), ("default", 10), ("geometric", 4),
                                                          ("geometric", 10)]
    for r in rows:
        assert r["d_star"] == 4 and r["chance"] == 0.25 and 0 <= r["train_accuracy"] <= 1
        assert -1 <= r["control_r2_heldout"] <= 1 and r["zero_shot_control_accuracy"] <= 1
    default = {r["d"]: r for r in rows if r["regime"] == "default"}
    assert default[10]["train_config"]["loss"] == "ce" and default[10]["stopped"] in ("target", "budget")
    assert {r["train_config"]["loss"] for r in rows if r["regime"] == "geometric"} == {"mse"}
    first = (tmp_path / "t" / "N32_R2_A4" / "default_x1_seed0" / "summary.json").read_text()
    T.main(argv)  # finished runs are read back, not retrained
    assert (tmp_path / "t" / "N32_R2_A4" / "default_x1_seed0" / "summary.json").read_text() == first
    text = T.table(rows)
    assert text.count("\n") == 1 + 4 and "| 32 | 2 | 4 | default | 10 (2.5) | 1 |" in text
    with pytest.raises(SystemExit):
        T.main(["--out", str(tmp_path / "t")])  # neither --capacity nor --d-star
    assert "give one of --capacity" in capsys.readouterr().err
