"""The claims table's rules (mechfact.quickstart.claims, .claims_llm) on made-up numbers.

For every rule: numbers where the claim holds, holds in part, does not hold, and is not measured, with the
verdict string asserted. The cases sit on both sides of each threshold (often just either side), so a rule whose
comparison is inverted, or whose bar moves past a case, fails here. No model, no file: the rules are pure.
"""

import math

import pytest

from mechfact.quickstart import claims as C
from mechfact.quickstart import claims_llm as L
from mechfact.report import HOLDS, NOT, NOT_FAST, NOT_RUN, PART, UNDECIDED

# ---- paper A ------------------------------------------------------------------------------------------------


def _cap(medians):
    return [{"d": d, "alpha_c_median": a} for d, a in medians]


TIGHT = {"alpha_inf": 0.52, "alpha_inf_se": 0.03, "ci95": [0.46, 0.58]}
LOOSE = {"alpha_inf": 0.7, "alpha_inf_se": 0.3, "ci95": [0.1, 1.3]}


@pytest.mark.parametrize("medians, extrap, verdict", [
    ([(16, 0.96), (24, 0.93)], TIGHT, HOLDS),  # above 1/2, falling, interval holds 1/2 within ±0.1
    ([(16, 0.96), (24, 0.93)], LOOSE, PART),  # ... but the interval is loose
    ([(16, 0.80), (24, 0.93)], TIGHT, PART),  # rising with d
    ([(16, 0.30), (24, 0.28)], TIGHT, NOT),  # below 1/2
    ([(16, 0.44), (24, 0.44)], TIGHT, NOT),  # just below 1/2 - 0.05
    ([], TIGHT, NOT_RUN),
])
def test_capacity(medians, extrap, verdict):
    c = C.claim_capacity(_cap(medians), extrap, "memory-capacity")
    assert c.verdict == verdict, c.why
    if medians:
        assert f"(d={medians[-1][0]})" in c.measured


@pytest.mark.parametrize("hebb, ci, verdict", [
    ([(16, 0.05), (24, 0.08)], [0.08, 0.18], HOLDS),  # far below the optimum, interval holds 1/8
    ([(16, 0.05), (24, 0.08)], [0.3, 0.9], PART),  # not pinned
    ([(16, 0.05), (24, 0.08)], [0.0, 0.4], PART),  # holds 1/8 but wider than ±0.1
    ([(16, 0.9), (24, 0.9)], [0.08, 0.18], NOT),  # not below half the trained memory's
    ([(16, 0.47), (24, 0.47)], [0.08, 0.18], NOT),  # just above half (0.96 / 2, 0.93 / 2)
    ([], [0.08, 0.18], NOT_RUN),
])
def test_hebb(hebb, ci, verdict):
    trained = _cap([(16, 0.96), (24, 0.93)])
    assert C.claim_hebb(_cap(hebb), {"ci95": ci}, trained).verdict == verdict


def _scores(t_std=0.3, h_std=1.0, acc=1.0, margin=0.2):
    t = {"z_target_mean": 3.0, "z_target_std": t_std, "z_max_competitor_mean": 2.7, "z_margin_min": margin,
         "accuracy": acc}
    h = {"z_target_mean": 3.0, "z_target_std": h_std, "z_max_competitor_mean": 2.7}
    return {"trained": t, "hebb": h}


@pytest.mark.parametrize("summary, verdict", [
    (_scores(), HOLDS),
    (_scores(t_std=0.5), HOLDS),  # exactly half Hebb's spread
    (_scores(t_std=0.6), PART),  # above every competitor, spread like Hebb's
    (_scores(margin=-0.1), PART),  # low spread, one target below its competitor
    (_scores(acc=0.98), PART),
    (_scores(t_std=0.9, margin=-0.1), NOT),
    ({}, NOT_RUN),
])
def test_scores(summary, verdict):
    c = C.claim_scores(summary, p=100, d=32)
    assert c.verdict == verdict, c.why


