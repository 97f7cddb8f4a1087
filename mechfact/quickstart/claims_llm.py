"""The claims table's rules for pretrained language models (LRE, readout, superposition): pure, as
:mod:`.claims` (plain numbers in, a :class:`~mechfact.report.Claim` row out)."""

from __future__ import annotations

from .. import stats
from ..report import HOLDS, NOT, NOT_RUN, PART, Claim, fmt
from .cells import f2, with_ci
from .claims import DECODABLE, LRE_FAITHFULNESS, not_measured

LRE_SOURCE = "Hernandez et al. (ICLR 2024)"
TRACE_SOURCE = "Meng et al. (NeurIPS 2022), causal tracing"
TRACE_PEAK = (15, 0.087)  # GPT-2 XL: the last subject token's state, average indirect effect at its peak layer
EARLY_MIDDLE = 0.6  # the last subject token's peak must lie in the first 60% of the depth
HEADS = {
    "lre": ("A relation is well approximated by an affine map of the subject state (LRE): its decoded top token "
            "matches the object", LRE_SOURCE, f"mean faithfulness {fmt(LRE_FAITHFULNESS[0])}-{fmt(LRE_FAITHFULNESS[1])} "
            "on factual relations (GPT-2-XL, GPT-J, LLaMA-13B)"),
    "readout": ("Relations are linearly decodable from the subject's hidden state (held-out subjects, per layer)",
                "paper B's LLM probing (Qwen, Llama, Phi)", "qualitative (no number quoted)"),
    "trace": ("Restoring the subject's last-token state in early-to-middle layers brings a corrupted fact back; at the "
              "last token the effect appears only in later layers", TRACE_SOURCE,
              f"GPT-2 XL: peak {TRACE_PEAK[1]:.1%} at layer {TRACE_PEAK[0]} of 48 "
              f"({TRACE_PEAK[0] / 48:.2f} of the depth) on the last subject token; total effect 18.6%"),
    "superposition": ("A subject's hidden state holds a linear superposition of its attribute vectors under several "
                      "relations", "paper B (LLM probing)", "qualitative (no number quoted)"),
}


def claim_lre(lre: dict, model: str, section: str | None = None) -> Claim:
    """Faithfulness at the fixed beta, with the interval the run reports (bootstrap over subjects; Wilson on the
    test facts when a row has none), against the paper's range; the baselines in the measured text."""
    if not lre or not lre.get("per_relation"):
        return not_measured("lre", section, HEADS)
    rows = [r for r in lre["per_relation"] if r.get("faithfulness") is not None and not r.get("degenerate")]
    lo_paper = LRE_FAITHFULNESS[0]
    if not rows:
        return Claim("LRE faithfulness", LRE_SOURCE, f"{fmt(LRE_FAITHFULNESS[0])}-{fmt(LRE_FAITHFULNESS[1])}",
                     "no relation had enough known facts", NOT, section)
    n = sum(r["n_test"] for r in rows)
    f = sum(r["faithfulness"] * r["n_test"] for r in rows) / n
    ci = rows[0].get("faithfulness_ci") if len(rows) == 1 else None
    if ci and ci[0] is not None:
        lo, hi = ci
    else:  # several relations: Wilson on the pooled test facts (k may be a mean over trials times n)
        w = stats.wilson(f * n, n)
        lo, hi = w.low, w.high

    def one(r: dict) -> str:
        base = (f", beta 0 {fmt(r['faithfulness_bias_only'])}, majority object {fmt(r['majority_baseline'])}"
                if r.get("faithfulness_bias_only") is not None and r.get("majority_baseline") is not None else "")
        rank = f"rank {r['rank']} chosen on training facts" if r.get("rank") is not None else \
            f"rank {lre.get('config', {}).get('rank')}"
        return (f"{r['relation']}: faithfulness {fmt(r['faithfulness'])} at beta {r.get('beta', 1)} fixed{base}; "
                f"causality {fmt(r.get('causality'))} at {rank} (n = {r['n_test']} test facts, "
                f"{r.get('n_trials', 1)} trial{'s' if r.get('n_trials', 1) != 1 else ''})")
    measured = "; ".join(one(r) for r in rows) + f" [{model}, layer {lre.get('layer')}]"
    if f >= lo_paper:
        v, why = HOLDS, f"faithfulness at or above the paper's range (95% interval {fmt(lo)}-{fmt(hi)})"
    elif hi >= lo_paper:
        v, why = PART, (f"below the paper's range but its 95% interval ({fmt(lo)}-{fmt(hi)}) reaches it: "
                        "too few test facts to tell")
    else:
        v, why = NOT, f"95% interval {fmt(lo)}-{fmt(hi)} below the paper's range"
    return Claim(*HEADS["lre"], measured, v, section, why)


