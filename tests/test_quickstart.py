import json
import re

import pytest
import torch

from mechfact.cli import main
from mechfact.report import HOLDS, NOT, NOT_FAST, NOT_RUN, PART, VERDICTS, fmt

def _claims_rows(html):
    table = re.search(r'<table id="claims-table".*?</table>', html, re.S)
    assert table, "the report has no claims table"
    return re.findall(r"<tr><td class=\"claim\">(.*?)</tr>", table.group(0), re.S)


def test_quickstart_fast_renders_claims_first_and_every_section(fast_report):
    out, stdout = fast_report
    assert str(out / "report.html") in stdout
    html = (out / "report.html").read_text()
    # the claims table comes before every section
    assert html.index('id="claims-table"') < html.index('id="memory-capacity"')
    for anchor in ("memory-capacity", "memory-scores", "memory-spectrum", "facts", "probes", "llm", "environment"):
        assert f'id="{anchor}"' in html, anchor
    assert "Skipped" not in html  # the embedded model is part of the install
    assert html.count("data:image/png;base64,") >= 12  # figures embedded, self-contained
    assert "<script" not in html
    # the papers are cited (title, authors, year), not a file readers do not have; no notes on how it was built
    refs = re.search(r'<div id="references">.*?</div>', html, re.S).group(0)
    for cite in ("Giorlandino", "Factual recall in linear associative memories", "Ravfogel",
                 "Geometric factual recall in transformers", "Hernandez", "Linearity of relation decoding", "2024",
                 "2026"):
        assert cite in refs, cite
    assert not re.search(r"SCIENCE\.md|\bissue \d|\bsession\b|of mine", html), "wording about the project's making"
    # every claim row has an allowed verdict; every link points at a section of the page
    rows = _claims_rows(html)
    assert len(rows) >= 15
    for row in rows:
        verdict = re.search(r'class="verdict v-\w+">(.*?)</span>', row).group(1)
        assert verdict in VERDICTS, verdict
        for target in re.findall(r'href="#([^"]+)"', row):
            assert f'id="{target}"' in html, target
    # no long floats anywhere in the tables (rounded to meaningful digits)
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", html)
    assert not [c for c in cells if re.search(r"\d\.\d{5,}", c)]
    assert len([c for c in cells if re.fullmatch(r"-?\d+\.\d+", c)]) > 40


def test_quickstart_claims_carry_this_runs_numbers(fast_report):
    out, _ = fast_report
    claims = json.loads((out / "claims.json").read_text())
    by = {c["source"]: c for c in claims}
    # paper A: the measured alpha_c of this run appears in the capacity claim
    cap = json.loads((out / "memory_capacity_trained" / "result.json").read_text())
    for s in cap["summary"]:
        assert f"{fmt(s['alpha_c_median'])} (d={s['d']})" in by["paper A, claim 1 (replica method)"]["measured"]
    # paper B: the geometric regime on the pool world is probed, beside the default regime on the same world
    probes = json.loads((out / "probes_quick.json").read_text())
    keys = [m["key"] for m in probes]
    assert keys[0] == "construction" and {"default-pool", "geometric-pool", "default-bijection"} <= set(keys)
    geo = next(m for m in probes if m["key"] == "geometric-pool")
    assert geo["n_attributes"] < geo["n_entities"] and geo["train_accuracy"] >= 0.99
    assert geo["zero_shot_accuracy"] >= 0.8 and geo["r2_heldout"] >= 0.85  # the mechanism, at --fast size
    assert probes[0]["zero_shot_accuracy"] >= 0.95  # the construction
    swap = by["paper B, claim 5"]
    assert f"geometric regime (pool): {fmt(geo['zero_shot_accuracy'])}" in swap["measured"]
    assert swap["verdict"] in (HOLDS, PART)
    # per-relation ablation, not an average: the construction's relation 0 is reported on its own
    html = (out / "report.html").read_text()
    con = probes[0]["ablation_on_relation"]
    assert " · ".join(fmt(float(x)) for x in con) in html
    # LLM: the LRE claim quotes this run's faithfulness; the one-to-one readout is explained where present
    lre = json.loads((out / "llm_lre" / "result.json").read_text())["per_relation"][0]
    assert f"faithfulness {fmt(lre['faithfulness'])}" in by["Hernandez et al. (ICLR 2024)"]["measured"]
    llm = json.loads((out / "llm_probe" / "result.json").read_text())
    assert all(r["n_known"] > 0 for r in llm["relations"])
    assert (out / "llm_superposition" / "result.json").is_file()
    trace = json.loads((out / "llm_trace" / "result.json").read_text())
    peak = trace["pooled"]["state"]["peak_last_subject"]
    assert f"peak {fmt(peak['aie'])}" in by["Meng et al. (NeurIPS 2022), causal tracing"]["measured"]
    assert 'id="trace"' in html and trace["pooled"]["state"]["n_facts"] == 1
    facts = json.loads((out / "facts_train" / "result.json").read_text())
    assert facts["accuracy"] >= 0.99