def _spectrum(trained, init, hebb, n=96, dp=None):
    return {"ks_to_theory": {"trained_original": trained, "init": init, "hebb": hebb},
            "singular_values": {"trained_original": [1.0] * n, "trained_decoupled": [1.0] * n},
            "ks_op_vs_dp": dp}


CRIT96 = C.KS_5PCT / math.sqrt(96)  # 0.139


@pytest.mark.parametrize("sp, verdict", [
    (_spectrum(0.05, 0.3, 0.4), HOLDS),
    (_spectrum(CRIT96 - 0.01, CRIT96 + 0.01, CRIT96 + 0.01), HOLDS),
    (_spectrum(0.05, 0.05, 0.4), PART),  # init within the critical value too
    (_spectrum(0.05, 0.3, 0.05), PART),
    (_spectrum(CRIT96 + 0.01, 0.3, 0.4), NOT),
    ({"ks_to_theory": {}, "singular_values": {}}, NOT_RUN),
])
def test_spectrum(sp, verdict):
    assert C.claim_spectrum(sp).verdict == verdict


@pytest.mark.parametrize("ks, verdict", [
    (0.05, HOLDS), (C.KS_5PCT * math.sqrt(2 / 96) - 0.01, HOLDS),
    (C.KS_5PCT * math.sqrt(2 / 96) + 0.01, NOT), (0.5, NOT),
    (None, NOT_RUN),
])
def test_op_dp_has_no_partial_verdict(ks, verdict):
    """One two-sample test: holds or not (the 'in part' case does not exist for this rule)."""
    assert C.claim_op_dp(_spectrum(0.05, 0.3, 0.4, dp=ks)).verdict == verdict


# ---- paper B: training side ---------------------------------------------------------------------------------

def _dstar(thresholds, r2=0.95, r2_nr=0.5, slope=1.5):
    table = [{"subjects": n, "relations": r, "r_log_n": r * math.log(n), "median_threshold": t}
             for (n, r), t in thresholds.items()]
    return {"table": table, "fits": {"trainable": {"r_log_n": {"slope": slope, "intercept": 1.0, "r2": r2},
                                                   "n_facts": {"slope": 0.01, "intercept": 3.0, "r2": r2_nr}}}}


THREE = {(64, 1): 4.0, (64, 2): 8.0, (128, 4): 16.0}


@pytest.mark.parametrize("summary, fast, verdict", [
    # a line in R ln N that fits is consistent with the law, never its proof: the law is decided held out over
    # three or more N at converged thresholds (the pool page), so a small run says "undecided", whichever fits best
    (_dstar(THREE), False, UNDECIDED),
    (_dstar(THREE, r2=0.81, r2_nr=0.8), False, UNDECIDED),
    (_dstar(THREE, r2=0.79), False, UNDECIDED),  # the line fits loosely
    (_dstar(THREE, r2=0.9, r2_nr=0.95), False, UNDECIDED),  # N R fits better
    (_dstar(THREE, slope=-1.0), False, NOT),  # d* falls with R ln N
    (_dstar(THREE, r2=0.4), False, NOT),
    (_dstar({(64, 1): 4.0, (64, 2): 4.0, (128, 4): 4.0}), False, NOT),  # d* does not change
    (_dstar({(64, 1): 4.0, (64, 2): 6.0}), True, NOT_FAST),  # two settings: not resolved at --fast sizes
    ({"table": [], "fits": {}}, False, NOT_RUN),
])
def test_dstar(summary, fast, verdict):
    c = C.claim_dstar(summary, fast=fast)
    assert c.verdict == verdict
    # the fit is quoted only where d* varies
    varies = len({t["median_threshold"] for t in summary["table"]}) > 1
    assert ("fit d* =" in c.measured) == varies, c.measured


