"""probes.results_llm_lre builds its LRE tables from run folders alone: one beta per model chosen on training facts,
degenerate relations out of the means, Spearman against the published numbers with an interval."""

import json
import shutil
from pathlib import Path

import numpy as np

import pytest

from mechfact.llm.lre.protocol_authors import AUTHORS_BETAS
from probes import families as F, results_llm as FP, results_llm_lre as FL


def _row(name, f_by_beta, train_best, degenerate=False):
    """A per_relation row as `mechfact llm lre` writes it: test faithfulness per beta, training hits peaking at
    ``train_best``."""
    fb = {str(b): f_by_beta(b) for b in AUTHORS_BETAS}
    return {"relation": name, "kind": "many_to_one", "n_samples": 40, "n_known": 30, "n_test": 20, "n_trials": 8,
            "beta": 2.25, "degenerate": degenerate, "faithfulness": fb["2.25"], "faithfulness_ci": [0.1, 0.9],
            "faithfulness_n": 20, "faithfulness_by_beta": fb,
            "faithfulness_by_beta_ci": {k: [max(0, v - 0.1), min(1, v + 0.1)] for k, v in fb.items()},
            "train_faithfulness_by_beta": {str(b): [40 if b == train_best else 10, 40] for b in AUTHORS_BETAS},
            "faithfulness_bias_only": 0.05, "faithfulness_bias_only_ci": [0, 0.2], "faithfulness_bias_only_n": 20,
            "majority_baseline": 0.2, "majority_baseline_ci": [0.1, 0.3], "majority_baseline_n": 20,
            "causality": 0.5, "causality_ci": [0.3, 0.7], "causality_n": 20, "rank": 64}


def _write(out, model, rows):
    d = out / model / "lre_authors_factual"
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({"per_relation": rows}))


def test_model_beta_is_chosen_on_training_facts_and_spearman_uses_it(tmp_path):
    names = [n for n, (g, _) in F.PUBLISHED.items() if g is not None][:12]
    # test faithfulness at beta 1.0 follows GPT-J's order; at every other beta it runs against it. Training
    # hits peak at beta 1.0 for most relations, so the model beta is 1.0 and the correlation is positive.
    rows = []
    for k, n in enumerate(names):
        g = F.PUBLISHED[n][0]
        rows.append(_row(n, lambda b, g=g: g if b == 1.0 else 1 - g, 1.0 if k % 4 else 3.0))
    _write(tmp_path, "smollm2-135m-instruct", rows)
    sp = {r["reference"]: r for r in FL.spearman_rows(tmp_path)}
    assert sp["GPT-J"]["rho"] == pytest.approx(1.0) and sp["GPT-J"]["rho_n"] == 12
    assert sp["GPT-J"]["p_value"] < 0.01 and sp["GPT-J"]["rho_ci"][0] > 0.8
    table = FL.lre_table(tmp_path, "factual")
    assert "at the model beta 1.0" in table
    assert "Spearman smollm2-135m-instruct vs GPT-J (12 relations): rho 1.00" in table


def test_degenerate_relations_are_marked_and_left_out_of_the_means(tmp_path):
    rows = [_row("country capital city", lambda b: 0.5, 2.25), _row("landmark on continent", lambda b: 1.0, 2.25,
                                                                     degenerate=True)]
    _write(tmp_path, "smollm2-135m-instruct", rows)
    table = FL.lre_table(tmp_path, "factual")
    assert "degenerate (one object)" in table
    assert "1 relations scored and not degenerate (1 degenerate)" in table
    assert "F at beta 2.25 0.50" in table  # the mean is the one non-degenerate relation, not (0.5 + 1.0) / 2


def test_a_relation_the_bias_alone_solves_is_degenerate_too(tmp_path):
    """person university: "University" prefixes every object, so beta 0 (one constant answer) scores 1.00."""
    ok = _row("country capital city", lambda b: 0.5, 2.25)
    const = {**_row("person university", lambda b: 0.9, 2.25), "n_objects_test": 12,
             "faithfulness_bias_only": 1.0}
    _write(tmp_path, "smollm2-135m-instruct", [ok, const])
    table = FL.lre_table(tmp_path, "factual")
    assert "degenerate (the bias alone is right on every test fact)" in table
    assert "1 relations scored and not degenerate (1 degenerate)" in table and "F at beta 2.25 0.50" in table


