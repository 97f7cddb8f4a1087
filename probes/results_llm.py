"""``docs/results_llm.md``: three real model families side by side (readout, LRE in the authors' protocol,
superposition), written from the run folders of :mod:`probes.families` alone.

    python -m probes.results_llm --run --relations DIR   # runs every missing part into runs/fam (hours on 2 CPU cores)
    python -m probes.results_llm                         # tables (markdown) + figures, from the run folders alone
    python -m probes.results_llm --run --relations DIR --resume-from docs/runs/fam   # continue the shipped runs
    python -m probes.results_llm --out docs/runs/fam --doc docs/results_llm.md      # the page

``DIR`` is the LRE authors' data folder (github evandez/relations, ``data/``: ``factual/`` and ``linguistic/``).
What runs is :func:`probes.families.run`; the LRE tables are :mod:`probes.results_llm_lre`.
"""

from __future__ import annotations

import sys
from pathlib import Path


from probes.families import (LARGE_FILE, MODELS, PARTS, SUPERPOSITION_RUNS, SWEEP_MAX_CAUSALITY, _read, export,
                             resume_shipped, run, runs_status)
from probes.results_llm_lre import (_ci, _p, lre_figure, lre_sweep_table, lre_table, rank_grid_section,
                                    trials24_section)


def readout_table(out: Path) -> str:
    """Per relation and model: the layer chosen by nested cross-validation on training subjects, the held-out
    accuracy there [95% Wilson over scored facts], the shuffled-label control (same selection), the majority
    object, the ceiling, and the number of scored facts."""
    rows = ["| relation | " + " | ".join(f"{m}: layer / readout [95%] (control, majority, ceiling) n" for m in MODELS)
            + " |", "|---|" + "---|" * len(MODELS)]
    res = {m: _read(out / m / "probe" / "result.json") for m in MODELS}
    names = sorted({b["relation"] for r in res.values() if r for b in r.get("best_layers", [])})
    for name in names:
        cells = []
        for m in MODELS:
            b = next((b for b in (res[m] or {}).get("best_layers", []) if b["relation"] == name), None)
            k = next((r for r in (res[m] or {}).get("relations", []) if r["relation"] == name), None)
            cells.append("—" if b is None or "readout_accuracy_ci" not in b else
                         f"{b['best_layer']} / {_ci(b, 'readout_accuracy')} ({b['control_accuracy']:.2f}, "
                         f"{b['chance']:.2f}, {b['ceiling']:.2f}) n {b['readout_accuracy_n']}; known "
                         f"{k['n_known']}/{k['n_samples']}")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    for m in MODELS:
        best = (res[m] or {}).get("best_layers", [])
        if best and all("readout_accuracy_ci" in b for b in best):
            above = [b["relation"] for b in best
                     if b["readout_accuracy_ci"][0] > max(b["control_accuracy"], b["chance"])]
            rows.append(f"\n{m}: {len(above)} of {len(best)} relations read out with the lower end of the 95% "
                        f"interval above both the control and the majority rate: {', '.join(above) or 'none'}")
    return "\n".join(rows)