def _frozen(pairs):
    table = []
    for (n, r), (a, b) in pairs.items():
        table += [{"subjects": n, "relations": r, "embeddings": "trainable", "median_threshold": a},
                  {"subjects": n, "relations": r, "embeddings": "frozen", "median_threshold": b}]
    return {"table": table}


@pytest.mark.parametrize("pairs, verdict", [
    ({(64, 2): (2.0, 32.0), (64, 4): (2.0, 64.0)}, HOLDS),  # >= 4x trainable everywhere, growing with N R
    ({(64, 2): (2.0, 8.0), (64, 4): (2.0, 16.0)}, HOLDS),  # exactly 4x
    ({(64, 2): (2.0, 32.0), (64, 4): (2.0, 32.0)}, PART),  # not growing
    ({(64, 2): (2.0, 4.0), (64, 4): (2.0, 64.0)}, PART),  # 4x in one setting only
    ({(64, 2): (2.0, 7.0), (64, 4): (4.0, 8.0)}, NOT),  # never 4x
    ({}, NOT_RUN),
])
def test_frozen(pairs, verdict):
    assert C.claim_frozen(_frozen(pairs)).verdict == verdict


@pytest.mark.parametrize("acc, verdict", [(1.0, HOLDS), (0.99, HOLDS), (0.98, NOT), (0.2, NOT), (None, NOT_RUN)])
def test_construction_has_no_partial_verdict(acc, verdict):
    assert C.claim_construction({"accuracy": acc, "d": 24, "block_size": 5}, 128, 4).verdict == verdict


# ---- paper B: probes, per model -----------------------------------------------------------------------------

M = {"model": "geometric", "label": "m", "train_accuracy": 1.0, "r2_heldout": 0.95, "control_r2_heldout": 0.0,
     "readout_embed_min": 0.95, "zero_shot_accuracy": 0.97, "zero_shot_control_accuracy": 0.07, "chance": 1 / 16,
     "ablation_on_relation": [0.15, 0.12, 0.2, 0.1], "ablation_on_others": [1.0, 0.99, 1.0, 1.0],
     "ablation_random_on_relation": [0.95, 0.9, 0.97, 0.93], "n_ablated": [30, 31, 29, 33],
     "relation_swap_moved": [1.0, 1.0, 1.0, 1.0], "readout_embed_per_relation": [0.95, 0.96, 0.97, 0.98]}


@pytest.mark.parametrize("over, verdict", [
    ({}, HOLDS), ({"r2_heldout": 0.91}, HOLDS),
    ({"r2_heldout": 0.89}, PART), ({"r2_heldout": 0.61}, PART),
    ({"control_r2_heldout": 0.3}, PART),  # R^2 high but so is its control
    ({"r2_heldout": 0.59}, NOT),
    ({"train_accuracy": 0.26}, NOT),  # a model that did not learn gets no credit for a high R^2
    ({"r2_heldout": None}, NOT_RUN),
])
def test_verdict_superposition(over, verdict):
    assert C.verdict_superposition({**M, **over})[0] == verdict


@pytest.mark.parametrize("over, verdict", [
    ({}, HOLDS), ({"readout_embed_min": 0.9}, HOLDS),
    ({"readout_embed_min": 0.89}, PART), ({"readout_embed_min": 0.3}, PART),
    ({"readout_embed_min": 0.29}, NOT), ({"train_accuracy": 0.5}, NOT),
    ({"readout_embed_min": None}, NOT_RUN),
])
def test_verdict_readout(over, verdict):
    assert C.verdict_readout({**M, **over})[0] == verdict