def test_families_run_needs_the_relation_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        FP.main(["--run", "--out", str(tmp_path), "--relations", str(tmp_path / "nope")])
    assert e.value.code == 2 and "--run needs --relations DIR" in capsys.readouterr().err


def test_exported_runs_rebuild_the_same_page_without_machine_paths(tmp_path):
    """--export copies the run JSON (no figures, no locks) with the data folder written portably; the page built
    from the copy equals the page built from the run folders."""
    runs, dest = tmp_path / "runs", tmp_path / "docs" / "runs"
    data = str(tmp_path / "private" / "lre" / "factual")
    _write(runs, "smollm2-135m-instruct", [_row("country capital city", lambda b: 0.5, 2.25)])
    folder = runs / "smollm2-135m-instruct" / "lre_authors_factual"
    (folder / "config.json").write_text(json.dumps({"kind": "llm.lre", "config": {"relations": data}, "seed": 0}))
    (folder / "meta.json").write_text(json.dumps({"wall_time_s": 1.0}))
    (folder / ".lock").write_text("x")
    (folder / "fig_lre.png").write_bytes(b"png")
    assert F.export(runs, dest) == 3
    copied = dest / "smollm2-135m-instruct" / "lre_authors_factual"
    assert sorted(p.name for p in copied.iterdir()) == ["config.json", "meta.json", "result.json"]
    assert json.loads((copied / "config.json").read_text())["config"]["relations"] == f"{F.DATA_NAME}/factual"
    assert str(tmp_path) not in "".join(p.read_text() for p in copied.iterdir())
    FP.write_doc(runs, tmp_path / "a.md")
    FP.write_doc(dest, tmp_path / "b.md")
    assert (tmp_path / "a.md").read_text() == (tmp_path / "b.md").read_text()
    assert "country capital city" in (tmp_path / "b.md").read_text()


@pytest.mark.parametrize("module,runs,page", [("results_llm", "docs/runs/fam", "docs/results_llm.md"),
                                              ("results_trace", "docs/runs/trace", "docs/results_trace.md"),
                                              ("results_recall", "docs/runs/recall", "docs/results_recall.md")])
@pytest.mark.slow  # seconds: the slow tier keeps the fast one under 5 minutes
def test_the_results_pages_are_what_their_command_writes_from_the_shipped_runs(module, runs, page, tmp_path):
    """No cell is typed by hand: the page in docs/ is byte for byte the command's output from docs/runs."""
    import importlib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if not (root / runs).is_dir():
        pytest.skip(f"{runs} is not in this checkout")
    mod = importlib.import_module(f"probes.{module}")
    mod.write_doc(root / runs, tmp_path / "page.md")
    assert (tmp_path / "page.md").read_text() == (root / page).read_text()


