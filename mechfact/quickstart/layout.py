"""The report's prose and tables: the intro, the references, and one builder per section that turns a part's
numbers into a :class:`~mechfact.report.Section` (text, tables, figures, config). No experiment runs here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..report import Claim, Figure, Section, fmt
from ..runs import read_json
from .cells import as_int, f2, rel
from .claims import ALPHA_HEBB, ALPHA_OPT, KS_5PCT, REFERENCES

GROUPS = {"memory": "Paper A (Giorlandino, Maillard, Goldt 2026): capacity of linear associative memories",
          "facts": "Paper B (Ravfogel, Yehudai, Bruna, Bietti 2026): geometric factual recall in one-layer transformers",
          "probes": "Paper B (Ravfogel, Yehudai, Bruna, Bietti 2026): geometric factual recall in one-layer transformers",
          "llm": "Pretrained language models: LRE (Hernandez et al. 2024) and paper B's LLM probing"}


@dataclass
class Part:
    """What one part adds to the report: its sections and its rows of the claims table."""

    sections: list[Section] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)


def intro(*, fast: bool, full: bool, seed: int, device, wall_time_s: float) -> str:
    flag = " --fast" if fast else " --full" if full else ""
    mode = ("smoke-sized: every part at its smallest size" if fast else
            "full sizes: every model and setting" if full else "quickstart sizes")
    return (f"Small versions of every mechfact experiment, run by `mechfact quickstart{flag}` "
            f"({mode}; seed {seed}; device {device}; {wall_time_s:.0f} s). The table below compares each claim "
            "of two papers (linear associative memories, paper A; geometric factual recall in one-layer "
            "transformers, paper B) and of the LLM literature with the number this run measured; each verdict "
            "follows the rule written under it and links to the section with the evidence. The papers are cited "
            "under the table. Sizes are far below the papers' (d <= 32, N <= 256): the "
            "docs/results_*.md files hold the larger studies.")


REFERENCES_NOTE = ("Claim numbers in the table (claim 1, claim 2, ...) are mechfact's own numbering of each paper's "
                   "main claims, not numbers printed in the papers.")


# ---- paper A ------------------------------------------------------------------------------------------------

def memory_capacity_section(out: Path, caps: dict) -> Section:
    rows = [{"d": s["d"], "method": s["method"], "seeds": s.get("n_seeds"), "alpha_c median": s["alpha_c_median"],
             "q25": s["alpha_c_q25"], "q75": s["alpha_c_q75"]} for m in caps for s in caps[m]["summary"]]
    fits = [{"method": m, "alpha_inf (fit a + b / ln p_c)": caps[m]["extrapolation"].get("alpha_inf"),
             "s.e.": caps[m]["extrapolation"].get("alpha_inf_se"),
             "95% interval": caps[m]["extrapolation"].get("ci95"),
             "paper": ALPHA_OPT if m == "trained" else ALPHA_HEBB} for m in caps]
    return Section(
        "Linear associative memory: perfect-recall capacity",
        "Largest p with every association recalled, by bisection over nested instances; load alpha = p ln p / d^2. "
        "The trained W (Adam on cross-entropy) against the Hebbian rule, beside the paper's 1/2 and 1/8. At these "
        "small d the finite-size capacity of the optimum is well above 1/2 (the approach is O(1/log p)); the "
        "extrapolation from two values of d is loose.",
        tables=[("alpha_c per d", rows), ("extrapolation to infinite size", fits)],
        figures=[Figure(out / f"memory_capacity_{m}" / "fig_capacity.png",
                        f"{m}: alpha_c per d and seed against the paper's line") for m in caps],
        config={m: read_json(out / f"memory_capacity_{m}" / "config.json") for m in caps}, anchor="memory-capacity")


def memory_scores_section(out: Path, sc: dict) -> Section:
    s = sc["summary"]
    quantities = [("recall accuracy", "accuracy"), ("target z, mean", "z_target_mean"), ("target z, std", "z_target_std"),
                  ("largest competitor z, mean", "z_max_competitor_mean"), ("margin z, mean", "z_margin_mean"),
                  ("margin z, min", "z_margin_min"), ("sqrt(2 ln p)", "evt_sqrt_2lnp"),
                  ("E max of p Gaussians", "expected_max_gaussian")]
    srows = [{"quantity": q, **{m: s[m].get(k) for m in s}} for q, k in quantities]
    return Section(
        "Mechanism: where the target scores sit",
        "Scores in units of each input's competitor standard deviation (z). The trained memory lifts each target just "
        "above that input's largest competitor with little spread; Hebb lifts targets with wide fluctuations that "
        "straddle the competitors' tail. At finite p the expected maximum of p Gaussians sits well below "
        "sqrt(2 ln p): compare the targets with the measured largest competitor.",
        tables=[(f"d = {sc['d']}, p = {sc['p']}, alpha = {fmt(sc['alpha'])}", srows)],
        figures=[Figure(out / "memory_scores" / "fig_scores.png", "target and largest-competitor scores, Hebb and trained")],
        config=read_json(out / "memory_scores" / "config.json"), anchor="memory-scores")


def memory_spectrum_section(out: Path, sp: dict) -> Section:
    n = len(sp["singular_values"]["trained_original"])
    return Section(
        "Spectra of W",
        f"Singular values normalised to unit mean square, pooled over seeds (n = {n}), against the quarter-circle law; "
        f"Kolmogorov-Smirnov distances, with the 5% critical value {fmt(KS_5PCT / math.sqrt(n))} as a yardstick.",
        tables=[("KS distance to the quarter circle", [{"W": k, "KS": v} for k, v in sp["ks_to_theory"].items()]),
                ("original vs decoupled problem", [{"two-sample KS(OP, DP)": sp["ks_op_vs_dp"]}])],
        figures=[Figure(out / "memory_spectrum" / "fig_spectrum.png", "singular values of W against the quarter circle")],
        config=read_json(out / "memory_spectrum" / "config.json"), anchor="memory-spectrum")


# ---- paper B: training side ---------------------------------------------------------------------------------

def facts_section(out: Path, tr: dict, co: dict, cap: dict, frozen: dict, n: int, r: int) -> Section:
    rows = [{"what": "trained (d = 16, m = 64)", "N": n, "R": r, "d": tr["d"], "accuracy": tr["accuracy"],
             "steps": tr["steps"]},
            {"what": f"construction (block size {co['block_size']})", "N": n, "R": r, "d": co["d"],
             "accuracy": co["accuracy"], "steps": 0}]
    fit = cap["summary"]["fits"].get("trainable", {}).get("r_log_n") or {}
    fitn = cap["summary"]["fits"].get("trainable", {}).get("n_facts") or {}
    return Section(
        "One-layer transformers on synthetic facts",
        "N subjects, R relations, each a random bijection; a query (s, r) must answer pi_r(s). A one-layer transformer "
        "with trainable embeddings stores N R facts at a width d far below N R; the explicit construction (subject "
        "embedding = block superposition of its R attribute vectors, relation-gated ReLU selector) needs "
        "d = R (b + 1) with b = O(log N). The threshold d* is the smallest d reaching 99% (bisection on a grid). "
        "The control freezes the entity embeddings and unembedding at their random initialisation and searches the "
        "MLP width instead (at d = 16): the MLP then has to store the facts.",
        tables=[("trained vs constructed", rows),
                ("threshold d* (smallest grid d reaching 99%)",
                 [{"N": t["subjects"], "R": t["relations"], "R ln N": t["r_log_n"], "d*": as_int(t["median_threshold"])}
                  for t in cap["summary"]["table"]]),
                ("fit of d* (least squares)", [{"against": "R ln N", "slope": fit.get("slope"),
                                                "intercept": fit.get("intercept"), "R^2": fit.get("r2")},
                                               {"against": "N R", "slope": fitn.get("slope"),
                                                "intercept": fitn.get("intercept"), "R^2": fitn.get("r2")}]),
                ("smallest MLP width m* reaching 99% at d = 16", [
                    {"embeddings": t["embeddings"], "N": t["subjects"], "R": t["relations"], "N R": t["n_facts"],
                     "m*": as_int(t["median_threshold"])} for t in frozen["summary"]["table"]],
                 "m* = 2 is the bottom of the grid (at most 2).")],
        figures=[Figure(out / "facts_train" / "fig_train.png", "training curve of the d = 16 model"),
                 Figure(out / "facts_capacity" / "fig_capacity.png", "threshold d* against R ln N"),
                 Figure(out / "facts_frozen" / "fig_capacity.png", "MLP width needed: trainable vs frozen embeddings")],
        config={"train": read_json(out / "facts_train" / "config.json"),
                "construct": read_json(out / "facts_construct" / "config.json"),
                "capacity": read_json(out / "facts_capacity" / "config.json"),
                "frozen": read_json(out / "facts_frozen" / "config.json")}, anchor="facts")


# ---- paper B: probes ----------------------------------------------------------------------------------------

def _probe_rows():
    from .claims import verdict_readout, verdict_selector, verdict_superposition, verdict_zero_shot

    return [
        ("world", lambda m: (f"pool: N = {m['n_entities']}, R = {m['n_relations']}, A = {m['n_attributes']}"
                             if m["world"] == "pool" else f"bijection: N = {m['n_entities']}, R = {m['n_relations']}")),
        ("model", lambda m: (f"explicit construction, d = {m['d']}, m = {m['mlp_width']}" if m["model"] == "construction"
                             else f"REGIMES['{m['model']}'], d = {m['d']}, m = {m['mlp_width']}, {m['steps']} steps")),
        ("train accuracy", lambda m: fmt(m["train_accuracy"])),
        ("chance (1 / candidates)", lambda m: fmt(m["chance"])),
        ("superposition: held-out R^2 (shuffled control)", lambda m: f"{f2(m['r2_heldout'])} ({f2(m['control_r2_heldout'])})"),
        ("relation-subspace overlap (0 = disjoint)", lambda m: f2(m["block_overlap_offdiag"])),
        ("readout from the embedding, held-out, per relation (control max)",
         lambda m: f"{rel(m['readout_embed_per_relation'])} ({fmt(m['readout_embed_control_max'])})"),
        ("selector units ablated, per relation", lambda m: " · ".join(str(n) for n in m["n_ablated"])),
        ("after ablating relation r's units: accuracy on r", lambda m: rel(m["ablation_on_relation"])),
        ("… on the other relations", lambda m: rel([x if x is not None else float("nan") for x in m["ablation_on_others"]])),
        ("… as many random units, on r", lambda m: rel(m["ablation_random_on_relation"])),
        ("relation-token swap r -> r+1: answer moved", lambda m: rel(m["relation_swap_moved"])),
        ("freeze-and-swap: zero-shot on new facts (control)",
         lambda m: f"{fmt(m['zero_shot_accuracy'])} ({fmt(m['zero_shot_control_accuracy'])})"),
        ("embeddings rebuilt for the original facts", lambda m: fmt(m["reconstructed_accuracy"])),
        ("retrained new / relearned original (30 steps)",
         lambda m: f"{fmt(m['retrained_accuracy'])} / {fmt(m['control_relearn_accuracy'])}"),
        ("verdict: superposition", lambda m: verdict_superposition(m)[0]),
        ("verdict: readout", lambda m: verdict_readout(m)[0]),
        ("verdict: selector", lambda m: verdict_selector(m)[0]),
        ("verdict: zero-shot swap", lambda m: verdict_zero_shot(m)[0]),
    ]


def probe_section(models: list[dict], figs: Path, *, pool_world: dict, seed: int) -> Section:
    spec_rows = _probe_rows()
    pool = [m for m in models if m["world"] == "pool"]
    bij = [m for m in models if m["world"] == "bijection"]
    n, nr, na = pool_world["n"], pool_world["relations"], pool_world["attributes"]
    tables = []
    for caption, group in ((f"attribute-pool world (N = {n}, R = {nr}, A = {na}): the construction and both regimes "
                            "side by side", pool),
                           (f"bijection world (N = {n}, R = {nr}, every relation a permutation)", bij)):
        tables.append((caption, [{"probe": name, **{m["label"]: f(m) for m in group}} for name, f in spec_rows],
                       "Per-relation numbers in relation order 0 · 1 · 2 · 3. Verdict rules: in the claims table."))
    by = {m["key"]: m for m in models}
    geo, dflt, con = by.get("geometric-pool"), by.get("default-pool"), by.get("construction")
    bdef, bgeo = by.get("default-bijection"), by.get("geometric-bijection")
    text = [
        "The same probe code runs on every model. Superposition: each subject embedding regressed on its R attribute "
        "vectors (the unembedding columns of its R answers), R^2 on held-out subjects against a shuffled-facts "
        "control. Readout: a linear map from the subject embedding to the attribute vector, decoded as the nearest "
        "attribute, on held-out subjects. Selector: the MLP units most active for one relation are zeroed; accuracy "
        "on that relation, on the others, and with as many random units. Relation swap: the relation token's "
        "embedding replaced by another relation's; the answer should move to that relation's attribute. "
        "Freeze-and-swap: new random facts written into the subject embeddings through the fitted maps, the "
        "network untouched; zero-shot accuracy against embeddings built for an unrelated world.",
        f"Two training regimes on the SAME attribute-pool world (each relation maps the {n} subjects into a "
        f"shared pool of {na} attributes): the default (REGIMES['plain']: cross-entropy, Adam, "
        "stopped at 100%) and the geometric regime of docs/results_probes.md (REGIMES['geometric']: squared loss on "
        "the logits, coupled L2 1e-3, subject embeddings initialised at 0; here trained for "
        f"{geo['steps'] if geo else '—'} of its 3000 steps to fit the quickstart's time).",
    ]
    if geo and dflt:
        text.append(
            f"Measured here: the geometric regime's held-out superposition R^2 is {f2(geo['r2_heldout'])} and its "
            f"zero-shot freeze-and-swap {fmt(geo['zero_shot_accuracy'])} (control "
            f"{fmt(geo['zero_shot_control_accuracy'])}, chance {fmt(geo['chance'])}); the default regime's are "
            f"{f2(dflt['r2_heldout'])} and {fmt(dflt['zero_shot_accuracy'])} on the same world.")
    if con:
        text.append(
            "Selector ablation per relation, not averaged: in the construction, relation 0's block is also read by "
            "the unembedding through the residual stream (the subject's own block 0 reaches the answer position), so "
            f"ablating relation 0's units leaves it at {fmt(con['ablation_on_relation'][0])} by design, while relations "
            f"1-3 drop to {rel(con['ablation_on_relation'][1:])} (others stay at "
            f"{rel(con['ablation_on_others'][1:])}).")
    if bdef:
        bits = (f"The bijection world (every relation a permutation of the {bdef['n_entities']} subjects, so chance is "
                f"1/{bdef['n_entities']}) is the setting paper B describes; docs/results_probes.md reports no regime "
                f"that transfers there. In this run the default regime learns it (train accuracy "
                f"{fmt(bdef['train_accuracy'])}) with held-out R^2 {f2(bdef['r2_heldout'])} and zero-shot "
                f"{fmt(bdef['zero_shot_accuracy'])}")
        if bgeo:
            bits += (f"; the geometric regime reaches train accuracy {fmt(bgeo['train_accuracy'])} at this L2 (so its "
                     "probes describe a model that did not learn its facts)")
        else:
            bits += ("; the geometric regime on the bijection world (which does not learn it in 1000 steps) runs "
                     "with `mechfact quickstart --full`")
        text.append(bits + ".")
    return Section("Probes on one-layer models: two regimes, two worlds", "\n\n".join(text), tables=tables,
                   figures=[Figure(figs / "probe_regimes.png", "headline probes per model (chance: grey ticks)"),
                            Figure(figs / "probe_ablation.png", "selector ablation per relation, one panel per model")],
                   config={"models": [{k: m.get(k) for k in ("key", "world", "model", "d", "mlp_width", "steps",
                                                             "loss", "l2", "wall_time_s")} for m in models],
                           "world": pool_world, "seed": seed, "freeze_and_swap_retrain_steps": 30}, anchor="probes")