@pytest.mark.parametrize("over, verdict, why", [
    ({}, HOLDS, "every relation selective"),
    ({"relation_swap_moved": [1.0, 0.8, 1.0, 1.0]}, PART, "4 of 4"),  # selective, but a swap does not move
    ({"ablation_on_relation": [1.0, 0.01, 0.0, 0.02]}, PART, "3 of 4"),  # the construction's pattern
    ({"ablation_on_relation": [0.51, 0.12, 0.2, 0.1]}, PART, "3 of 4"),  # relation 0 above half the others' 1.0
    ({"ablation_on_relation": [0.8, 0.8, 0.8, 0.8]}, NOT, "no relation"),  # not below the random units - 0.2
    ({"ablation_on_others": [0.5, 0.5, 0.5, 0.5]}, NOT, "no relation"),  # the others collapse too
    ({"n_ablated": [0, 0, 0, 0]}, NOT, "no relation"),
    ({"n_ablated": None}, NOT_RUN, "not measured"),
])
def test_verdict_selector(over, verdict, why):
    v, text = C.verdict_selector({**M, **over})
    assert v == verdict and why in text, text


def test_selective_thresholds_either_side():
    base = {**M, "ablation_on_relation": [0.5], "ablation_on_others": [1.0], "ablation_random_on_relation": [0.75],
            "n_ablated": [10]}
    assert C.selective(base) == [True]  # exactly half the others, 0.25 below random
    assert C.selective({**base, "ablation_on_relation": [0.51]}) == [False]
    assert C.selective({**base, "ablation_random_on_relation": [0.69]}) == [False]
    assert C.selective({**base, "ablation_on_others": [0.89], "ablation_on_relation": [0.1]}) == [False]


@pytest.mark.parametrize("over, verdict", [
    ({}, HOLDS), ({"zero_shot_accuracy": 0.8}, HOLDS),
    ({"zero_shot_accuracy": 0.79}, PART), ({"zero_shot_accuracy": 0.31, "zero_shot_control_accuracy": 0.1}, PART),
    ({"zero_shot_control_accuracy": 0.5}, NOT),  # high zero-shot, but so is its control: < 3x control
    ({"zero_shot_accuracy": 0.29}, NOT), ({"zero_shot_accuracy": 0.12}, NOT),
    ({"zero_shot_accuracy": None}, NOT_RUN),
])
def test_verdict_zero_shot(over, verdict):
    assert C.verdict_zero_shot({**M, **over})[0] == verdict


# ---- paper B: probes, one claim over the trained models ------------------------------------------------------

CON = {**M, "model": "construction", "label": "construction", "r2_heldout": 0.1}  # never counted


@pytest.mark.parametrize("models, verdict", [
    ([CON, {**M, "label": "a"}, {**M, "label": "b"}], HOLDS),  # every trained model
    ([CON, {**M, "label": "a"}, {**M, "label": "b", "r2_heldout": 0.4}], PART),  # some
    ([CON, {**M, "label": "a", "r2_heldout": 0.7}], PART),  # in part in one
    ([CON, {**M, "label": "a", "r2_heldout": 0.4}, {**M, "label": "b", "train_accuracy": 0.3}], NOT),
    ([CON], NOT_RUN),  # no trained model
    ([CON, {**M, "label": "a", "r2_heldout": None}], NOT_RUN),
])
def test_probe_claims_aggregate_over_trained_models(models, verdict):
    rows = C.probe_claims(models, "probes")
    assert rows[0].source == "paper B, claim 2" and rows[0].verdict == verdict, rows[0].why
    assert "construction" not in rows[0].measured
    for m in models[1:]:  # a model that did not learn its facts is named as such, not quoted
        assert (f"{m['label']}: did not learn" in rows[0].measured) == (m["train_accuracy"] < C.LEARNED)
    assert all(r.section == "probes" for r in rows)


# ---- pretrained models ----------------------------------------------------------------------------------------

def _lre(f, n, ci=None, **over):
    row = {"relation": "country_capital", "n_test": n, "faithfulness": f, "causality": 0.5, **over}
    if ci is not None:
        row["faithfulness_ci"] = ci
    return {"layer": 15, "config": {"rank": 64}, "per_relation": [row]}