def test_shipped_runs_resume_under_another_data_folder(tmp_path, capsys):
    """--run --resume-from: an exported unfinished LRE run continues on a machine whose data folder is elsewhere
    (the config names that folder, its hash recomputed, the rows kept); a folder already in --out is not touched;
    without the rewrite the run would be refused as another config's."""
    from mechfact.runs import ELAPSED, RunDir

    def rundir(out, data):
        return RunDir(out / "qwen2.5-coder-0.5b-instruct" / "lre_authors_factual",
                      {"relations": str(data / "factual"), "rank": 64},
                      kind="llm.lre", seed=0, device="cpu", model_id="qwen2.5-coder-0.5b-instruct:abc")

    runs, shipped, out = tmp_path / "runs", tmp_path / "docs" / "fam", tmp_path / "again"
    run = rundir(runs, tmp_path / "first" / "lre")
    run.write_result({"per_relation": [{"relation": "country capital city", "faithfulness": 0.5}]})
    assert F.export(runs, shipped) == 3  # config, result, the unfinished run's wall time
    with pytest.raises(ValueError, match="different config"):  # the shipped files as they are: another path
        shutil.copytree(shipped, tmp_path / "raw")
        rundir(tmp_path / "raw", tmp_path / "second" / "lre").read_result({"per_relation": []})
    assert F.resume_shipped(shipped, out, tmp_path / "second" / "lre") == [
        "qwen2.5-coder-0.5b-instruct/lre_authors_factual"]
    again = rundir(out, tmp_path / "second" / "lre")
    assert again.read_result({"per_relation": []})["per_relation"][0]["faithfulness"] == 0.5
    spent = json.loads((shipped / "qwen2.5-coder-0.5b-instruct" / "lre_authors_factual" / ELAPSED).read_text()
                       )["wall_time_s"]
    assert again.wall_time_s() >= spent  # the time already spent is carried over
    (out / "qwen2.5-coder-0.5b-instruct" / "lre_authors_factual" / "result.json").write_text("{}")
    assert F.resume_shipped(shipped, out, tmp_path / "second" / "lre") == []
    assert (out / "qwen2.5-coder-0.5b-instruct" / "lre_authors_factual" / "result.json").read_text() == "{}"
    with pytest.raises(SystemExit):
        FP.main(["--out", str(out), "--resume-from", str(shipped)])
    assert "--resume-from needs --run" in capsys.readouterr().err


def test_a_relation_stopped_part_way_travels_with_the_exported_runs(tmp_path):
    """A relation's trial checkpoint (trials/*.npz) is exported beside the run's JSON and copied back by
    --resume-from, byte for byte; once the relation has finished, the next export drops it."""
    from mechfact.llm.lre import TRIALS_DIR
    from mechfact.runs import RunDir

    runs, shipped, out = tmp_path / "runs", tmp_path / "docs" / "fam", tmp_path / "again"
    run = RunDir(runs / "gemma3-270m" / "lre_layers_factual", {"relations": str(tmp_path / "lre" / "factual")},
                 kind="llm.lre", seed=0, device="cpu", model_id="gemma3-270m:abc")
    run.write_result({"per_relation": [{"relation": "country capital city", "faithfulness": 0.5}]})
    ck = run.path / TRIALS_DIR / "person_native_language-0123abcd.npz"
    ck.parent.mkdir()
    ck.write_bytes(b"trials 1-5 \x00\x01 of 8")
    assert F.export(runs, shipped) == 4  # config, result, wall time, the checkpoint
    there = shipped / "gemma3-270m" / "lre_layers_factual" / TRIALS_DIR / ck.name
    assert there.read_bytes() == ck.read_bytes()
    assert F.resume_shipped(shipped, out, tmp_path / "lre") == ["gemma3-270m/lre_layers_factual"]
    assert (out / "gemma3-270m" / "lre_layers_factual" / TRIALS_DIR / ck.name).read_bytes() == ck.read_bytes()
    ck.unlink()  # the relation finished: its rows are in result.json
    F.export(runs, shipped)
    assert not there.exists() and not there.parent.exists()


def test_run_status_says_how_far_a_relation_stopped_part_way_got(tmp_path):
    """A relation kept part way (its trial checkpoint) shows in the runs table with its trials done of those
    asked; a damaged checkpoint is left out, not fatal."""
    from mechfact.llm.lre import protocol_authors as A
    from mechfact.llm.lre import TRIALS_DIR

    _write(tmp_path, "qwen2.5-coder-0.5b-instruct", [_row("a", lambda b: 0.5, 1.0)])
    trials = tmp_path / "qwen2.5-coder-0.5b-instruct" / "lre_authors_factual" / TRIALS_DIR
    trials.mkdir()
    key = {"relation": "landmark on continent", "config": {"n_trials": 8}}
    A._save_trials(trials / "landmark_on_continent-0123abcd.npz", key, 3, {}, A._Outcomes(1, 8, 4),
                   A._Outcomes(1, 8, 4), set(), set(), [])
    (trials / "damaged-00000000.npz").write_bytes(b"not an npz")
    status = F._part_status(tmp_path, "qwen2.5-coder-0.5b-instruct", "lre_authors_factual")
    assert status.startswith("partial") and status.endswith("; landmark on continent at 3 of 8 trials"), status
    assert A.trials_kept(trials / "damaged-00000000.npz") is None