def claim_llm_readout(probe: dict, model: str, section: str | None = None) -> Claim:
    """A relation reads out when the lower end of its held-out accuracy's 95% interval (the layer chosen on
    training subjects by nested cross-validation) lies above both its shuffled-label control (same selection)
    and its majority-object rate."""
    best = (probe or {}).get("best_layers")
    if not best:
        return not_measured("readout", section, HEADS)
    ok, txt = [], []
    for b in best:
        base = max(b["control_accuracy"], b["chance"])
        lo = (b.get("readout_accuracy_ci") or [b["readout_accuracy"]])[0]
        ok.append(lo is not None and lo > base)
        txt.append(f"{b['relation']} ({b['kind'].replace('_', '-')}): {with_ci(b, 'readout_accuracy')} at layer "
                   f"{b['best_layer']} (n {b.get('readout_accuracy_n', b.get('n_test'))}; control "
                   f"{fmt(b['control_accuracy'])}, majority {fmt(b['chance'])})")
    one = [b["relation"] for b, g in zip(best, ok) if not g and b["kind"] == "one_to_one"]
    if ok and all(ok):
        v, why = HOLDS, "every relation's 95% interval lies above its control and majority rate"
    elif any(ok):
        v, why = PART, ("read out for " + ", ".join(b["relation"] for b, g in zip(best, ok) if g) + "; not for "
                        + ", ".join(b["relation"] for b, g in zip(best, ok) if not g)
                        + (" (one-to-one: a readout learned from ~30 subjects cannot name an object it never saw; "
                           "the LRE decodes it)" if one else ""))
    else:
        v, why = NOT, "no relation's 95% interval lies above its control and majority rate"
    return Claim(*HEADS["readout"], f"[{model}] " + "; ".join(txt) + " (layer chosen on training subjects by nested cross-validation)",
                 v, section, why)


def decodable(row: dict, alpha: float = 0.01) -> list[str]:
    """Attributes whose readout beats chance and its control by ``DECODABLE`` and its label-shuffle null at
    ``alpha`` (rows without a null: the margin alone)."""
    return [k for k, d in row["decodability"].items()
            if d["accuracy"] >= max(d["control_accuracy"], d["chance"]) + DECODABLE
            and d.get("p_value", 0.0) < alpha]


def claim_llm_superposition(sup: dict, model: str, section: str | None = None) -> Claim:
    """The additive fit counts at a layer when its permutation p-value against shuffled attributes passes a
    Bonferroni threshold over the layers tested (0.05 / layers) and the lower end of its bootstrap interval is
    above 0; it holds when such a layer reaches R^2 0.3 with >= 2 attributes decodable from one state AND, at some
    layer after layer 0, the attributes explain held-out variance beyond the whole layer-0 state and token count
    (``r2_heldout_beyond_layer0``: its shuffled-null p passing the same threshold, its interval above 0): a fit that
    the layer-0 state already carries is lexical geometry, not recall. Rows without that statistic (runs made
    before it) cannot hold."""
    rows = (sup or {}).get("per_layer")
    if not rows:
        return not_measured("superposition", section, HEADS)
    thr = 0.05 / max(1, len(rows))

    def sig(r) -> bool:
        ci = r.get("r2_heldout_ci") or [None]
        return (r.get("p_value") is not None and r["p_value"] < thr and ci[0] is not None and ci[0] > 0)

    best = max(rows, key=lambda r: (sig(r), r["r2_heldout"]))
    dec = max(rows, key=lambda r: len(decodable(r)))
    names = [n.replace("countries_", "") for n in decodable(dec)]
    ci = best.get("r2_heldout_ci") or [None, None]
    pv = f", p {fmt(best['p_value'])} against {best.get('null_shuffled', {}).get('n_null', '?')} shuffles" \
        if best.get("p_value") is not None else ""
    measured = (f"[{model}] held-out R^2 {f2(best['r2_heldout'])}"
                + (f" [{f2(ci[0])}, {f2(ci[1])}]" if ci[0] is not None else "")
                + f" at layer {best['layer']}{pv} (shuffled {f2(best['control_shuffled_r2_heldout'])}, random "
                f"vectors {f2(best['control_random_features_r2_heldout'])}); decodable from the same state at layer "
                f"{dec['layer']}: {', '.join(names) or 'none'} of {len(sup['relations'])} attributes "
                f"({len(sup['subjects'])} countries, prompt {sup.get('prompt', '{}')!r})")
    g, k = best["r2_heldout"], len(names)

    def beyond(r) -> bool:
        ci = r.get("r2_heldout_beyond_layer0_ci") or [None]
        return (r["layer"] > 0 and (r.get("null_beyond_layer0") or {}).get("p_value", 1.0) < thr
                and ci[0] is not None and ci[0] > 0)
    tested = [r for r in rows if r["layer"] > 0 and "r2_heldout_beyond_layer0" in r]
    past = [r for r in tested if beyond(r)]
    if tested:
        top = max(tested, key=lambda r: r["r2_heldout_beyond_layer0"])
        measured += (f"; beyond the whole layer-0 state and token count: R^2 "
                     f"{f2(top['r2_heldout_beyond_layer0'])} at layer {top['layer']} "
                     f"(p {fmt(top['null_beyond_layer0']['p_value'])}), passing at {len(past)} of {len(tested)} "
                     f"layers after layer 0")
    if sig(best) and g >= 0.3 and k >= 2 and not past:
        v, why = PART, ("R^2 >= 0.3 beating its null with >= 2 attributes decodable, but "
                        + ("no layer's fit explains anything beyond the whole layer-0 state and token count "
                           "(p < " + fmt(thr) + ", interval above 0): lexical geometry is not excluded" if tested else
                           "this run has no test beyond the layer-0 state (made before it): lexical geometry is "
                           "not excluded"))
    elif sig(best) and g >= 0.3 and k >= 2:
        v, why = HOLDS, (f"R^2 >= 0.3 with p < {fmt(thr)} (Bonferroni over {len(rows)} layers) and an interval above 0, "
                         ">= 2 attributes decodable from one state, and beyond the whole layer-0 state at "
                         f"{len(past)} layer{'s' if len(past) != 1 else ''}")
    elif sig(best) or k >= 2:
        v, why = PART, (f"the fit beats its permutation null (p < {fmt(thr)}) with an interval above 0 but R^2 "
                        f"{f2(g)} < 0.3" if sig(best) else
                        "several attributes decodable from one state, but the additive fit is not distinguishable "
                        "from its null (Bonferroni over layers, interval above 0)")
    else:
        v, why = NOT, ("the additive fit is not distinguishable from its null at any layer, and fewer than 2 "
                       f"attributes are decodable (readout {DECODABLE} above control and chance, p < 0.01)")
    return Claim(*HEADS["superposition"], measured, v, section, why)