# ---- the verdict rules on made-up results: each can come out every way ----------------------------------------

def _cap(medians):
    return [{"d": d, "alpha_c_median": a} for d, a in medians]


def test_capacity_and_hebb_verdicts_follow_the_numbers():
    from mechfact.quickstart import claim_capacity, claim_hebb

    loose = {"alpha_inf": 0.7, "alpha_inf_se": 0.3, "ci95": [0.1, 1.3]}
    tight = {"alpha_inf": 0.52, "alpha_inf_se": 0.03, "ci95": [0.46, 0.58]}
    assert claim_capacity(_cap([(16, 0.96), (24, 0.93)]), loose).verdict == PART
    assert claim_capacity(_cap([(16, 0.96), (24, 0.93)]), tight).verdict == HOLDS
    assert claim_capacity(_cap([(16, 0.30), (24, 0.28)]), loose).verdict == NOT
    assert "0.93 (d=24)" in claim_capacity(_cap([(16, 0.96), (24, 0.93)]), loose).measured
    trained = _cap([(16, 0.96), (24, 0.93)])
    assert claim_hebb(_cap([(16, 0.05), (24, 0.08)]), {"ci95": [0.08, 0.18]}, trained).verdict == HOLDS
    assert claim_hebb(_cap([(16, 0.05), (24, 0.08)]), {"ci95": [0.3, 0.9]}, trained).verdict == PART
    assert claim_hebb(_cap([(16, 0.9), (24, 0.9)]), {"ci95": [0.08, 0.18]}, trained).verdict == NOT


def test_probe_verdicts_follow_the_numbers():
    from mechfact.quickstart import verdict_selector, verdict_superposition, verdict_zero_shot

    m = {"train_accuracy": 1.0, "r2_heldout": 0.95, "control_r2_heldout": 0.0, "zero_shot_accuracy": 0.97,
         "zero_shot_control_accuracy": 0.07, "chance": 1 / 16, "ablation_on_relation": [0.15, 0.12, 0.2, 0.1],
         "ablation_on_others": [1.0, 0.99, 1.0, 1.0], "ablation_random_on_relation": [0.95, 0.9, 0.97, 0.93],
         "n_ablated": [30, 31, 29, 33], "relation_swap_moved": [1.0, 1.0, 1.0, 1.0]}
    assert verdict_superposition(m)[0] == verdict_zero_shot(m)[0] == verdict_selector(m)[0] == HOLDS
    assert verdict_superposition({**m, "r2_heldout": 0.7})[0] == PART
    assert verdict_superposition({**m, "r2_heldout": 0.4})[0] == NOT
    assert verdict_zero_shot({**m, "zero_shot_accuracy": 0.5})[0] == PART
    assert verdict_zero_shot({**m, "zero_shot_accuracy": 0.12})[0] == NOT
    # the construction's pattern: relation 0 untouched by its ablation, 1-3 removed -> in part, not averaged away
    con = {**m, "ablation_on_relation": [1.0, 0.01, 0.0, 0.02]}
    v, why = verdict_selector(con)
    assert v == PART and "3 of 4" in why
    # a model that did not learn its facts gets no credit for a high R^2
    assert verdict_superposition({**m, "train_accuracy": 0.26})[0] == NOT