@pytest.mark.parametrize("lre, verdict", [
    (_lre(0.7, 40), HOLDS), (_lre(0.55, 40, [0.4, 0.7]), HOLDS),  # at the paper's lower end
    (_lre(0.54, 40, [0.4, 0.7]), PART),  # below, its interval reaches the range
    (_lre(0.3, 6), PART),  # Wilson on 6 facts reaches 0.55
    (_lre(0.4, 40, [0.3, 0.54]), NOT), (_lre(0.05, 60), NOT),
    (_lre(1.0, 40, [1.0, 1.0], degenerate=True), NOT),  # no relation with enough known facts
    ({"per_relation": []}, NOT_RUN), (None, NOT_RUN),
])
def test_lre(lre, verdict):
    c = L.claim_lre(lre, "m")
    assert c.verdict == verdict, c.why
    assert c.source == "Hernandez et al. (ICLR 2024)"


def _best(relation, kind, acc, control, chance, ci=None):
    b = {"relation": relation, "kind": kind, "best_layer": 3, "readout_accuracy": acc, "control_accuracy": control,
         "chance": chance, "n_test": 10}
    if ci is not None:
        b.update(readout_accuracy_ci=ci, readout_accuracy_n=10)
    return b


@pytest.mark.parametrize("best, verdict", [
    ([_best("a", "many_to_one", 0.9, 0.2, 0.3, [0.6, 0.98])], HOLDS),
    ([_best("a", "many_to_one", 0.9, 0.2, 0.3, [0.31, 0.98])], HOLDS),  # interval just above the majority rate
    ([_best("a", "many_to_one", 0.9, 0.2, 0.3, [0.6, 0.98]), _best("c", "one_to_one", 0.0, 0.0, 0.03, [0.0, 0.28])],
     PART),
    ([_best("a", "many_to_one", 0.55, 0.2, 0.3, [0.29, 0.8])], NOT),  # interval reaches the majority rate
    ([_best("a", "many_to_one", 0.55, 0.4, 0.3, [0.39, 0.8])], NOT),  # ... or the control
    ([], NOT_RUN),
])
def test_llm_readout(best, verdict):
    c = L.claim_llm_readout({"best_layers": best}, "m")
    assert c.verdict == verdict, c.why
    if verdict == PART:
        assert "one-to-one" in c.why


def _layer(r2, dec, p=0.005, lo=None, dec_p=0.005, beyond=(0.2, 0.005, 0.05)):
    """``beyond``: (R^2 beyond the whole layer-0 state, its null p, the lower end of its interval), or None."""
    extra = {} if beyond is None else {"r2_heldout_beyond_layer0": beyond[0], "null_beyond_layer0": {"p_value": beyond[1]},
                                       "r2_heldout_beyond_layer0_ci": [beyond[2], beyond[0] + 0.1]}
    return {**extra, "layer": 3, "r2_heldout": r2, "r2_heldout_ci": [r2 - 0.1 if lo is None else lo, r2 + 0.1],
            "p_value": p, "null_shuffled": {"n_null": 200}, "control_shuffled_r2_heldout": 0.0,
            "control_random_features_r2_heldout": 0.0,
            "decodability": {f"countries_{k}": {"accuracy": a, "control_accuracy": 0.1, "chance": 0.2,
                                                "p_value": dec_p} for k, a in dec.items()}}


SUP = {"relations": ["x"] * 5, "subjects": ["s"] * 73}


