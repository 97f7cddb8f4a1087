"""Fault cases: bad values of every numeric flag, absurd sizes, diverging trainings (see faults_common.py).

Every bad value (NaN, inf, negative, zero, absurd, a wrong choice) is refused by the config dataclasses before
anything is written: exit 2 with one line naming the flag. Absurd sizes are refused up front by a memory
estimate (``--max-memory 4`` makes the outcome the same on any machine). A training whose loss becomes NaN / inf
stops with "training diverged" and names the learning-rate flag. In every case nothing is left in ``--out``.
"""

from __future__ import annotations

from pathlib import Path

from faults_common import Case

BAD, SIZES, TRAINING = "bad values", "sizes", "training"
FACT = "{tmp}/fact"  # a tiny fact-model run directory (made by _fact_model)
LLM = ["--model", "{model}", "--relations", "{relations}"]


def nothing_written(paths: dict) -> None:
    """The refused command left no run behind: no config.json, result.json, meta.json or checkpoint."""
    out = Path(paths["out"])
    left = [f for f in ("config.json", "result.json", "meta.json", "checkpoint.pt") if (out / f).exists()]
    assert not left, f"{out}: a refused run wrote {left}"


def _fact_model(paths: dict) -> None:
    """A tiny explicit construction (16 subjects, 2 relations, world seed 0) saved as a fact run directory."""
    from mechfact.facts import FactWorld, build_single_hop
    from mechfact.facts.runio import save_fact_run

    world = FactWorld(16, 2, seed=0)
    save_fact_run(paths["tmp"] + "/fact", build_single_hop(world, 8), world)


def _case(group: str, name: str, argv: list[str], needle: str, setup=None, exit: int = 2) -> Case:
    return Case(name, [*argv, "--out", "{out}", "--quiet"], exit, needle, setup=setup, check=nothing_written,
                group=group)


def _bad(name: str, argv: list[str], needle: str, setup=None) -> Case:
    return _case(BAD, name, argv, needle, setup)


def _size(name: str, argv: list[str], needle: str) -> Case:
    return _case(SIZES, name, [*argv, "--max-memory", "4"], needle)


def _probe(kind: str, name: str, extra: list[str], needle: str) -> Case:
    return _bad(name, ["probe", kind, "--model", FACT, *extra], needle, setup=_fact_model)


TINY_MEMORY = ["--d", "8", "--points", "2", "--seeds", "1", "--alpha-min", "0.8", "--alpha-max", "1.0"]
TINY_FACTS = ["--subjects", "8", "--relations", "1", "--d", "4", "--mlp-width", "4"]