def test_run_status_counts_relations_against_every_model_and_every_request(tmp_path):
    """A model whose folders are finished but hold fewer relations than another model's (or than a folder's
    --relation-names asks for) is not reported as finished; a cap on causality edits shows in the cell."""
    _write(tmp_path, "smollm2-135m-instruct", [_row(n, lambda b: 0.5, 1.0) for n in ("a", "b")])
    _write(tmp_path, "gemma3-270m", [_row("a", lambda b: 0.5, 1.0)])
    asked = tmp_path / "qwen2.5-coder-0.5b-instruct" / "lre_authors_factual_big"
    asked.mkdir(parents=True)
    (asked / "result.json").write_text(json.dumps({"per_relation": []}))
    (asked / "config.json").write_text(json.dumps({"kind": "llm.lre", "seed": 0,
                                                   "config": {"relation_names": ["a", "b", "c"]}}))
    for m in F.MODELS[:2]:
        (tmp_path / m / "lre_authors_factual" / "meta.json").write_text("{}")
    got = F._part_status(tmp_path, "smollm2-135m-instruct", "lre_authors_factual")
    assert got == "2 of 3 relations (the rest not run)"
    assert F._part_status(tmp_path, "gemma3-270m", "lre_authors_factual") == "1 of 3 relations (the rest not run)"
    assert F._part_status(tmp_path, "qwen2.5-coder-0.5b-instruct", "lre_authors_factual").startswith("partial")
    assert "0 of 3 relations" in F._part_status(tmp_path, "qwen2.5-coder-0.5b-instruct", "lre_authors_factual")
    # the stopped folder's relations all ran in another folder: the part is finished, the stopped folder named
    rest = tmp_path / "qwen2.5-coder-0.5b-instruct" / "lre_authors_factual_capped"
    rest.mkdir()
    (rest / "result.json").write_text(json.dumps({"per_relation": [_row(n, lambda b: 0.5, 1.0) for n in "abc"]}))
    (rest / "meta.json").write_text("{}")
    assert F._part_status(tmp_path, "qwen2.5-coder-0.5b-instruct", "lre_authors_factual") == \
        "finished (1 folder stopped early, what it left ran in another), 3 relations, 2 folders"
    rest.joinpath("result.json").write_text(json.dumps({"per_relation": [_row("a", lambda b: 0.5, 1.0)]}))
    assert F._part_status(tmp_path, "qwen2.5-coder-0.5b-instruct", "lre_authors_factual").startswith("partial")
    (asked / "config.json").unlink()
    assert F._part_status(tmp_path, "smollm2-135m-instruct", "lre_authors_factual") == "finished, 2 relations"
    assert "≤64 edits/trial" in FL._lre_cell({**_row("a", lambda b: 0.5, 1.0), "max_causality": 64})
    assert "edits/trial" not in FL._lre_cell(_row("a", lambda b: 0.5, 1.0))


