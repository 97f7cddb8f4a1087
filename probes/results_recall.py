"""How the packaged models recall a fact, beyond causal tracing: attention knockout, attribute rate and extraction
events (Geva et al. 2023), subject-state transfer and the relation selectivity of last-position MLP units (the
geometric-recall paper's two claims as causal tests), and attribution patching against exact patching.

    python -m probes.results_recall --run [--models smollm2-135m-instruct] [--max-facts 8]   # missing runs into runs/recall
    python -m probes.results_recall --out runs/recall --export docs/runs/recall      # the run JSON, for a clone
    python -m probes.results_recall --out docs/runs/recall --doc docs/results_recall.md  # the page, from runs alone

Per packaged model (``mechfact llm models``; one not installed is skipped), on the known facts of the shipped
relations of :data:`probes.results_trace.RELATIONS` (zero-shot prompts, at most ``--max-facts`` per relation,
a seeded choice), one JSON per experiment in ``<out>/<model>/``, written as each finishes (a rerun resumes).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from mechfact.stats import format_p
from probes.results_trace import MODELS, RELATIONS, _installed, _read

EXPERIMENTS = ("knockout", "attribute_rate", "extraction", "transfer", "selectivity", "atp")
ATP_FACTS = 1  # known facts per relation in the AtP-vs-exact comparison (the exact trace is the slow side)


def _per_relation(fn, rels, seed: int) -> dict:
    """``fn(relation)`` on each relation (one without known facts is counted, not run), the summary of each and of
    every fact pooled."""
    from dataclasses import replace

    results, skipped = {}, []
    for rel in rels:
        try:
            results[rel.name] = fn(rel)
        except ValueError as exc:
            if "no known facts" not in str(exc):
                raise
            skipped.append(rel.name)
    first = next(iter(results.values()))
    pooled = replace(first, facts=tuple(f for r in results.values() for f in r.facts))
    return {"pooled": pooled.summary(seed), "per_relation": {k: r.summary(seed) for k, r in results.items()},
            "no_known_facts": skipped}


def _selectivity(res) -> dict:
    """The result without the ablation's unit lists, with where the units were chosen."""
    out = {k: v for k, v in res.to_dict().items() if k != "ablation"}
    out["held_out"] = bool(res.ablation.get("held_out"))
    out["left_out"] = res.ablation.get("left_out", [])
    return out