def superposition_table(out: Path, name: str = "superposition") -> str:
    """Per model and layer: held-out R^2 [95% bootstrap over countries], its permutation p-value (shuffled
    attributes) and the random-code null's p, partial R^2 after the nuisance regressors (p), the top coordinate's
    share of the variance, and which attributes are decodable from the same state (accuracy, label-shuffle p)."""
    rows = [f"Prompt: {SUPERPOSITION_RUNS[name]}.\n",
            "| model | layer | R^2 held-out [95%] | p shuffled / p random codes | partial R^2 (p) | layer 0 alone | "
            "beyond layer 0 [95%] (p) | top coordinate share | decodable: continent / language / currency / capital / "
            "demonym (p) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for m in MODELS:
        r = _read(out / m / name / "result.json")
        for x in (r or {}).get("per_layer", []):
            if "p_value" not in x:
                continue
            dec = x["decodability"]
            d = " / ".join(f"{dec[f'countries_{k}']['accuracy']:.2f} ({dec[f'countries_{k}'].get('p_value', 1):.3f})"
                           for k in ("continent", "language", "currency", "capital", "demonym")
                           if f"countries_{k}" in dec)
            rows.append(f"| {m} | {x['layer']} | {_ci(x, 'r2_heldout', '.3f')} | "
                        f"{x['p_value']:.3f} / {x['null_random_features']['p_value']:.3f} | "
                        f"{x['partial_r2_heldout']:.3f} ({x['null_partial']['p_value']:.3f}) | "
                        f"{_beyond_layer0(x)}"
                        f"{x['top_coordinate_variance_share']:.2f} | {d} |")
    n = (_read(out / MODELS[0] / name / "result.json") or {}).get("n_null")
    rows.append(f"\np-values: permutation tests with {n or 'the run'} draws each ((1 + #null >= observed) / (1 + n));"
                " with L layers per model, p < 0.05 / L holds after Bonferroni.")
    return "\n".join(rows)


def known_table(out: Path, name: str = "superposition") -> str:
    """Per model and layer: the same held-out fits scored on the subjects the model knows and on the others
    (the full fit, and beyond the whole layer-0 state), each group's R^2 [95%], the difference and its
    relabelling p; Holm over every difference test of the table; then one line per model."""
    from mechfact import stats
    from mechfact.llm.superposition_stats import MIN_GROUP

    got = []  # (model, layer, kind, test name, p, cell)
    for m in MODELS:
        r = _read(out / m / name / "result.json") or {}
        for x in r.get("per_layer", []):
            for kind in ("known_contrast", "known_contrast_beyond_layer0"):
                c = x.get(kind) or {}
                if c.get("p_value") is not None:
                    got.append((m, x["layer"], kind, "groups", c["p_value"], c))
                sp = c.get("recall_spearman") or {}
                if sp.get("p_value") is not None:
                    got.append((m, x["layer"], kind, "spearman", sp["p_value"], sp))
    if not got:
        return ("Known against unknown subjects: not in these runs (rows written before the contrast; a rerun "
                "makes it).")
    holm = dict(zip(range(len(got)), stats.holm([g[4] for g in got])))
    rules = {m: (_read(out / m / name / "result.json") or {}).get("known_rule") for m in MODELS}
    rows = ["Known against unknown subjects (" + "; ".join(f"{m}: {v}" for m, v in rules.items() if v) + "). "
            "Groups: known / unknown R^2 [95%], the difference, its p from relabelling the subjects (a group "
            f"below {MIN_GROUP} subjects: no test). Graded: Spearman's rho over every subject of the number of "
            "relations it recalls against the share of its held-out state the fit explains (p: permutation). "
            f"Holm over the {len(got)} tests of this table.\n",
            "| model | layer | full fit: groups (p, Holm); graded rho (p, Holm) | beyond layer 0: groups (p, Holm); "
            "graded rho (p, Holm) |", "|---|---|---|---|"]
    cells = {}
    for k, (m, layer, kind, test, p, c) in enumerate(got):
        cell = (f"{_ci(c, 'r2_known', '.3f')} / {_ci(c, 'r2_unknown', '.3f')}, {c['diff']:+.3f} "
                f"(p {_p(p)}, Holm {_p(holm[k])})" if test == "groups" else
                f"rho {c['rho']:+.2f} (p {_p(p)}, Holm {_p(holm[k])})")
        cells.setdefault((m, layer), {}).setdefault(kind, []).append(cell)
    for (m, layer), d in cells.items():
        rows.append(f"| {m} | {layer} | {'; '.join(d.get('known_contrast', ['—']))} | "
                    f"{'; '.join(d.get('known_contrast_beyond_layer0', ['—']))} |")
    for m in MODELS:
        mine = [(k, g) for k, g in enumerate(got) if g[0] == m and g[2] == "known_contrast_beyond_layer0"
                and g[1] > 0]
        if mine:
            said = []
            for test, what in (("groups", "known minus unknown"), ("spearman", "graded rho")):
                t = [(k, g) for k, g in mine if g[3] == test]
                if t:
                    sign = "diff" if test == "groups" else "rho"
                    up = sum(holm[k] < 0.05 and g[5][sign] > 0 for k, g in t)
                    down = sum(holm[k] < 0.05 and g[5][sign] < 0 for k, g in t)
                    said.append(f"{what} positive at {up}, negative at {down} of {len(t)} layers")
            rows.append(f"\n{m}, beyond layer 0, Holm p < 0.05: " + "; ".join(said) + ".")
    return "\n".join(rows)


def _beyond_layer0(x: dict) -> str:
    """The two cells of the whole-layer-0 control (rows of runs made before it: "-")."""
    if "r2_heldout_beyond_layer0" not in x:
        return "- | - | "
    return (f"{x['r2_heldout_layer0_only']:.3f} | {_ci(x, 'r2_heldout_beyond_layer0', '.3f')} "
            f"({x['null_beyond_layer0']['p_value']:.3f}) | ")


def superposition_statement(out: Path, name: str) -> str:
    """What holds, per model, in plain words computed from the rows: at how many layers the held-out R^2 beats
    both nulls (no draw of either reached it: p at its floor 1 / (n + 1)) with its interval above 0, its range
    there, the partial R^2 likewise, and whether that floor passes Bonferroni over the layers."""
    lines = []
    for m in MODELS:
        res = _read(out / m / name / "result.json") or {}
        rows = [x for x in res.get("per_layer", []) if "p_value" in x]
        if not rows:
            continue
        floor = 1.0 / (1 + int(res.get("n_null") or 200))
        ok = [x for x in rows if x["p_value"] <= floor and x["null_random_features"]["p_value"] <= floor
              and (x.get("r2_heldout_ci") or [None])[0] is not None and x["r2_heldout_ci"][0] > 0]
        part = [x for x in rows if x["null_partial"]["p_value"] <= floor and x["partial_r2_heldout"] > 0]
        beyond = [x for x in rows if "null_beyond_layer0" in x and x["layer"] > 0
                  and x["null_beyond_layer0"]["p_value"] <= floor and x["r2_heldout_beyond_layer0_ci"][0] > 0]
        later = [x for x in rows if "null_beyond_layer0" in x and x["layer"] > 0]
        r2 = [x["r2_heldout"] for x in ok]
        rng = f", R^2 {min(r2):.2f}-{max(r2):.2f} there" if r2 else ""
        bonf = (f"That p passes Bonferroni over the {len(rows)} layers (p < {0.05 / len(rows):.4f})"
                if floor < 0.05 / len(rows) else f"Bonferroni over the {len(rows)} layers needs p < "
                f"{0.05 / len(rows):.4f}: more than {20 * len(rows)} draws per null")
        lines.append(f"- {m}: at {len(ok)} of {len(rows)} layers no draw of either null reaches the held-out R^2 "
                     f"(p = {floor:.3f}) and its interval lies above 0{rng}; the partial R^2 (after "
                     f"{res.get('per_layer', [{}])[0].get('nuisance', {}).get('layer0_pcs', 3)} principal components of "
                     f"the layer-0 state and token count) beats its null likewise at {len(part)} of {len(rows)} layers"
                     + (f", up to {max(x['partial_r2_heldout'] for x in part):.2f}" if part else "")
                     + (f"; beyond the WHOLE layer-0 state (ridge-residualised) and token count, the attributes "
                        f"explain held-out variance that no shuffled draw reaches, with its interval above 0, at "
                        f"{len(beyond)} of the {len(later)} layers after layer 0"
                        + (f" ({min(x['r2_heldout_beyond_layer0'] for x in beyond):.3f}-"
                           f"{max(x['r2_heldout_beyond_layer0'] for x in beyond):.3f})" if beyond else "")
                        if later else "")
                     + f". {bonf}.")
    return "\n".join(lines)


DOC_HEAD = """# Relational linearity in pretrained LLMs: SmolLM2-135M-Instruct, Gemma-3-270M (base), Qwen2.5-Coder-0.5B-Instruct

This page is written by `python -m probes.results_llm --out docs/runs/fam --doc docs/results_llm.md` from the run
files under `docs/runs/fam` alone: the configs, results and metadata of the run folders that
`python -m probes.results_llm --run --relations PATH` makes under `runs/fam` (PATH: the LRE authors' `data/` folder
from github evandez/relations), copied there by `python -m probes.results_llm --out runs/fam --export docs/runs/fam`.
Every number carries its n and a 95% interval; a part that has not been run says so. The models are the three
packaged ones (`mechfact llm models`).

LRE protocol (the authors' sweep, every choice on training facts): per trial an object-balanced split, the
training facts as the in-context examples of every prompt, test facts filtered under that prompt (the fact's own
object); F = faithfulness at beta 2.25 fixed in advance; F(β*) = at the model's one beta chosen on the training
facts pooled over relations (the authors' rule for their published numbers: one beta per model); β0 = beta 0,
the bias alone; maj = the share of the most common test object; tok = what the best constant first token gets
(one token for every fact, chosen on the scored facts, under the first-token match F is scored by: the fair
constant for F; in runs that record it); C = causality at
the rank chosen on the training facts (on every test fact of a trial, as the authors, except where a cell says
`≤K edits/trial`: K of them, taken round-robin over objects, `--max-causality K`: every factual file of more
than LARGE_FILE facts, on every model, K = CAP; `--run` gives each relation these settings and the page reads no
row made otherwise). Intervals: bootstrap over subjects (cells; runs that record the best constant token draw
trials, each its own operator, then subjects) or over relations (means).
`n a×b`: a test facts per trial, b trials. Degenerate relations (every test fact one object, or the bias alone
right on every test fact: a constant answer scores 1.00) are marked and left out of the means.
"""


def write_doc(out: Path, path: Path) -> None:
    """The whole results page from the run folders in ``out`` (figures next to it in ``img/``)."""
    from probes.results_trace import models_legend

    head = DOC_HEAD.replace("LARGE_FILE", str(LARGE_FILE)).replace("K = CAP", f"K = {SWEEP_MAX_CAUSALITY}")
    parts = [head, models_legend(MODELS), "## Runs behind this page\n", runs_status(out), ""]
    parts += ["## LRE, the authors' protocol, factual relations (middle layer)\n", lre_table(out, "factual"), "",
              "## LRE, the authors' protocol, linguistic relations (middle layer)\n", lre_table(out, "linguistic"), "",
              "![LRE per relation](img/families_lre.png)\n",
              "## LRE at 24 trials, faithfulness only: F against the constant answers, relation by relation\n",
              "As the sections above, with the paper's 24 trials, no edits (`--max-causality 0`), and every test "
              "fact's outcome kept, so that F(β*) is tested against the best constant first token (one token "
              "answered for every fact, chosen per trial on the scored facts themselves: an upper bound for any "
              "constant, scored by the same first-token match as F; under that match a one-letter token such as "
              "'b' is right on every object starting with b, and F can score the same way) and the majority object "
              "on the same facts.\n",
              trials24_section(out), "",
              "## LRE layer sweep (layers chosen on training facts)\n", lre_sweep_table(out), "",
              "## LRE causality on the authors' rank grid\n",
              "The relations of the layer sweep at the middle layer, with the edits of the authors'-protocol run above "
              "(the same trials, splits, edit pairs and cap), on the authors' edit-rank grid `range(0, 320, 8)` "
              "(40 ranks) instead of the default 16, 32, 64, 128, 256 and the full rank. Either grid's rank is "
              "chosen on the training facts (leave-one-out edits); the best rank on the scored facts is an upper "
              "bound. Where both runs made the same edits, C at the ranks both grids hold is the same number. "
              "Intervals draw trials, then subjects; \"(subjects)\": a row written before, drawing subjects alone "
              "(narrower). "
              "On a CPU this runs on SmolLM2 only (about 7x the edits of the default grid).\n",
              rank_grid_section(out), "",
              "## Readout (the 14 shipped relations)\n", readout_table(out), "",
              "## Superposition of a subject's attributes (the shipped countries)\n",
              "Per layer: the held-out R^2 of the subject states fitted as a sum of attribute codes, against shuffled "
              "attributes and random codes; the partial R^2 after 3 principal components of the layer-0 state and "
              "the token count; what the layer-0 state alone (ridge, with the token count) predicts of the held-out "
              "states (\"layer 0 alone\"); and what the attributes explain BEYOND the whole layer-0 state and token "
              "count (the states ridge-residualised on them, out of fold, then the attributes' fit to the residual, "
              "against its shuffled null). A fit that layer 0 already carries is the subject's lexical geometry, not "
              "recalled attributes: the last column is the test of recall.\n",
              *[superposition_table(out, n) + "\n\nWhat holds (computed from the rows above):\n\n"
                + superposition_statement(out, n) + "\n\n" + known_table(out, n) + "\n" for n in SUPERPOSITION_RUNS],
              "![three families](img/families.png)\n"]
    from mechfact.runs import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(parts))