def test_llm_verdicts_follow_the_numbers():
    from mechfact.quickstart import claim_llm_readout, claim_llm_superposition, claim_lre

    lre = {"layer": 15, "config": {"rank": 64},
           "per_relation": [{"relation": "country_capital", "n_test": 40, "faithfulness": 0.7, "causality": 0.6}]}
    assert claim_lre(lre, "m").verdict == HOLDS
    lre["per_relation"][0].update(faithfulness=0.3, n_test=6)
    assert claim_lre(lre, "m").verdict == PART  # too few test facts to tell
    lre["per_relation"][0].update(faithfulness=0.05, n_test=60)
    assert claim_lre(lre, "m").verdict == NOT
    best = [{"relation": "a", "kind": "many_to_one", "best_layer": 3, "readout_accuracy": 0.9, "control_accuracy": 0.2,
             "chance": 0.3, "n_test": 10},
            {"relation": "c", "kind": "one_to_one", "best_layer": 0, "readout_accuracy": 0.0, "control_accuracy": 0.0,
             "chance": 0.03, "n_test": 10}]
    assert claim_llm_readout({"best_layers": best[:1]}, "m").verdict == HOLDS
    part = claim_llm_readout({"best_layers": best}, "m")
    assert part.verdict == PART and "one-to-one" in part.why
    # a point value 0.2 above chance whose interval reaches the baseline does not count as read out
    wide = {**best[0], "readout_accuracy": 0.55, "readout_accuracy_ci": [0.25, 0.8], "readout_accuracy_n": 10}
    assert claim_llm_readout({"best_layers": [wide]}, "m").verdict == NOT
    # the LRE claim uses the row's own interval and leaves degenerate relations out
    row = {"relation": "r", "n_test": 40, "faithfulness": 0.7, "faithfulness_ci": [0.3, 0.9], "causality": 0.5}
    assert claim_lre({"per_relation": [row]}, "m").verdict == HOLDS
    row.update(faithfulness=0.4, faithfulness_ci=[0.3, 0.5])
    assert claim_lre({"per_relation": [row]}, "m").verdict == NOT
    deg = {**row, "faithfulness": 1.0, "faithfulness_ci": [1.0, 1.0], "degenerate": True}
    assert claim_lre({"per_relation": [deg]}, "m").measured == "no relation had enough known facts"

    def layer(r2, dec, p=0.005, lo=None):
        return {"layer": 3, "r2_heldout": r2, "r2_heldout_ci": [r2 - 0.1 if lo is None else lo, r2 + 0.1],
                "r2_heldout_beyond_layer0": 0.2, "r2_heldout_beyond_layer0_ci": [0.1, 0.3],
                "null_beyond_layer0": {"p_value": 0.005},
                "p_value": p, "null_shuffled": {"n_null": 200},
                "control_shuffled_r2_heldout": 0.0, "control_random_features_r2_heldout": 0.0,
                "decodability": {f"countries_{k}": {"accuracy": a, "control_accuracy": 0.1, "chance": 0.2,
                                                    "p_value": 0.005} for k, a in dec.items()}}

    sup = {"relations": ["x"] * 5, "subjects": ["s"] * 73}
    assert claim_llm_superposition({**sup, "per_layer": [layer(0.6, {"a": 0.9, "b": 0.8})]}, "m").verdict == HOLDS
    assert claim_llm_superposition({**sup, "per_layer": [layer(0.0, {"a": 0.9, "b": 0.8})]}, "m").verdict == PART
    assert claim_llm_superposition({**sup, "per_layer": [layer(0.0, {"a": 0.5, "b": 0.3})]}, "m").verdict == NOT
    # a large R^2 whose permutation p-value does not pass, or whose interval reaches 0, does not hold
    assert claim_llm_superposition({**sup, "per_layer": [layer(0.6, {"a": 0.5}, p=0.2)]}, "m").verdict == NOT
    assert claim_llm_superposition({**sup, "per_layer": [layer(0.6, {"a": 0.5}, lo=-0.05)]}, "m").verdict == NOT
    # 20 layers: p 0.005 does not pass 0.05 / 20 (Bonferroni)
    many = [layer(0.6, {"a": 0.5}, p=0.005) for _ in range(20)]
    assert claim_llm_superposition({**sup, "per_layer": many}, "m").verdict == NOT