def test_run_plan_gives_each_relation_the_pages_settings_and_finishes_a_split_part_without_a_relation_twice(
        tmp_path, monkeypatch):
    """--run makes the page's LRE runs relation by relation (:func:`part_plan`): from nothing, the factual files
    above LARGE_FILE facts in one capped folder and the rest whole in another, a part whose relations all take
    the same settings as the plain command. On a part split by hand: a row counts only where its folder's
    settings are the plan's for that relation (an uncapped row of a large file runs again, capped); an
    unfinished folder resumes with its own config (the flags rebuild it exactly) when what it still asks for
    takes its settings and no other folder holds it; the rest goes to new folders. The page reads only rows
    with the plan's cap."""
    from mechfact import cli
    from mechfact.llm import lre as L
    from mechfact.runs import RunDir, _same_config, release
    from probes import results_llm_lre as FL
    from tests.llm_tiny import TINY_RELATIONS

    data = tmp_path / "data"
    big = [{"subject": f"s{i}", "object": "red"} for i in range(F.LARGE_FILE + 1)]
    for part, names in (("factual", "abcde"), ("linguistic", "xy")):
        (data / part).mkdir(parents=True)
        for n in names:
            rel = {**TINY_RELATIONS["tiny_colour"], "name": n, **({"samples": big} if n in "de" else {})}
            (data / part / f"{n}.json").write_text(json.dumps(rel))
    out, m = tmp_path / "runs", "gemma3-270m"
    cap = ["--max-causality", str(F.SWEEP_MAX_CAUSALITY)]
    assert [(f.name, a[a.index("--relation-names") + 1:]) for f, a in F.part_jobs(out, m, "lre_authors_factual",
                                                                                  data)] == [
        ("lre_authors_factual", ["a", "b", "c"]), ("lre_authors_factual_capped", ["d", "e", *cap])]
    assert F.part_jobs(out, m, "lre_authors_linguistic", data) == [
        (out / m / "lre_authors_linguistic", ["llm", "lre", "--model", m, "--relations", str(data / "linguistic")])]

    def folder(name, rows, done, **cfg):
        c = L.LreConfig(model=m, relations=str(data / "factual"), **cfg)
        run = RunDir(out / m / name, c.to_dict(), kind="llm.lre", seed=0, device="cpu", model_id=m)
        run.write_result({"per_relation": [{"relation": r, "n_samples": 12 if r in "abc" else F.LARGE_FILE + 1,
                                            "max_causality": cfg.get("max_causality")} for r in rows]})
        if done:
            (out / m / name / "meta.json").write_text("{}")
        release(out / m / name)
        return c

    folder("lre_authors_factual_small", ["a"], True, relation_names=["a"])
    folder("lre_authors_factual_large", ["d"], False, relation_names=["d", "e"])  # d uncapped: not the page's
    more = folder("lre_authors_factual_more", ["b"], False, relation_names=["b", "c"])
    folder("lre_authors_factual_capped", ["e"], True, relation_names=["e"], max_causality=F.SWEEP_MAX_CAUSALITY)
    jobs = F.part_jobs(out, m, "lre_authors_factual", data)
    assert [f.name for f, _ in jobs] == ["lre_authors_factual_more", "lre_authors_factual_capped2"]
    assert jobs[1][1][jobs[1][1].index("--relation-names") + 1:] == ["d", *cap]
    seen = {}
    monkeypatch.setattr(L, "run_llm_lre", lambda cfg, out, **kw: seen.update(cfg=cfg))
    cli.main(jobs[0][1] + ["--out", str(jobs[0][0])])
    assert _same_config(more.to_dict(), seen["cfg"].to_dict()) and seen["cfg"].to_dict() == more.to_dict()
    assert sorted(FL._lre_rows(out, m)) == ["a", "b", "e"]  # d's uncapped row is not read
    assert "1 row made with another causality cap not read" in F._part_status(out, m, "lre_authors_factual")
    # a layer sweep started on every relation of the folder: not resumed (it would run relations outside the
    # sweep), the sweep's relations go to a new folder
    folder("lre_layers_factual", [], False, layers=[int(x) for x in F.SWEEP_LAYERS[m].split(",")],
           max_causality=F.SWEEP_MAX_CAUSALITY)
    (f, argv), = F.part_jobs(out, m, "lre_layers_factual", data)
    assert f.name == "lre_layers_factual_2" and argv[argv.index("--relation-names") + 1:] == [
        *F.SWEEP["factual"], "--layers", F.SWEEP_LAYERS[m], *cap]
    with pytest.raises(ValueError, match="lre_probe_factual: not an LRE run of the page"):
        F.part_plan(m, "lre_probe_factual", data)


