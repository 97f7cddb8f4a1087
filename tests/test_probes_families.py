"""probes.families reads its earlier write-up back: every cell it writes parses to the same numbers."""

import pytest

from probes import families as F


@pytest.mark.parametrize("row", [
    {"n_known": 12, "n_samples": 27, "faithfulness": 0.7, "faithfulness_best_beta": 0.76, "best_beta": 3.25,
     "causality_best_rank": 0.38, "best_rank": 32},
    {"n_known": 8, "n_samples": 50, "faithfulness": 1.0, "faithfulness_best_beta": 1.0, "best_beta": 1.0,
     "causality_best_rank": None, "best_rank": None},
    {"n_known": 2, "n_samples": 50, "faithfulness": None},
])
def test_cells_parse_back_to_their_numbers(row):
    got = F.parse_cell(F._lre_cell(row))
    assert (got["n_known"], got["n_samples"]) == (row["n_known"], row["n_samples"])
    if row["faithfulness"] is None:
        assert got["faithfulness"] is None and got["causality_best_rank"] is None
    else:
        assert got["faithfulness_best_beta"] == round(row["faithfulness_best_beta"], 2)
        assert got["best_beta"] == row["best_beta"] and got["best_rank"] == row["best_rank"]
        assert got["causality_best_rank"] == (None if row["causality_best_rank"] is None
                                              else round(row["causality_best_rank"], 2))


def test_previous_tables_fill_missing_runs_only(tmp_path):
    md = "\n".join([
        "| relation | smollm2-135m (layer 15) | gemma3-270m (layer 9) | qwen2.5-0.5b (layer 12) | authors |",
        "|---|---|---|---|---|",
        "| country capital city | 14/24: F 0.89 (β 1), C 0.96 (r 128) | not run | 3/24: too few known | 0.88 |",
        "",
        "| relation | model | F by layer |",  # another table: not an LRE table of the families
        "| country capital city | smollm2-135m | 3: 0.50 |",
    ])
    prev = F.previous_lre(md)
    assert prev["smollm2-135m"]["country capital city"]["faithfulness_best_beta"] == 0.89
    assert "country capital city" not in prev["gemma3-270m"]
    assert prev["qwen2.5-0.5b"]["country capital city"]["faithfulness"] is None
    table = F.lre_table(tmp_path, prev)  # no runs in tmp_path: the previous cells come back as they were
    assert "| country capital city | 14/24: F 0.89 (β 1), C 0.96 (r 128) | not run | 3/24: too few known |" in table
    with pytest.raises(ValueError, match="'F high'"):
        F.parse_cell("F high")
