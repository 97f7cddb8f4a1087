"""The training-side study's parts (synthetic/facts_study.py) are valid commands with valid configs: a part that
would fail after hours of the parts before it fails here in a second."""

import json
import re

import pytest

from synthetic.facts_study import PARTS


@pytest.mark.parametrize("name", sorted(PARTS))
def test_every_part_parses_into_a_valid_config(name, tmp_path):
    from mechfact.cli import build_parser
    from mechfact.facts import experiments as ex

    a = build_parser().parse_args(["facts", *PARTS[name], "--out", str(tmp_path / name)])
    assert a.facts_cmd in ("capacity", "multihop")
    if a.facts_cmd == "capacity":
        cfg = ex.FactsCapacityConfig(subjects=a.subjects, relations=a.relations, embeddings=a.embeddings,
                                     search=a.search, d=a.d, mlp_width=a.mlp_width, seeds=a.seeds,
                                     attributes=a.attributes, model=ex.ModelSpec(outputs=a.outputs))
        if name.startswith("pool_"):
            assert cfg.attributes and cfg.model.outputs == "attributes"
            more = re.search(r"_s(\d+)", name)  # more seeds of a part's settings: from the seed it names on
            assert a.seed == int(more.group(1)) if more else cfg.seeds >= 2


def test_multihop_table_reads_the_parts_and_the_construction_cache(tmp_path):
    """One row per (N, batch, steps, d, MLP width, seed) with direct / CoT per k; missing points are dashes; the construction's d
    comes from the cache (computed once), and a part's JSON survives the export the docs table is rebuilt from."""
    import json

    from synthetic import facts_study as F

    pts = [{"hops": 1, "mode": "direct", "accuracy": 1.0}, {"hops": 2, "mode": "direct", "accuracy": 0.5},
           {"hops": 2, "mode": "cot", "accuracy": 0.999}]
    (tmp_path / "multihop_N64_d8").mkdir()
    (tmp_path / "multihop_N64_d8" / "result.json").write_text(json.dumps({"points": pts}))
    (tmp_path / "construction_d.json").write_text(json.dumps({"64,4,1": 64, "64,4,2": 256, "1024,4,1": 112,
                                                                        "1024,4,2": 448}))
    (tmp_path / "multihop_N1024_b256_d16").mkdir()  # a minibatch part: its own row, its batch named
    (tmp_path / "multihop_N1024_b256_d16" / "result.json").write_text(json.dumps({"points": pts[:1]}))
    text = F.multihop_table(tmp_path)
    assert "| N | R | batch | steps | d | MLP width | seed | k = 1 direct | k = 2 direct | k = 2 CoT |" in text
    assert "| 64 | 4 | full | 3000 | 8 | 64 | 0 | 1.000 | 0.500 | 0.999 |" in text
    assert "| 1024 | 4 | 256 | 6000 | 16 | 64 | 0 | 1.000 | — | — |" in text
    (tmp_path / "multihop_N1024_b256_d64_seed1").mkdir()  # a second seed: a row of its own
    (tmp_path / "multihop_N1024_b256_d64_seed1" / "result.json").write_text(json.dumps({"points": pts[1:]}))
    text = F.multihop_table(tmp_path)
    assert "| 1024 | 4 | 256 | 6000 | 64 | 64 | 1 | — | 0.500 | 0.999 |" in text
    (tmp_path / "multihop_seed2").mkdir()  # the N = 32 parts (their own MLP width) are rows too
    (tmp_path / "multihop_seed2" / "result.json").write_text(json.dumps({"points": pts}))
    assert "| 32 | 4 | full | 3000 | 16 | 32 | 2 | 1.000 | 0.500 | 0.999 |" in F.multihop_table(tmp_path)
    (tmp_path / "multihop_seed2" / "result.json").unlink()
    assert "at N = 64, R = 4 (k = 1: 64, k = 2: 256)" in text
    assert F.export_multihop(tmp_path, tmp_path / "e") == 4
    assert F.multihop_table(tmp_path / "e") == text
    (tmp_path / "construction_d.json").write_text(json.dumps({"1024,4,1": 112}))  # a run folder with fewer
    F.export_multihop(tmp_path, tmp_path / "e")
    assert json.loads((tmp_path / "e" / "construction_d.json").read_text())["64,4,2"] == 256


def test_a_construction_too_big_to_evaluate_is_bounded_by_the_single_hop_block_size(tmp_path, monkeypatch):
    """Above CONSTRUCTION_MAX_CHAINS the table evaluates nothing and gives R^k (b1 + 1) as a lower bound, b1 + 1 the
    single-hop width over R (the block-size scan for R^k relations starts at b1); a cached value is used as is."""
    from synthetic import facts_study as F

    monkeypatch.setattr(F, "CONSTRUCTION_MAX_CHAINS", 4096)
    monkeypatch.setattr(F, "construction_d", lambda *a: pytest.fail(f"evaluated a construction {a}"))
    pts = [{"hops": k, "mode": "direct", "accuracy": 0.5} for k in (1, 2, 3)]
    (tmp_path / "multihop_N1024_d16").mkdir()
    (tmp_path / "multihop_N1024_d16" / "result.json").write_text(json.dumps({"points": pts}))
    (tmp_path / "construction_d.json").write_text(json.dumps({"1024,4,1": 112, "1024,4,2": 448}))
    text = F.multihop_table(tmp_path)
    assert "(k = 1: 112, k = 2: 448, k = 3: at least 1792)" in text  # 4^3 x 112 / 4
    assert "65,536 chains, over 4,096" in text


def test_the_multihop_table_in_results_facts_is_what_its_command_prints():
    from pathlib import Path

    from synthetic import facts_study as F

    root = Path(__file__).resolve().parents[1]
    if not (root / "docs/runs/multihop/construction_d.json").is_file():
        pytest.skip("docs/runs/multihop is not in this checkout")
    assert F.multihop_table(root / "docs/runs/multihop") in (root / "docs/results_facts.md").read_text()


def test_an_exported_part_resumes_where_it_stopped(tmp_path, monkeypatch, one_thread):
    """--resume-from: a part's exported JSON copied back into --out continues the run: the finished thresholds and
    the memoised evaluations are kept and nothing is retrained; a folder already in --out is left alone."""
    from mechfact.cli import main
    from synthetic import facts_study as S

    argv = ["facts", "capacity", "--subjects", "16", "--relations", "2", "--attributes", "4", "--outputs",
            "attributes", "--grid", "2", "4", "8", "--steps", "150", "--seeds", "1", "--quiet", "--threads", "1"]
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--out", "runs/facts/tiny"]) == 0
    assert S.export_run_json(tmp_path / "runs/facts/tiny", tmp_path / "shipped/tiny") == 3
    first = json.loads((tmp_path / "runs/facts/tiny/result.json").read_text())
    (tmp_path / "runs/facts/tiny").rename(tmp_path / "old")
    assert S.resume_shipped(tmp_path / "shipped", tmp_path / "runs/facts", ["tiny", "missing"]) == ["tiny"]
    assert S.resume_shipped(tmp_path / "shipped", tmp_path / "runs/facts", ["tiny"]) == []
    trained = []
    monkeypatch.setattr("mechfact.facts.capacity.train", lambda *a, **k: trained.append(1))
    assert main([*argv, "--out", "runs/facts/tiny"]) == 0
    again = json.loads((tmp_path / "runs/facts/tiny/result.json").read_text())
    assert trained == [] and again["thresholds"] == first["thresholds"] and again["evaluations"] == first["evaluations"]