def test_the_rank_grid_runs_make_the_authors_runs_edits_on_the_authors_grid_and_the_page_sets_them_side_by_side(
        tmp_path, monkeypatch):
    """lre_ranks_<part>: the sweep's relations, each with the causality cap of the authors'-protocol run (the same
    edits) and the authors' grid range(0, 320, 8); the page sets C at the train-chosen rank of each grid side by
    side with the best-on-test bounds, the difference and the largest difference at the ranks both grids hold. A
    row made with another cap is not read; the runs table plans the part on the listed models only."""
    from mechfact.llm.lre.protocol_authors import AUTHORS_RANKS
    from probes import results_llm_lre as FL
    from tests.llm_tiny import TINY_RELATIONS

    data = tmp_path / "data"
    big = [{"subject": f"s{i}", "object": "red"} for i in range(F.LARGE_FILE + 1)]
    for part, names in (("factual", "ad"), ("linguistic", "x")):
        (data / part).mkdir(parents=True)
        for n in names:
            rel = {**TINY_RELATIONS["tiny_colour"], "name": n, **({"samples": big} if n == "d" else {})}
            (data / part / f"{n}.json").write_text(json.dumps(rel))
    monkeypatch.setattr(F, "SWEEP", {"factual": ("a", "d"), "linguistic": ("x",)})
    m, out = F.RANK_GRID[0][0], tmp_path / "runs"
    grid = ["--ranks", ",".join(map(str, AUTHORS_RANKS))]
    assert [(f.name, a[a.index("--relation-names") + 1:]) for f, a in F.part_jobs(out, m, "lre_ranks_factual",
                                                                                  data)] == [
        ("lre_ranks_factual", ["a", *grid]),
        ("lre_ranks_factual_capped", ["d", *grid, "--max-causality", str(F.SWEEP_MAX_CAUSALITY)])]
    base = {"relation": "a", "n_samples": 12, "n_known": 12, "n_test": 10, "n_trials": 8, "max_causality": None}
    default = {16: 0.3, 32: 0.6, 64: 0.8, 128: 0.7, 256: 0.3, 576: 0.0}
    authors = {**{r: 0.1 for r in AUTHORS_RANKS}, 16: 0.3, 32: 0.6, 56: 0.85, 64: 0.8, 128: 0.7, 256: 0.3}
    for name, by, rank, ci in (("lre_authors_factual", default, 64, [0.7, 0.9]),
                               ("lre_ranks_factual", authors, 56, [0.75, 0.95])):
        row = {**base, "rank": rank, "causality": by[rank], "causality_ci": ci, **(
            {"intervals": "trials+subjects"} if name == "lre_ranks_factual" else {}),
               "causality_by_rank": {str(k): v for k, v in by.items()}}
        capped = {**row, "relation": "d", "n_samples": F.LARGE_FILE + 1}  # uncapped: not the page's, not read
        (out / m / name).mkdir(parents=True)
        (out / m / name / "result.json").write_text(json.dumps({"per_relation": [row, capped]}))
    text = FL.rank_grid_section(out)
    assert (f"| a | {m} | 10×8 | rank 64: 0.80 [0.70, 0.90] (subjects) | rank 64: 0.80 | rank 56: 0.85 [0.75, 0.95] | "
            "rank 56: 0.85 | +0.05 | 0.000 (ranks 16, 32, 64, 128, 256) |") in text
    assert "| d |" not in text
    assert "The training facts choose the same rank on both grids on 0 of 1 relations; C at the chosen rank " \
           "differs by at most 0.05." in text
    assert FL.rank_grid_section(tmp_path / "none") == "Not run yet (`--run` makes them)."
    status = F.runs_status(out)
    row = next(r for r in status.splitlines() if r.startswith("| lre_ranks_factual |"))
    assert row == ("| lre_ranks_factual | partial (stopped or running; rerun --run to resume), 1 of 2 relations; 1 row "
                   "made with another causality cap not read | not planned | not planned |")