def test_report_rounds_numbers_and_refuses_unknown_verdicts():
    from mechfact.report import Claim

    assert fmt(0.9999999) == "1.00" and fmt(-0.00018) == "-1.8e-4" and fmt(-0.004) == "-0.004"
    assert fmt(123.456) == "123" and fmt(12.345) == "12.3" and fmt(2.2e-16) == "2.2e-16" and fmt(1 / 256) == "0.0039" and fmt(-0.0) == "0.00"
    assert fmt([0.5, 0.25]) == "0.50 / 0.25" and fmt(None) == "—" and fmt(3) == "3"
    with pytest.raises(ValueError):
        Claim("c", "s", "p", "m", "probably")
    assert {NOT_FAST, NOT_RUN} <= set(VERDICTS)


def test_quickstart_families_flag_names_unknown_models(tmp_path, capsys):
    assert main(["quickstart", "--fast", "--families", "llama-9000", "--out", str(tmp_path / "q"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--families llama-9000: unknown model" in err[0] and "gemma3-270m" in err[0], err
    assert not (tmp_path / "q" / "report.html").exists()


@pytest.mark.slow
def test_families_side_by_side_section(tmp_path):
    """With another family installed, the LLM part gains a side-by-side section: one row per model, its
    figure, and each added model's readout and superposition verdicts."""
    from mechfact.llm.models import registry
    from mechfact.quickstart import Part, _families, _installed_families

    other = "gemma3-270m"
    if other not in _installed_families(True):
        pytest.skip(f"{other} not installed: {registry.MODELS[other].install}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        part = _families(tmp_path, ["smollm2-135m-instruct", other], {}, Part([], []), device=torch.device("cpu"),
                         seed=0, fast=True)
    finally:
        torch.set_num_threads(threads)
    (sec,) = part.sections
    assert sec.anchor == "families"
    (caption, rows), = sec.tables
    assert [r["d_model"] for r in rows] == [576, 640] and [r["layers"] for r in rows] == [30, 18]
    for r in rows:  # the many-to-one relations read out far above chance in both families (--fast sizes)
        acc = [float(r[k].split(" @ ")[0]) for k in ("animal_class", "country_continent")]
        assert max(acc) >= 0.6, r
    assert (tmp_path / "figures" / "llm_families.png").stat().st_size > 10_000
    assert len(part.claims) == 4 and all(c.section == "families" for c in part.claims)


def test_sizes_default_leaves_the_slow_secondary_runs_to_full():
    """The default quickstart drops the geometric regime on the bijection world and two superposition layers;
    --full is the earlier default, size for size; --fast wins over --full."""
    from mechfact.quickstart.sizes import llm_layers, probe_models, sizes_for

    default, full, fast = sizes_for(), sizes_for(full=True), sizes_for(fast=True, full=True)
    keys = {s.mode: [m["key"] for m in probe_models(s)] for s in (default, full, fast)}
    assert keys["default"] == ["construction", "default-pool", "geometric-pool", "default-bijection"]
    assert keys["full"] == keys["default"] + ["geometric-bijection"] and keys["fast"] == keys["default"]
    assert llm_layers(30, default) == {"readout": [0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 29], "superposition": [0, 15, 29],
                                       "trace": [-1, 0, 5, 10, 15, 20, 25, 29]}
    assert llm_layers(30, full)["superposition"] == [0, 7, 15, 22, 29]
    assert llm_layers(30, full)["trace"] == list(range(-1, 30))  # --full traces every layer, 6 facts
    assert llm_layers(30, fast) == {"readout": [0, 7, 15, 22, 29], "superposition": [0, 15, 29],
                                    "trace": [-1, 0, 6, 12, 18, 24, 29]}
    assert (fast.trace_facts, default.trace_facts, full.trace_facts) == (1, 3, 6)
    # everything else is the same in the default and --full
    same = {k: v for k, v in vars(default).items() if k not in ("mode", "probe_keys", "superposition_layers",
                                                                 "trace_facts", "trace_step")}
    assert same == {k: v for k, v in vars(full).items() if k in same}
    assert fast.memory_d == (12, 16) and default.memory_d == (16, 24)