def run_model(model: str, out: Path, max_facts: int, seed: int = 0) -> None:
    import torch

    import mechfact
    from mechfact.llm.models.loading import load_model
    from mechfact.llm.relations import as_relations
    from mechfact.runs import write_json_atomic

    torch.set_num_threads(1)
    lm = load_model(model)
    rels = as_relations(None, list(RELATIONS))
    L = lm.n_layers
    layers = sorted({-1, L - 1, L // 2} | set(range(0, L, 3)))  # L // 2: the layer the transfer test is stated at
    todo = {
        "knockout": lambda: _per_relation(lambda r: mechfact.attention_knockout(lm, r, max_facts=max_facts, seed=seed),
                                          rels, seed),
        "attribute_rate": lambda: mechfact.attribute_rate(lm, rels, k=50, max_facts=max_facts,
                                                          seed=seed).summary(seed),
        "extraction": lambda: _per_relation(lambda r: mechfact.extraction_events(lm, r, max_facts=max_facts, seed=seed),
                                            rels, seed),
        "transfer": lambda: mechfact.state_transfer(lm, rels, layers=layers, max_facts=max_facts,
                                                    seed=seed).summary(seed),
        "selectivity": lambda: _selectivity(mechfact.relation_selectivity(lm, rels, seed=seed)),
        "atp": lambda: mechfact.attribution_patching(lm, rels, agreement=True, max_facts=ATP_FACTS,
                                                     seed=seed).summary(seed),
    }
    for name, fn in todo.items():
        path = out / model / f"{name}.json"
        if path.is_file():
            continue
        t = time.perf_counter()
        res = fn()
        print(f"{model} {name}: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
        write_json_atomic(path, {"model": lm.name, "n_layers": L, "relations": list(RELATIONS),
                                 "max_facts": ATP_FACTS if name == "atp" else max_facts, "seed": seed,
                                 "seconds": round(time.perf_counter() - t, 1), "result": res})


def export(out: Path, dest: Path) -> int:
    from mechfact.runs import atomic_path

    n = 0
    for f in sorted(out.glob("*/*.json")):
        target = dest / f.relative_to(out)
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(target) as tmp:
            tmp.write_text(json.dumps(_read(f), indent=1) + "\n")
        n += 1
    return n


# ---- the page ---------------------------------------------------------------------------------------------------

def _pct(x, ci=None, scale=100.0, unit="%") -> str:
    if x is None:
        return "—"
    s = f"{scale * x:.1f}{unit}"
    return s if not ci or ci[0] is None else f"{s} [{scale * ci[0]:.1f}, {scale * ci[1]:.1f}]"


def _layer(l, L) -> str:
    return "emb" if l < 0 else f"{l} ({l / L:.2f})"


def _table(out: Path, file: str, header: tuple[str, str], rows_of) -> str:
    """A page table: the header, then ``rows_of(run)``'s rows for each model's ``file`` (models without it left
    out)."""
    rows = list(header)
    for m in MODELS:
        r = _read(out / m / file)
        if r:
            rows += list(rows_of(r))
    return "\n".join(rows)


def _knockout_rows(r):
    L = r["n_layers"]
    for name, s in [("all", r["result"]["pooled"])] + list(r["result"]["per_relation"].items()):
        cells = []
        for g in ("subject", "relation", "last"):
            p = s.get(f"largest_drop_{g}")
            cells.append("—" if not p else f"{_pct(p['change'], p.get('change_ci'), 1.0)} at layer "
                                           f"{_layer(p['layer'], L)}")
        yield (f"| {r['model']} | {name} | {s['n_facts']} | {s['window']} | {_pct(s['p_clean'])} | "
               + " | ".join(cells) + " |")


def _attribute_rows(r):
    L = r["n_layers"]
    for pos, curve in r["result"]["rate"].items():
        scored = [c for c in curve if c["rate"] is not None]
        if scored:
            p = max(scored, key=lambda c: c["rate"])
            yield (f"| {r['model']} | {pos.replace('_', ' ')} | {_pct(p['rate'], p.get('rate_ci'))} at "
                   f"{_layer(p['layer'], L)} | {_pct(p['baseline'])} | {_pct(scored[0]['rate'])} |")


def _extraction_rows(r):
    for name, s in [("all", r["result"]["pooled"])] + list(r["result"]["per_relation"].items()):
        yield (f"| {r['model']} | {name} | {s['n_facts']} | {_pct(s['attn_any']['rate'], s['attn_any']['rate_ci'])} "
               f"| {_pct(s['mlp_any']['rate'], s['mlp_any']['rate_ci'])} |")


def _transfer_rows(r):
    s, L = r["result"], r["n_layers"]
    pooled = s["pooled"]
    best = max(pooled, key=lambda p: p["accuracy"])
    emb = next((p for p in pooled if p["layer"] == -1), None)
    fx = s.get("fixed")
    if fx:
        d = fx["vs_control"]
        ci = d["diff_ci"]
        fixed = (f"{_pct(fx['accuracy'], fx['accuracy_ci'])} at {_layer(fx['layer'], L)} | "
                 f"{_pct(fx['control'], fx['control_ci'])} | {100 * d['diff']:+.1f} pp"
                 + (f" [{100 * ci[0]:+.1f}, {100 * ci[1]:+.1f}]" if ci[0] is not None else "")
                 + f", p {format_p(d['p_value'])} | " + {"above": "transfers", "below": "below its control",
                                                   "undecided": "undecided"}[d["verdict"]] + " |")
    else:
        fixed = "— | — | — | — |"
    yield (f"| {r['model']} | {s['n_pairs']} | {fixed} {_pct(emb['accuracy'], emb['accuracy_ci']) if emb else '—'} | "
           f"{_pct(best['accuracy'], best['accuracy_ci'])} at {_layer(best['layer'], L)} | "
           f"{_pct(best['control'], best['control_ci'])} | {_pct(best['kept'])} |")


def _transfer_relation_rows(r):
    for rel in RELATIONS:
        at = [p for p in r["result"]["per_relation"] if p["relation"] == rel]
        if at:
            b = max(at, key=lambda p: p["accuracy"])
            yield (f"| {r['model']} | {rel} | {b['n']} | {_pct(b['accuracy'], b['accuracy_ci'])} at "
                   f"{_layer(b['layer'], r['n_layers'])} | {_pct(b['control'])} |")


def _selectivity_rows(r):
    s = r["result"]
    rels = ", ".join(f"{a} ({n})" for a, n in zip(s["relations"], s["n_facts"]))
    chosen = "the other half" if s.get("held_out") else "the same facts (upper bound)"
    yield f"| {r['model']} | {s['site']} | {rels} | {chosen} | {_pct(s['score'])} | {_pct(s['random_score'])} |"


def _atp_rows(r):
    s = r["result"]
    yield (f"| {r['model']} | {s['n_facts']} | {s['spearman']:.2f} [{s['spearman_ci'][0]:.2f}, "
           f"{s['spearman_ci'][1]:.2f}] | {s['top10_overlap']:.2f} | {s['seconds_atp']:.1f} / "
           f"{s['seconds_exact']:.1f} ({s['speedup']:.0f}x) |")


# each table of the page: the run file it reads, its header, its rows per run
TABLES = {
    "knockout": ("knockout.json", (
        "| model | relation | facts | window | p(answer) clean | largest drop (upper bound): subject [95%] | "
        "relation | last |", "|---|---|---|---|---|---|---|---|"), _knockout_rows),
    "attribute": ("attribute_rate.json", (
        "| model | position | peak attribute rate (top 50) [95%] at layer | another subject's attributes there | "
        "at the embedding |", "|---|---|---|---|---|"), _attribute_rows),
    "extraction": ("extraction.json", (
        "| model | relation | facts | an attention update names the answer (any layer) [95%] | an MLP update does "
        "[95%] |", "|---|---|---|---|---|"), _extraction_rows),
    "transfer": ("transfer.json", (
        "| model | pairs | middle block (fixed in advance): transferred [95%] | its control | transferred - "
        "control, paired [95%], p | verdict | at the embedding | best layer (upper bound): transferred [95%] | its "
        "control | the target keeps its own answer there |", "|---|---|---|---|---|---|---|---|---|---|"),
        _transfer_rows),
    "transfer_per_relation": ("transfer.json", (
        "| model | relation | facts | best layer (upper bound): transferred [95%] | control |",
        "|---|---|---|---|---|"), _transfer_relation_rows),
    "selectivity": ("selectivity.json", (
        "| model | site | relations (known facts) | units chosen on | own-relation drop minus others' (selective "
        "units) | same, random units |", "|---|---|---|---|---|---|"), _selectivity_rows),
    "atp": ("atp.json", (
        "| model | facts | Spearman per prompt, AtP vs exact [95%] | top-10 overlap | AtP / exact seconds |",
        "|---|---|---|---|---|"), _atp_rows),
}


def table(out: Path, name: str) -> str:
    """Table ``name`` of :data:`TABLES` from the runs under ``out``."""
    return _table(out, *TABLES[name])


DOC_HEAD = """# How the packaged models recall a fact: knockout, attribute rate, state transfer, selectivity, AtP

Rebuilt by `python -m probes.results_recall --out docs/runs/recall --doc docs/results_recall.md` from the run JSON
in `docs/runs/recall` (`--run` recomputes them: `--out runs/recall`). Known facts of six shipped relations
(country_capital, city_country, company_country, country_language, element_symbol, country_continent), zero-shot
prompts, at most 8 per relation (1 for AtP), seed 0, float32 on CPU. Layers are given with their relative depth;
intervals are 95% bootstrap over facts. Published reference (Geva et al. 2023, GPT-2 XL / GPT-J): blocking the
last position's attention to the subject in upper-middle layers drops the answer's probability by up to ~40-60%,
to the relation positions earlier; the subject's last token carries a high attribute rate from early-middle
layers; extraction happens mostly in attention updates.
"""


def figures(out: Path, img: Path) -> list[Path]:
    """Per model: the knockout curves (pooled over relations) and the transfer accuracy against its control, both
    against relative depth, with 95% bands."""
    from mechfact.plotting import save, subplots

    paths = []
    for m in MODELS:
        ko, tr = _read(out / m / "knockout.json"), _read(out / m / "transfer.json")
        if not ko or not tr:
            continue
        L = ko["n_layers"]
        fig, (a, b) = subplots(1, 2, figsize=(10.0, 3.4), layout="constrained")
        for g, color in (("subject", "tab:red"), ("relation", "tab:green"), ("last", "tab:blue")):
            rows = [r for r in ko["result"]["pooled"]["change"][g] if r["change"] is not None]
            if rows:
                x = [r["layer"] / L for r in rows]
                a.plot(x, [r["change"] for r in rows], "o-", ms=2, color=color, label=g)
                a.fill_between(x, [r["change_ci"][0] for r in rows], [r["change_ci"][1] for r in rows], color=color,
                               alpha=0.2)
        a.set_xlabel("relative depth of the window's centre")
        a.set_ylabel("change of p(answer), %")
        a.set_title(f"{ko['model']}: attention knockout ({ko['result']['pooled']['n_facts']} facts)", fontsize=9)
        a.legend(fontsize=7)
        rows = tr["result"]["pooled"]
        x = [max(r["layer"], -0.5) / L for r in rows]
        for key, color, label in (("accuracy", "tab:purple", "transferred"), ("control", "tab:gray", "control")):
            b.plot(x, [r[key] for r in rows], "o-", ms=3, color=color, label=label)
            b.fill_between(x, [r[f"{key}_ci"][0] for r in rows], [r[f"{key}_ci"][1] for r in rows], color=color,
                           alpha=0.2)
        b.set_xlabel("relative depth (leftmost: the embedding)")
        b.set_ylabel("answer = the source subject's object")
        b.set_ylim(0, 1)
        b.set_title(f"state transfer ({tr['result']['n_pairs']} pairs)", fontsize=9)
        b.legend(fontsize=7)
        path = img / f"recall_{m}.png"
        save(fig, path)
        paths.append(path)
    return paths


def write_doc(out: Path, path: Path) -> None:
    from mechfact.runs import atomic_path

    from probes.results_trace import models_legend

    parts = [DOC_HEAD, models_legend(MODELS),
             "## Attention knockout (Geva et al. 2023)\n",
             "The last position's attention to a group of positions blocked in a window of layers; the relative "
             "change of the clean answer's probability, at the window where it drops most (relation: the prompt's "
             "non-subject tokens before the last, BOS left out). The largest drop is picked among all layers on "
             "the same facts: read it as where the curve bottoms out and an upper bound on its depth; the curves "
             "are in the figures below.\n", table(out, "knockout"), "",
             "## Attribute rate: the subject's attributes in the logit lens\n",
             "The share of the top 50 tokens of the logit lens (the model's final norm and unembedding) that are the "
             "first token of one of the subject's objects across the six relations, beside the same rate for another "
             "subject's objects. A subject has 1-3 such tokens here (Geva et al. used hundreds of attribute tokens "
             "per subject from Wikipedia), so the rate is at most 6%; what matters is the gap to the other "
             "subject's.\n", table(out, "attribute"), "",
             "## Extraction events at the last position\n", table(out, "extraction"), "",
             "## Subject-state transfer (the state holds all its attributes)\n",
             "Subject s's last-token state, read from BOS plus s's tokens as relation r's prompt tokenises them "
             "(the same tokens the recipient prompt holds, leading space included), patched into relation r's "
             "prompt for another subject s' at the same layer: how often the answer becomes s's object for r, "
             "beside a random third subject's state of the same token length (control: it gives s's object by "
             "chance, e.g. a shared continent). The test is stated before the run at the middle block "
             "(layer L // 2): transferred minus control, paired over the source facts (bootstrap interval, sign-flip "
             "p; \"transfers\" when p < 0.05 and the difference is positive). Every 3rd layer is also run; the best "
             "layer is chosen on the same facts (an upper bound). A pair needs two known facts of the relation with "
             "different answers (SmolLM2's known company_country facts share one country: no pair).\n",
             table(out, "transfer"), "",
             "Per relation:\n", table(out, "transfer_per_relation"), "",
             "## Relation selectivity of last-position MLP units\n",
             "The units of the middle block's MLP that prefer one relation at the last position zeroed; the accuracy "
             "drop on that relation minus the mean drop on the others (1: selective units; 0: none), against as "
             "many random units. The units are chosen on one half of each relation's known facts and scored on the "
             "other half, then the halves swap (no fact scores units chosen on it).\n", table(out, "selectivity"), "",
             "## Attribution patching against exact patching\n",
             "State restorations under Gaussian noise (10 draws): AtP's linear estimate of every (token, layer) "
             "cell against the exact restored probability, ranked per prompt.\n", table(out, "atp"), "",
             "## Figures\n", *[f"![{m}](img/recall_{m}.png)\n" for m in MODELS
                               if (out / m / "knockout.json").is_file() and (out / m / "transfer.json").is_file()]]
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(parts))


def main(argv=None) -> None:
    from probes import study

    ap = study.parser(__doc__.split("\n")[0], "runs/recall", "docs/results_recall.md", MODELS)
    ap.add_argument("--max-facts", type=int, default=8, help="known facts per relation (default 8)")
    ap.add_argument("--img", default="docs/img", help="where the page's figures go (default docs/img)")
    a = study.parse(ap, argv, MODELS)
    out = Path(a.out)
    if a.run:
        for m in a.models:
            if _installed(m):
                run_model(m, out, a.max_facts)
    study.finish(a, export, write_doc, figures=lambda: figures(out, Path(a.img)))

if __name__ == "__main__":
    main()