def test_run_has_nothing_left_to_run_on_the_shipped_lre_runs(tmp_path, lre_data):
    """The shipped LRE runs are what --run makes: resumed from docs/runs/fam, the plan of every model's LRE runs
    has no job left, so every row the page reads was made with the settings --run gives its relation (needs the
    LRE authors' data, github evandez/relations: skipped without it)."""
    root, data = Path(__file__).resolve().parents[1], lre_data
    if not (root / "docs/runs/fam").is_dir():
        pytest.skip("docs/runs/fam is absent")
    F.resume_shipped(root / "docs/runs/fam", tmp_path, data)
    left = [(f.relative_to(tmp_path), argv) for m in F.MODELS
            for name in [*(f"lre_{k}_{p}" for k in ("authors", "layers") for p in F.PARTS),
                         *(f"lre_trials24_{p}" for mm, p in F.TRIALS24 if mm == m)]
            for f, argv in F.part_jobs(tmp_path, m, name, data)]
    assert left == []
    # the rank-grid runs shipped so far (finished or not): every relation they hold or ask for with the plan's flags
    for m, part in F.RANK_GRID:
        plan = F.part_plan(m, f"lre_ranks_{part}", data)
        for f in F._part_folders(tmp_path, m, f"lre_ranks_{part}"):
            assert all(F._flags(F._lre_args(f)) == F._flags(plan[r][1]) for r in F._relation_names(f)), f


def test_the_paired_test_says_an_lre_no_better_than_a_constant_does_not_beat_it():
    """F(β*) against the constant answers as a paired test over relations: an LRE whose F equals the bias alone
    (the LRE's own constant answer) relation by relation -- however high both are -- does not beat it, although
    the two means' marginal intervals would be read as 'overlapping' either way; F a fixed 0.2 above the majority
    object on every relation beats it; a constant above F on every relation beats F."""
    rng = np.random.default_rng(0)
    rows = {}
    for m in F.MODELS:
        rows[m] = {}
        for k in range(12):
            f = float(rng.uniform(0.3, 0.9))
            rows[m][f"rel{k}"] = {"relation": f"rel{k}", "part": "factual", "faithfulness": f,
                                  "faithfulness_model_beta": f, "faithfulness_bias_only": f + rng.normal(0, 0.02),
                                  "majority_baseline": f - 0.2 if m != F.MODELS[2] else f + 0.2,
                                  "constant_token_baseline": f,
                                  "n_objects_test": 5}
    table = FL.paired_table(rows)
    line = {m: next(l for l in table.splitlines() if l.startswith(f"| {m} | 12 (own)")) for m in F.MODELS}
    assert line[F.MODELS[0]].split(" | ")[3] == "+0.00 [+0.00, +0.00], p 1.000, Holm 1.000, does not beat it"
    cell = line[F.MODELS[0]].split(" | ")[4]
    assert cell.startswith("+0.20 [+0.20, +0.20], p < 0.001, Holm ") and cell.endswith(", beats it"), cell
    assert line[F.MODELS[0]].split(" | ")[5].rstrip(" |").endswith("does not beat it"), line[F.MODELS[0]]
    assert line[F.MODELS[2]].split(" | ")[4].rstrip(" |").endswith("the constant beats it"), line[F.MODELS[2]]
    assert "12 (common)" in table


def test_holm_adjusts_every_spearman_test_of_the_page_and_partial_rho_is_reported(tmp_path):
    names = [n for n, (g, _) in F.PUBLISHED.items() if g is not None][:12]
    rows = [_row(n, lambda b, g=F.PUBLISHED[n][0]: g if b == 1.0 else 1 - g, 1.0) for n in names]
    for r, k in zip(rows, range(12)):
        r["n_objects_test"] = 3 + k
    _write(tmp_path, "smollm2-135m-instruct", rows)
    fam = FL.spearman_family(tmp_path)
    from mechfact import stats

    assert [r["p_holm"] for r in fam] == stats.holm([r["p_value"] for r in fam]) and len(fam) == 2
    assert all(r["p_holm"] >= r["p_value"] for r in fam) and fam[0]["partial_rho"] is not None
    assert "Holm" in FL.lre_table(tmp_path, "factual") and "partial rho (objects)" in FL.lre_table(tmp_path, "factual")