CASES: list[Case] = [
    # ---- memory ---------------------------------------------------------------------------------------------
    _bad("memory sweep: NaN learning rate", ["memory", "sweep", "--lr", "nan"], "--lr"),
    _bad("memory sweep: infinite learning rate", ["memory", "sweep", "--lr", "inf"], "--lr"),
    _bad("memory sweep: negative learning rate", ["memory", "sweep", "--lr", "-1"], "--lr -1"),
    _bad("memory sweep: zero learning rate", ["memory", "sweep", "--lr", "0"], "--lr 0"),
    _bad("memory sweep: absurd learning rate", ["memory", "sweep", "--lr", "1e38"], "--lr 1e+38"),
    _bad("memory sweep: rank fraction above 1", ["memory", "sweep", "--kappa", "1.5"], "--kappa 1.5"),
    _bad("memory sweep: NaN rank fraction", ["memory", "sweep", "--kappa", "nan"], "--kappa"),
    _bad("memory sweep: negative load", ["memory", "sweep", "--alpha-min", "-0.1"], "--alpha-min -0.1"),
    _bad("memory sweep: zero dimension", ["memory", "sweep", "--d", "0"], "--d 0"),
    _bad("memory sweep: zero points", ["memory", "sweep", "--points", "0"], "--points 0"),
    _bad("memory sweep: absurd number of points", ["memory", "sweep", "--points", "100000000"], "--points 100000000"),
    _bad("memory sweep: absurd step budget", ["memory", "sweep", "--steps", "100000000000000000000"], "--steps"),
    _bad("memory sweep: negative patience", ["memory", "sweep", "--patience", "-1"], "--patience -1"),
    _bad("memory sweep: negative active set", ["memory", "sweep", "--active-set", "-1"], "--active-set -1"),
    _bad("memory sweep: unknown loss", ["memory", "sweep", "--loss", "mse"], "--loss"),
    _bad("memory sweep: unknown method", ["memory", "sweep", "--method", "magic"], "--method"),
    _bad("memory sweep: negative memory limit", ["memory", "sweep", "--max-memory", "-1"], "--max-memory -1"),
    _bad("memory sweep: absurd seed", ["memory", "sweep", "--seed", "100000000000000000000"],
         "--seed 100000000000000000000"),
    _bad("memory sweep: NaN memory limit", ["memory", "sweep", "--max-memory", "nan"], "--max-memory"),
    _bad("memory capacity: relative tolerance above 0.5", ["memory", "capacity", "--rel-tol", "0.7"], "--rel-tol 0.7"),
    _bad("memory capacity: NaN relative tolerance", ["memory", "capacity", "--rel-tol", "nan"], "--rel-tol"),
    _bad("memory capacity: infinite upper bracket", ["memory", "capacity", "--alpha-hi", "inf"], "--alpha-hi"),
    _bad("memory capacity: zero seeds", ["memory", "capacity", "--seeds", "0"], "--seeds 0"),
    _bad("memory capacity: exact LP beyond its size", ["memory", "capacity", "--method", "separable", "--d", "200"],
         "--method separable with --d 200"),
    _bad("memory scores: zero load", ["memory", "scores", "--alpha", "0"], "--alpha 0"),
    _bad("memory scores: NaN load", ["memory", "scores", "--alpha", "nan"], "--alpha"),
    _bad("memory spectrum: zero seeds", ["memory", "spectrum", "--seeds", "0"], "--seeds 0"),
    _bad("memory spectrum: negative rank fraction", ["memory", "spectrum", "--kappa", "-0.5"], "--kappa -0.5"),
    _bad("memory rank: a zero rank fraction", ["memory", "rank", "--kappas", "0.5", "0"], "--kappas 0"),
    # ---- facts ----------------------------------------------------------------------------------------------
    _bad("facts train: NaN learning rate", ["facts", "train", "--lr", "nan"], "--lr"),
    _bad("facts train: negative learning rate", ["facts", "train", "--lr", "-0.01"], "--lr -0.01"),
    _bad("facts train: absurd learning rate", ["facts", "train", "--lr", "1e38"], "--lr 1e+38"),
    _bad("facts train: one subject", ["facts", "train", "--subjects", "1"], "--subjects 1"),
    _bad("facts train: zero relations", ["facts", "train", "--relations", "0"], "--relations 0"),
    _bad("facts train: negative width", ["facts", "train", "--d", "-4"], "--d -4"),
    _bad("facts train: zero MLP width", ["facts", "train", "--mlp-width", "0"], "--mlp-width 0"),
    _bad("facts train: negative batch size", ["facts", "train", "--batch-size", "-1"], "--batch-size -1"),
    _bad("facts train: zero evaluation interval", ["facts", "train", "--eval-every", "0"], "--eval-every 0"),
    _bad("facts train: negative step budget", ["facts", "train", "--steps", "-1"], "--steps -1"),
    _bad("facts train: absurd step budget", ["facts", "train", "--steps", "100000000000000000000"], "--steps"),
    _bad("facts train: negative weight decay", ["facts", "train", "--weight-decay", "-1"], "--weight-decay -1"),
    _bad("facts train: infinite L2", ["facts", "train", "--l2", "inf"], "--l2"),
    _bad("facts train: zero target logit", ["facts", "train", "--loss", "mse", "--target-logit", "0"],
         "--target-logit 0"),
    _bad("facts train: NaN target accuracy", ["facts", "train", "--target-accuracy", "nan"], "--target-accuracy nan"),
    _bad("facts train: target accuracy above 1", ["facts", "train", "--target-accuracy", "1.5"],
         "--target-accuracy 1.5"),
    _bad("facts train: attribute pool larger than the subjects", ["facts", "train", "--attributes", "1000"],
         "--attributes 1000"),
    _bad("facts train: zero hops", ["facts", "train", "--hops", "0"], "--hops 0"),
    _bad("facts train: multi-hop with uniform attention", ["facts", "train", "--hops", "2"], "--hops 2"),
    _bad("facts train: too many k-hop chains", ["facts", "train", "--hops", "12", "--attention", "learned"],
         "--hops 12"),
    _bad("facts train: unknown schedule", ["facts", "train", "--schedule", "linear"], "--schedule"),
    _bad("facts construct: width below the construction", ["facts", "construct", "--d", "2"], "--d 2"),
    _bad("facts construct: zero subjects", ["facts", "construct", "--subjects", "0"], "--subjects 0"),
    _bad("facts capacity: zero in the grid", ["facts", "capacity", "--grid", "0"], "--grid"),
    _bad("facts capacity: zero seeds", ["facts", "capacity", "--seeds", "0"], "--seeds 0"),
    _bad("facts capacity: zero relations", ["facts", "capacity", "--relations", "0"], "--relations 0"),
    _bad("facts multihop: too many k-hop chains", ["facts", "multihop", "--hops", "12"], "--hops 12"),
    _bad("facts multihop: zero learning rate", ["facts", "multihop", "--lr", "0"], "--lr 0"),
    # ---- probe (fact model) ---------------------------------------------------------------------------------
    _probe("readout", "probe readout: NaN ridge strength", ["--alpha", "nan"], "--alpha"),
    _probe("readout", "probe readout: negative ridge strength", ["--alpha", "-1"], "--alpha -1"),
    _probe("readout", "probe readout: zero ridge strength", ["--alpha", "0"], "--alpha 0"),
    _probe("readout", "probe readout: held-out share of 1", ["--heldout", "1"], "--heldout 1"),
    _probe("readout", "probe readout: relation the model lacks", ["--relations", "9"], "relation 9"),
    _probe("readout", "probe readout: unknown hook site", ["--sites", "blocks.0.hook_bogus@last"],
           "unknown hook site"),
    _probe("superposition", "probe superposition: zero held-out share", ["--heldout", "0"], "--heldout 0"),
    _probe("intervene", "probe intervene: zero units", ["--units", "0"], "--units 0"),
    _probe("intervene", "probe intervene: layer the model lacks", ["--layer", "3"], "--layer 3"),
    _probe("intervene", "probe intervene: negative layer", ["--layer", "-1"], "--layer -1"),
    _probe("swap", "probe swap: NaN learning rate", ["--lr", "nan"], "--lr"),
    _probe("swap", "probe swap: negative learning rate", ["--lr", "-1"], "--lr -1"),
    _probe("swap", "probe swap: negative steps", ["--steps", "-1"], "--steps -1"),
    _probe("swap", "probe swap: the model's own world again", ["--new-seed", "0"], "--new-seed 0"),
    _probe("scores", "probe scores: layer the model lacks", ["--layer", "2"], "--layer 2"),
    # ---- LLM commands (a tiny random Llama) -----------------------------------------------------------------
    _bad("llm probe: zero splits", ["llm", "probe", *LLM, "--splits", "0"], "--splits 0"),
    _bad("llm probe: negative k-shot", ["llm", "probe", *LLM, "--k-shot", "-1"], "--k-shot -1"),
    _bad("llm probe: zero known tokens", ["llm", "probe", *LLM, "--known-tokens", "0"], "--known-tokens 0"),
    _bad("llm probe: zero batch size", ["llm", "probe", *LLM, "--batch-size", "0"], "--batch-size 0"),
    _bad("llm probe: two samples per relation", ["llm", "probe", *LLM, "--max-samples", "2"], "--max-samples 2"),
    _bad("llm lre: negative beta", ["llm", "lre", *LLM, "--beta", "-1"], "--beta -1"),
    _bad("llm lre: NaN beta", ["llm", "lre", *LLM, "--beta", "nan"], "--beta"),
    _bad("llm lre: zero rank", ["llm", "lre", *LLM, "--rank", "0"], "--rank 0"),
    _bad("llm lre: zero training facts", ["llm", "lre", *LLM, "--n-train", "0"], "--n-train 0"),
    _bad("llm lre: negative causality cap", ["llm", "lre", *LLM, "--max-causality", "-1"], "--max-causality -1"),
    _bad("llm superposition: held-out share above 1", ["llm", "superposition", *LLM, "--heldout", "1.5"],
         "--heldout 1.5"),
    _bad("llm superposition: zero splits", ["llm", "superposition", *LLM, "--splits", "0"], "--splits 0"),
    _bad("probe readout (LLM): negative ridge strength", ["probe", "readout", *LLM, "--alpha", "-1"], "--alpha -1"),
    # ---- absurd sizes: refused by the memory estimate, before anything is allocated --------------------------
    _size("memory sweep: d = 100000", ["memory", "sweep", "--d", "100000"], "--d 100000"),
    _size("memory sweep: a billion seeds", ["memory", "sweep", "--d", "8", "--seeds", "1000000000"],
          "--seeds 1000000000"),
    _size("memory sweep: decoupled competitors of d = 200", ["memory", "sweep", "--problem", "decoupled",
                                                             "--d", "200"], "--d 200"),
    _size("memory capacity: d = 5000", ["memory", "capacity", "--d", "5000"], "--d 5000"),
    _size("memory scores: load 1000", ["memory", "scores", "--alpha", "1000"], "--alpha 1000"),
    _size("memory spectrum: d = 2000", ["memory", "spectrum", "--d", "2000"], "--d 2000"),
    _size("memory rank: d = 3000", ["memory", "rank", "--d", "3000"], "--d 3000"),
    _size("facts train: ten million subjects", ["facts", "train", "--subjects", "10000000"], "--subjects 10000000"),
    _size("facts train: width one million", ["facts", "train", "--d", "1000000"], "--d 1000000"),
    _size("facts train: a hundred million relations", ["facts", "train", "--relations", "100000000"],
          "--relations 100000000"),
    _size("facts construct: a hundred million subjects", ["facts", "construct", "--subjects", "100000000"],
          "--subjects 100000000"),
    _size("facts capacity: a million subjects", ["facts", "capacity", "--subjects", "1000000"], "--subjects 1000000"),
    _size("facts capacity: grid up to d = 100000", ["facts", "capacity", "--grid", "100000"], "--d 100000"),
    _size("facts multihop: 100000 hops of one relation", ["facts", "multihop", "--relations", "1", "--hops",
                                                          "100000"], "--hops 100000"),
    # ---- trainings that diverge: one line, nothing written ----------------------------------------------------
    _case(TRAINING, "facts train: learning rate 1e6 diverges",
          ["facts", "train", *TINY_FACTS, "--steps", "50", "--eval-every", "5", "--lr", "1e6"], "training diverged"),
    _case(TRAINING, "facts multihop: learning rate 1e10 diverges",
          ["facts", "multihop", *TINY_FACTS, "--hops", "1", "--steps", "50", "--eval-every", "5", "--lr", "1e10"],
          "training diverged"),
    _case(TRAINING, "memory sweep: hinge loss at learning rate 1e20 diverges",
          ["memory", "sweep", *TINY_MEMORY, "--loss", "hinge2", "--steps", "100", "--lr", "1e20"], "training diverged"),
    _case(TRAINING, "memory scores: hinge loss at learning rate 1e20 diverges",
          ["memory", "scores", "--d", "8", "--alpha", "0.9", "--loss", "hinge2", "--steps", "100", "--lr", "1e20"],
          "training diverged"),
]