@pytest.mark.parametrize("layers, verdict", [
    ([_layer(0.6, {"a": 0.9, "b": 0.8})], HOLDS),
    ([_layer(0.3, {"a": 0.36, "b": 0.35})], HOLDS),  # R^2 at 0.3, readouts 0.15 above chance
    # the same fit that the layer-0 state already carries (nothing beyond it), or a run without that test
    ([_layer(0.6, {"a": 0.9, "b": 0.8}, beyond=(0.01, 0.4, -0.02))], PART),
    ([_layer(0.6, {"a": 0.9, "b": 0.8}, beyond=(0.2, 0.005, -0.01))], PART),
    ([_layer(0.6, {"a": 0.9, "b": 0.8}, beyond=None)], PART),
    ([_layer(0.29, {"a": 0.9, "b": 0.8})], PART),  # significant fit, R^2 below 0.3
    ([_layer(0.6, {"a": 0.9, "b": 0.8}, p=0.2)], PART),  # decodable, fit not beating its null
    ([_layer(0.0, {"a": 0.9, "b": 0.8}, lo=-0.05)], PART),
    ([_layer(0.6, {"a": 0.34, "b": 0.9}, p=0.2)], NOT),  # one attribute decodable, fit not significant
    ([_layer(0.6, {"a": 0.9, "b": 0.8}, p=0.2, dec_p=0.02)], NOT),  # readouts not beating their null
    ([_layer(0.6, {"a": 0.5}, lo=-0.05)], NOT),
    ([_layer(0.6, {"a": 0.5}, p=0.005) for _ in range(20)], NOT),  # p 0.005 does not pass 0.05 / 20
    ([], NOT_RUN),
])
def test_llm_superposition(layers, verdict):
    c = L.claim_llm_superposition({**SUP, "per_layer": layers}, "m")
    assert c.verdict == verdict, c.why


def _trace(subj: dict, last: dict, lo: float = 0.05, n_layers: int = 30):
    """A pooled state trace: AIE per layer of the last subject token and of the last token (the peak's lower
    95% bound ``lo``)."""
    layers = sorted(set(subj) | set(last))

    def rows(curve):
        return [{"layer": l, "aie": curve.get(l), "aie_ci": [lo, 0.9], "aie_n": 5} for l in layers]
    peak = max(subj, key=subj.get)
    return {"model": "m", "n_layers": n_layers, "pooled": {"state": {
        "n_facts": 5, "total_effect": 0.5, "total_effect_ci": [0.4, 0.6],
        "peak_last_subject": {"layer": peak, "aie": subj[peak], "aie_ci": [lo, 0.9]},
        "aie": {"last_subject": rows(subj), "last": rows(last)}}}}


EARLY = {-1: 0.1, 5: 0.2, 10: 0.3, 20: 0.05, 29: 0.0}
LATE_LAST = {-1: 0.0, 5: 0.0, 10: 0.05, 20: 0.4, 29: 0.5}


@pytest.mark.parametrize("trace, verdict", [
    (_trace(EARLY, LATE_LAST), HOLDS),  # peak at 10 of 30, the last token rises from 20
    (_trace({**EARLY, 18: 0.31}, LATE_LAST), HOLDS),  # peak at 18 of 30: 0.60 of the depth, at the bar
    (_trace({**EARLY, 19: 0.31}, {**LATE_LAST, 19: 0.0}), PART),  # peak at 19 of 30: past 60% of the depth
    (_trace(EARLY, {**LATE_LAST, 10: 0.3}), PART),  # the last token rises at the peak layer itself
    (_trace(EARLY, LATE_LAST, lo=-0.01), PART),  # the peak's interval reaches 0: too few facts
    (_trace({-1: -0.01, 10: -0.02}, LATE_LAST, lo=-0.05), NOT),  # nothing restored at the subject
    ({}, NOT_RUN),
])
def test_trace(trace, verdict):
    c = L.claim_trace(trace, "trace")
    assert c.verdict == verdict, c.why


def test_skipped_and_not_run_rows_cite_no_file():
    for c in (L.claim_llm_skipped("no model"), C.claim_rank_not_run(), C.claim_multihop_not_run()):
        assert c.verdict == NOT_RUN and "SCIENCE" not in c.source
    assert set(C.REFERENCES) == {"paper A", "paper B", "Hernandez et al. 2024", "Meng et al. 2022"}
    for ref in C.REFERENCES.values():
        assert any(str(y) in ref for y in (2022, 2024, 2026)) and "." in ref