def test_the_layer_sweep_table_shows_the_train_chosen_layers_with_intervals_and_f_at_the_causality_layer(tmp_path):
    by_layer = [{"layer": 3, "faithfulness": 0.5, "faithfulness_train_beta": 0.6, "causality": 0.2},
                {"layer": 9, "faithfulness": 0.7, "faithfulness_train_beta": 0.8, "causality": 0.4}]
    row = {"relation": "r", "beta": 2.25, "n_test": 12, "n_trials": 8, "max_causality": 64, "layer": 9, "edit_layer": 3,
           "faithfulness_train_beta": 0.8, "faithfulness_train_beta_ci": [0.7, 0.9], "causality": 0.2,
           "causality_ci": [0.1, 0.3], "majority_baseline": 0.75, "by_layer": by_layer}
    folder = tmp_path / "smollm2-135m-instruct" / "lre_layers_factual"
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps({"per_relation": [row]}))
    line = FL.lre_sweep_table(tmp_path).splitlines()[-1]
    assert line == ("| r | smollm2-135m-instruct | 12×8, ≤64 edits/trial | 3: 0.60, 9: 0.80 | 3: 0.20, 9: 0.40 | "
                    "9: 0.80 [0.70, 0.90] / 3: 0.20 [0.10, 0.30] | 0.50 (beta 2.25) | 0.75 |")


def test_the_layer_sweep_table_puts_each_relations_models_side_by_side(tmp_path):
    by_layer = [{"layer": 3, "faithfulness": 0.5, "faithfulness_train_beta": 0.6, "causality": 0.2}]
    for m, names in (("smollm2-135m-instruct", ("a", "b")), ("gemma3-270m", ("a", "b"))):
        folder = tmp_path / m / "lre_layers_factual"
        folder.mkdir(parents=True)
        rows = [{"relation": n, "beta": 2.25, "n_test": 4, "n_trials": 8, "layer": 3, "edit_layer": 3,
                 "by_layer": by_layer} for n in names]
        (folder / "result.json").write_text(json.dumps({"per_relation": rows}))
    order = [tuple(c.strip() for c in line.split("|")[1:3]) for line in FL.lre_sweep_table(tmp_path).splitlines()[2:]]
    assert order == [("a", "smollm2-135m-instruct"), ("a", "gemma3-270m"), ("b", "smollm2-135m-instruct"),
                     ("b", "gemma3-270m")]


def test_the_24_trial_section_tests_f_against_the_best_constant_token_relation_by_relation(tmp_path):
    """From a lre_trials24 run folder: the table shows F(β*), the best constant token (with the token) and the
    majority object; per relation, the paired test at the model's beta decides (Holm over every test of the
    table): a relation where F is 0.3 above the token beats it, one where F equals it does not."""
    m, (model_beta,) = F.TRIALS24[0][0], [1.0]
    rows = []
    for name, gap in (("rel up", 0.3), ("rel flat", 0.0)):
        r = _row(name, lambda b: 0.6, model_beta)
        r.update(constant_token_baseline=0.6 - gap, constant_token_baseline_ci=[0.5 - gap, 0.7 - gap],
                 constant_token_baseline_n=20, n_trials=24,
                 trials=[{"constant_token": "univ", "skipped": False}] * 24,
                 faithfulness_vs_constant_token_by_beta={str(b): [gap, gap - 0.1 if gap else -0.05,
                                                                  gap + 0.1 if gap else 0.05,
                                                                  0.001 if gap else 1.0] for b in AUTHORS_BETAS},
                 faithfulness_vs_majority_by_beta={str(b): [0.4, 0.3, 0.5, 0.001] for b in AUTHORS_BETAS})
        rows.append(r)
    d = tmp_path / m / f"lre_trials24_{F.TRIALS24[0][1]}"
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({"per_relation": rows}))
    text = FL.trials24_section(tmp_path)
    assert "the model's beta 1.0" in text and "'univ'" in text
    up = next(l for l in text.splitlines() if l.startswith(f"| {m} | rel up |"))
    flat = next(l for l in text.splitlines() if l.startswith(f"| {m} | rel flat |"))
    assert up.split(" | ")[2].endswith(", beats it") and flat.split(" | ")[2].endswith("does not beat it")
    assert "beats the best constant first token on 1 of 2 relations" in text
    assert FL.trials24_section(tmp_path / "none") == "Not run yet (`--run` makes them)."
