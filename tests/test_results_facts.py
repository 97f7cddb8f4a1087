"""docs/results_facts.md from run files alone (synthetic.results_facts): planted runs give the tables and the
numbers in its sentences; the shipped page is what its command writes."""

import json
import math
from pathlib import Path

import pytest

from synthetic import results_facts as RF


def _write(folder: Path, result: dict) -> None:
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps(result))


def test_the_page_computes_its_tables_and_sentences_from_the_runs(tmp_path):
    cons = [{"subjects": n, "relations": r, "hops": 1, "cot": False, "block_size": b, "d": r * (b + 1),
             "accuracy": 1.0, "scan": []} for n, b in ((64, 15), (256, 23)) for r in (2, 4)]
    cons.append({"subjects": 32, "relations": 2, "hops": 3, "cot": True, "block_size": 9, "d": 46, "accuracy": 1.0,
                 "scan": []})
    _write(tmp_path / "facts" / "construction", {"constructions": cons})
    width = [{"subjects": 64, "relations": r, "embeddings": e, "searched": "mlp-width", "seed": s, "d": 16,
              "threshold": t} for r, e, t in ((1, "trainable", 2), (1, "frozen", 16), (2, "trainable", 2),
                                              (2, "frozen", 32)) for s in (0, 1)]
    _write(tmp_path / "facts" / "width_d16", {"thresholds": width})
    # the pool's bijection rows (A = N) and a pool row (A = 16) that section 2 must leave out
    pool = [{"subjects": n, "relations": r, "attributes": a, "embeddings": "trainable", "searched": "d", "seed": s,
             "threshold": t, "mlp_width": 64, "r_log_n": r * math.log(n), "n_facts": n * r}
            for n, r, a, ts in ((64, 2, 64, (3, 3)), (64, 4, 64, (6, 6)), (256, 2, 256, (3, 4)),
                                (256, 4, 256, (7, 7)), (256, 4, 16, (2, 2)))
            for s, t in enumerate(ts)]
    _write(tmp_path / "pool" / "capacity" / "pool_N256", {"thresholds": pool})
    (tmp_path / "multihop").mkdir()
    RF.write_doc(tmp_path / "facts", tmp_path / "page.md", tmp_path / "pool", tmp_path / "multihop")
    page = (tmp_path / "page.md").read_text()
    q = 4 * 24 / (4 * math.log(256))
    assert f"| 256 | 4 | 23 | 96 | {q:.2f} | 1.000 |" in page
    qs = [r * (b + 1) / (r * math.log(n)) for n, b in ((64, 15), (256, 23)) for r in (2, 4)]
    assert f"d / (R ln N) stays within {min(qs):.2f}-{max(qs):.2f} while N R grows 8-fold (4 settings)" in page
    assert "N = 32, R = 2, K = 3: b = 9, d = 46, accuracy 1.000" in page
    # section 2: the median, its ratio to R ln N and the construction beside it (96 / 7)
    assert f"| 256 | 4 | {4 * math.log(256):.1f} | 7, 7 | 7 | {7 / (4 * math.log(256)):.2f} | 96 | 13.7x |" in page
    assert "| 256 | 2 | 11.1 | 3, 4 | 3.5 |" in page and "| 256 | 4 | 22.2 | 2, 2 |" not in page
    assert "Least-squares lines through the medians (4 settings, N = 64, 256)" in page
    # section 4: m* per seed and median, frozen / trainable
    assert "| 64 | 2 | 64 (= N) | 128 | 2, 2 (2) | 32, 32 (32) | 16x |" in page
    assert page.index("## 1.") < page.index("## 2.") < page.index("## 3.") < page.index("## 4.") < page.index("## 5.")


def test_the_construction_grid_resumes_from_what_it_wrote(tmp_path, monkeypatch):
    """A rerun evaluates only the settings missing from result.json."""
    monkeypatch.setattr(RF, "CONSTRUCTION_GRID", ((16, 2), (32, 2)))
    monkeypatch.setattr(RF, "COT_GRID", ())
    first = RF.run_construction(tmp_path)
    assert [(c["subjects"], c["relations"]) for c in first["constructions"]] == [(16, 2), (32, 2)]
    assert all(c["accuracy"] >= 0.99 and c["d"] == 2 * (c["block_size"] + 1) for c in first["constructions"])
    import importlib

    module = importlib.import_module("mechfact.facts.construct")  # the package re-exports a function of that name
    monkeypatch.setattr(module, "construct", lambda *a, **k: pytest.fail("re-evaluated"))
    assert RF.run_construction(tmp_path) == first


@pytest.mark.slow  # seconds: the slow tier keeps the fast one under 5 minutes
def test_the_facts_page_is_what_its_command_writes_from_the_shipped_runs(tmp_path):
    root = Path(__file__).resolve().parents[1]
    if not (root / "docs/runs/facts").is_dir():
        pytest.skip("docs/runs/facts is not in this checkout")
    RF.write_doc(root / "docs/runs/facts", tmp_path / "page.md", root / "docs/runs/pool", root / "docs/runs/multihop")
    assert (tmp_path / "page.md").read_text() == (root / "docs/results_facts.md").read_text()