def figure(out: Path, path: Path) -> None:
    from mechfact.llm.plots import plot_families

    runs = {m: {"probe": _read(out / m / "probe" / "result.json"),  # words before the subject where run
                "superposition": _read(out / m / "superposition_words" / "result.json")
                or _read(out / m / "superposition" / "result.json")} for m in MODELS}
    runs = {m: r for m, r in runs.items() if r["probe"] or r["superposition"]}
    if not runs:  # nothing in --out: keep the figure that is there
        print(f"no probe or superposition runs in {out}: {path} left as it is", file=sys.stderr)
        return
    plot_families(runs, path)


def main(argv=None) -> None:
    from probes import study

    ap = study.parser(__doc__.split("\n")[0], "runs/fam", "docs/results_llm.md")
    ap.add_argument("--figure", default="docs/img/families.png")
    ap.add_argument("--lre-figure", default="docs/img/families_lre.png")
    ap.add_argument("--relations", default=None, metavar="DIR",
                    help="with --run: the LRE authors' data folder (github evandez/relations, data/), holding "
                         "factual/ and linguistic/")
    ap.add_argument("--resume-from", default=None, metavar="DIR",
                    help="with --run: first copy the exported runs in DIR (e.g. docs/runs/fam) that --out lacks, "
                         "so the shipped finished runs are skipped and a shipped unfinished one continues")
    a = study.parse(ap, argv)
    out = Path(a.out)
    if a.resume_from and not a.run:
        ap.error("--resume-from needs --run")
    if a.run:
        if a.relations is None or not all((Path(a.relations) / p).is_dir() for p in PARTS):
            ap.error(f"--run needs --relations DIR with {' and '.join(PARTS)} folders (got {a.relations})")
        if a.resume_from:
            if not Path(a.resume_from).is_dir():
                ap.error(f"--resume-from {a.resume_from}: no such folder (an --export destination, e.g. "
                         "docs/runs/fam)")
            got = resume_shipped(Path(a.resume_from), out, Path(a.relations))
            print(f"{len(got)} run folders copied from {a.resume_from} to {out}: {', '.join(got) or 'none'}")
        run(out, Path(a.relations))

    def tables() -> str:
        return "\n\n".join([readout_table(out), *[lre_table(out, part) for part in PARTS], lre_sweep_table(out),
                            rank_grid_section(out),
                            *[superposition_table(out, n) for n in SUPERPOSITION_RUNS]])

    study.finish(a, export, write_doc, tables=tables)
    figure(out, Path(a.figure))
    lre_figure(out, Path(a.lre_figure))

if __name__ == "__main__":
    main()