def claim_trace(trace: dict, section: str | None = None) -> Claim:
    """From the pooled ``state`` trace: the last subject token's peak indirect effect must be above 0 (the lower
    end of its 95% bootstrap interval over facts) in the first ``EARLY_MIDDLE`` of the depth, and the last token's
    curve must reach half its own maximum only after that peak layer."""
    s = ((trace or {}).get("pooled") or {}).get("state")
    if not s or not s.get("peak_last_subject"):
        return not_measured("trace", section, HEADS)
    n_layers, p = trace["n_layers"], s["peak_last_subject"]
    facts = f"{s['n_facts']} known fact{'' if s['n_facts'] == 1 else 's'}"
    lo = (p.get("aie_ci") or [None])[0]
    depth = max(p["layer"], 0) / n_layers
    last = [r for r in s["aie"]["last"] if r["aie"] is not None]
    top = max((r["aie"] for r in last), default=0.0)
    rise = next((r["layer"] for r in last if top > 0 and r["aie"] >= top / 2), None)
    measured = (f"[{trace['model']}, {facts}, {n_layers} layers] last subject token: peak "
                f"{with_ci(p, 'aie')} at layer {p['layer']} ({depth:.2f} of the depth); last token: half its "
                f"maximum ({fmt(top)}) from layer {rise}; total effect {with_ci(s, 'total_effect')}")
    late = rise is not None and rise > p["layer"]
    if lo is not None and lo > 0 and depth <= EARLY_MIDDLE and late:
        v, why = HOLDS, (f"the last subject token's peak is above 0 (95% interval) in the first {EARLY_MIDDLE:.0%} "
                         "of the depth, and the last token's effect rises only after it")
    elif lo is not None and lo > 0:
        v, why = PART, ("the last subject token's state restores the fact (interval above 0), but "
                        + ("its peak lies late in the depth" if depth > EARLY_MIDDLE else
                           "the last token's effect rises no later than that peak"))
    elif p["aie"] > 0:
        v, why = PART, f"the peak's 95% interval reaches 0 with {facts}: too few to tell"
    else:
        v, why = NOT, "restoring the last subject token's state restores nothing"
    return Claim(*HEADS["trace"], measured, v, section, why)


def claim_llm_skipped(reason) -> Claim:
    return Claim("LRE, readout and superposition on a pretrained model", f"{LRE_SOURCE}; paper B (LLM probing)",
                 "—", "—", NOT_RUN, "llm", f"skipped: {reason}")
