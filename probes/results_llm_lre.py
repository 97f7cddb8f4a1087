"""The LRE tables of ``docs/results_llm.md`` (the authors' protocol, from the run folders of
:mod:`probes.families`): per relation and model, the rows with their intervals; Spearman against the published
GPT-J / LLaMA-13B numbers; the paired tests of F against the constant answers (Holm over every test of a table);
the layer sweep; the 24-trial section; the per-relation figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mechfact.llm.lre import protocol_authors as lre_authors
from mechfact.stats import format_p as _p
from probes.families import COLORS, LRE_LAYER, MODELS, PARTS, PUBLISHED, RANK_GRID, TRIALS24, _read, pages_row


def _lre_rows(out: Path, m: str, kind: str = "authors") -> dict[str, dict]:
    """Rows of ``lre_<kind>_<part>`` and of its siblings ``lre_<kind>_<part>_*`` (one part split over several
    processes, each with its own --relation-names). Authors'-protocol rows only where their causality cap is the
    page's for the relation (:func:`probes.families.pages_row`): a row made otherwise is not read."""
    rows = {}
    for part in PARTS:
        for folder in [out / m / f"lre_{kind}_{part}", *sorted((out / m).glob(f"lre_{kind}_{part}_*"))]:
            r = _read(folder / "result.json")
            rows.update({x["relation"]: {**x, "part": part} for x in (r or {}).get("per_relation", [])
                         if pages_row(f"lre_{kind}_{part}", x)})
    return rows


def _ci(x: dict, key: str, spec: str = ".2f") -> str:
    v, ci = x.get(key), x.get(f"{key}_ci") or [None, None]
    if v is None:
        return "—"
    return f"{v:{spec}}" if ci[0] is None else f"{v:{spec}} [{ci[0]:{spec}}, {ci[1]:{spec}}]"


def _lre_cell(x: dict | None) -> str:
    """n_known / n_samples, n_test, faithfulness at the fixed beta [95%], at the model beta, the bias-only and
    majority baselines, causality at the train-chosen rank [95%]; degenerate cells marked."""
    if x is None:
        return "not run"
    known = f"{x['n_known']}/{x['n_samples']}"
    if x["faithfulness"] is None:
        return f"{known}: too few known"
    why = lre_authors.degenerate(x)
    deg = f" **degenerate ({why})**" if why else ""
    cap = f", ≤{x['max_causality']} edits/trial" if x.get("max_causality") else ""
    const = (f", tok {_ci(x, 'constant_token_baseline')}" if x.get("constant_token_baseline") is not None
             else "")
    return (f"{known}, n {x['n_test']}×{x.get('n_trials')}: F {_ci(x, 'faithfulness')}, F(β*) "
            f"{_ci(x, 'faithfulness_model_beta')}, β0 {_ci(x, 'faithfulness_bias_only')}, maj "
            f"{_ci(x, 'majority_baseline')}{const}, C {_ci(x, 'causality')} (r {x.get('rank')}{cap}){deg}")


def _lre_all(out: Path) -> dict[str, dict[str, dict]]:
    """Per model, its relation rows; each row gets ``faithfulness_model_beta`` at the model's one beta, chosen on
    the training facts pooled over every relation of both parts (the authors' rule: one beta per model)."""

    res = {m: _lre_rows(out, m) for m in MODELS}
    for rows in res.values():
        if any(r.get("train_faithfulness_by_beta") for r in rows.values()):
            lre_authors.add_model_beta(list(rows.values()))
    return res


def spearman_rows(out: Path, part: str | None = None) -> list[dict]:
    """Per model and reference (GPT-J, LLaMA-13B): Spearman's rho of faithfulness at the model's one beta (chosen
    on training facts, the authors' rule for their published numbers) against theirs, over the non-degenerate
    scored relations both have, with a bootstrap interval and a permutation p-value."""
    from mechfact import stats

    res = _lre_all(out)
    rows = []
    for m in MODELS:
        for k, ref in enumerate(("GPT-J", "LLaMA-13B")):
            pairs = [(x["faithfulness_model_beta"], PUBLISHED[n][k]) for n, x in res[m].items()
                     if (part is None or x["part"] == part) and x.get("faithfulness_model_beta") is not None
                     and not lre_authors.degenerate(x) and n in PUBLISHED and PUBLISHED[n][k] is not None]
            if len(pairs) < 3:
                continue
            s = stats.spearman([a for a, _ in pairs], [b for _, b in pairs], seed=0)
            rows.append({"model": m, "reference": ref, "part": part or "all", **s})
    return rows


def lre_table(out: Path, part: str | None = None) -> str:
    """Every relation of the authors' dataset (or of one ``part``) per model (middle layer), beside what the
    authors published (``PUBLISHED``), then the means over non-degenerate relations and the rank correlations."""
    res = _lre_all(out)
    if part is not None:
        res = {m: {n: x for n, x in r.items() if x["part"] == part} for m, r in res.items()}
    names = sorted({n for r in res.values() for n in r}, key=lambda n: (next(r[n]["part"] for r in res.values()
                                                                              if n in r), n))
    rows = ["| relation | " + " | ".join(f"{m} (layer {LRE_LAYER[m]})" for m in MODELS)
            + " | authors: F GPT-J / LLaMA-13B |",
            "|---|" + "---|" * (len(MODELS) + 1)]
    for n in names:
        rows.append(f"| {n} | " + " | ".join(_lre_cell(res[m].get(n)) for m in MODELS) + f" | {_published(n)} |")

    for m in MODELS:  # means over the non-degenerate relations with a score, intervals over relations
        xs = list(res[m].values())
        if any(x["faithfulness"] is not None for x in xs):
            s = lre_authors.summary(xs)
            mb = next((x.get("model_beta") for x in xs if x.get("model_beta") is not None), None)
            rows.append(f"\n{m}: {s['mean_faithfulness_n']} relations scored and not degenerate "
                        f"({s['n_relations_degenerate']} degenerate) of {len(xs)}; means over them "
                        f"[95% bootstrap over relations]: F at beta {xs[0].get('beta')} "
                        f"{_ci(s, 'mean_faithfulness')}, at the model beta {mb} "
                        f"{_ci(s, 'mean_faithfulness_model_beta')}, "
                        f"bias only {_ci(s, 'mean_faithfulness_bias_only')}, majority object "
                        f"{_ci(s, 'mean_majority_baseline')}, C {_ci(s, 'mean_causality')}")
    rows.append("\n" + paired_table(res))
    rows.append("\n" + relation_tests_table(res))
    family = spearman_family(out)
    sp = [r for r in family if part is None or r["part"] == part]
    if sp:
        rows.append("\nSpearman's rho of F(β*) (one beta per model, chosen on training facts: the authors' rule) at "
                    "the middle layer against the published F (theirs at the layer each relation's causality chose; "
                    "the layer sweep below shows how far the layer moves F), over the non-degenerate relations "
                    "both have; interval: bootstrap over relations; p: permutation test; Holm: adjusted over the "
                    f"family of all {len(family)} such tests on this page (both parts, every model "
                    "and reference), every one listed; partial rho: with the relation's number of test objects "
                    "partialled out (a relation with few objects is easy for any model).")
    for r in sp:
        rows.append(f"\nSpearman {r['model']} vs {r['reference']} ({r['rho_n']} relations): rho {r['rho']:.2f} "
                    f"[{r['rho_ci'][0]:.2f}, {r['rho_ci'][1]:.2f}], permutation p {_p(r['p_value'])}, Holm "
                    f"{_p(r['p_holm'])}; partial rho (objects) "
                    + ("—" if r["partial_rho"] is None else f"{r['partial_rho']:.2f}, p {_p(r['partial_p'])}"))
    return "\n".join(rows)


def spearman_family(out: Path) -> list[dict]:
    """Every Spearman test of the page (both parts, every model, both references) with its Holm-adjusted p and
    the partial rho controlling the relation's number of test objects."""
    from mechfact import stats

    res = _lre_all(out)
    rows = []
    for part in PARTS:
        for r in spearman_rows(out, part):
            xs = [(x["faithfulness_model_beta"], PUBLISHED[n][0 if r["reference"] == "GPT-J" else 1],
                   x.get("n_objects_test")) for n, x in res[r["model"]].items()
                  if x["part"] == part and x.get("faithfulness_model_beta") is not None
                  and not lre_authors.degenerate(x) and n in PUBLISHED
                  and PUBLISHED[n][0 if r["reference"] == "GPT-J" else 1] is not None]
            ok = all(z is not None for _, _, z in xs)
            pr = stats.partial_spearman(*zip(*xs), seed=0) if ok and len(xs) >= 4 else {"rho": None,
                                                                                          "p_value": None}
            rows.append({**r, "partial_rho": pr["rho"], "partial_p": pr["p_value"]})
    for r, p in zip(rows, stats.holm([r["p_value"] for r in rows])):
        r["p_holm"] = p
    return rows


def relation_tests(res: dict) -> list[dict]:
    """Per model and relation (non-degenerate, with the paired outcomes kept: runs that record the best constant
    first token), F(β*) against the best constant first token and against the majority object, each paired on
    the same test facts (bootstrap drawing trials, then subjects), with Holm's adjustment over EVERY such test
    of the page (every model, relation and constant)."""
    from mechfact import stats

    rows = []
    for m in MODELS:
        for n, x in sorted(res[m].items()):
            if lre_authors.degenerate(x) or x.get("faithfulness_model_beta") is None:
                continue
            for base in ("constant_token", "majority"):
                t = x.get(f"faithfulness_model_beta_vs_{base}")
                if t is not None and t[3] is not None:
                    rows.append({"model": m, "relation": n, "base": base, "diff": t[0], "low": t[1],
                                 "high": t[2], "p": t[3]})
    for r, p in zip(rows, stats.holm([r["p"] for r in rows])):
        r["p_holm"] = p
        r["verdict"] = ("beats it" if r["diff"] > 0 else "the constant beats it") if p < 0.05 else \
            "does not beat it"
    return rows


def relation_tests_table(res: dict) -> str:
    rows = relation_tests(res)
    if not rows:
        return ("Per relation, F(β*) against the best constant first token: not in these runs (rows written "
                "before the constant token was recorded; a rerun records it).")
    out = [f"Per relation, paired on the same test facts ({len(rows)} tests: every model, relation and constant; "
           "interval and p from one bootstrap that draws trials, each its own operator, then subjects; Holm over "
           "all of them; F beats a constant when the Holm p < 0.05 and the difference is positive):\n",
           "| model | relation | F(β*) − best constant first token [95%], p, Holm p, verdict | F(β*) − majority "
           "object [95%], p, Holm p, verdict |", "|---|---|---|---|"]
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["relation"]), {})[r["base"]] = r

    def cell(r):
        if r is None:
            return "—"
        return (f"{r['diff']:+.2f} [{r['low']:+.2f}, {r['high']:+.2f}], p {_p(r['p'])}, Holm {_p(r['p_holm'])}, "
                f"{r['verdict']}")
    for (m, n), d in by.items():
        out.append(f"| {m} | {n} | {cell(d.get('constant_token'))} | {cell(d.get('majority'))} |")
    for m in MODELS:
        mine = [r for r in rows if r["model"] == m and r["base"] == "constant_token"]
        if mine:
            k = sum(r["verdict"] == "beats it" for r in mine)
            out.append(f"\n{m}: F(β*) beats the best constant first token on {k} of {len(mine)} relations.")
    return "\n".join(out)


def paired_table(res: dict) -> str:
    """F(β*) against the two constant answers the page has per relation -- the majority object and the bias alone
    (beta 0: the LRE's own constant prediction) -- as PAIRED tests over relations: the mean difference with its
    bootstrap interval and sign-flip p; on each model's own non-degenerate relations and on the relations every
    model scores and none finds degenerate (so the models' means compare like with like)."""
    from mechfact import stats

    ok = {m: {n: x for n, x in res[m].items() if x.get("faithfulness_model_beta") is not None
              and not lre_authors.degenerate(x) and x.get("majority_baseline") is not None}
          for m in MODELS}
    common = sorted(set.intersection(*(set(v) for v in ok.values()))) if all(ok.values()) else []
    lines, tests = [], []  # each row's cells: a test (an index into ``tests``) or a note
    for label, pick in (("own", lambda m: sorted(ok[m])), ("common", lambda m: common)):
        for m in MODELS:
            names = pick(m)
            if len(names) < 2:
                continue
            f = [ok[m][n]["faithfulness_model_beta"] for n in names]
            cells = []
            for key in ("constant_token_baseline", "majority_baseline", "faithfulness_bias_only"):
                if any(ok[m][n].get(key) is None for n in names):
                    cells.append("not in these runs")
                    continue
                tests.append(stats.paired_difference(f, [ok[m][n][key] for n in names], seed=0))
                cells.append(len(tests) - 1)
            lines.append((m, f"{len(names)} ({label})", stats.bootstrap(f, seed=0), cells))
    holm = stats.holm([d["p_value"] for d in tests]) if tests else []
    rows = ["Paired tests over relations (the mean difference with its 95% bootstrap interval; p: sign-flip "
            f"permutation test, two-sided; Holm: adjusted over the {len(tests)} tests of this table; F beats the "
            "constant when the Holm p < 0.05 and the difference is positive, the constant beats F when it is "
            "negative, else F does not beat it; the best constant first token is what one token answered for every "
            "fact gets under the first-token match F is scored by, the fair constant for that score; the "
            "per-relation tests follow):\n",
            "| model | relations | F(β*) mean [95%] | F(β*) − best constant first token [95%], p, Holm, verdict | "
            "F(β*) − majority object [95%], p, Holm, verdict | F(β*) − bias alone [95%], p, Holm, verdict |",
            "|---|---|---|---|---|---|"]

    def cell(c) -> str:
        if isinstance(c, str):
            return c
        d, ph = tests[c], holm[c]
        said = ("does not beat it" if ph is None or ph >= 0.05 else
                "beats it" if d["diff"] > 0 else "the constant beats it")
        return (f"{d['diff']:+.2f} [{d['diff_ci'][0]:+.2f}, {d['diff_ci'][1]:+.2f}], p {_p(d['p_value'])}, Holm "
                f"{_p(ph)}, {said}")
    for m, n, mean, cells in lines:
        rows.append(f"| {m} | {n} | {mean.value:.2f} [{mean.low:.2f}, {mean.high:.2f}] | "
                    + " | ".join(cell(c) for c in cells) + " |")
    return "\n".join(rows)


def _published(name: str) -> str:
    if name not in PUBLISHED:
        return ""
    return " / ".join("failed" if v is None else f"{v:.2f}" for v in PUBLISHED[name])


def lre_sweep_table(out: Path) -> str:
    """Per swept relation: F (train beta) and C (train rank) at every layer (point values), the layers the
    training facts chose for each with the score there [95%], and F at the fixed beta at the causality-chosen
    layer (the authors' rule for their published numbers), beside maj: what a constant answer (the most common test
    object) scores, with its interval."""
    rows = ["| relation | model | n | F (train beta) by layer | C (train rank) by layer | chosen on training facts: "
            "F layer: F [95%] / C layer: C [95%] | F at the fixed beta, C layer (the authors' rule) | maj |",
            "|---|---|---|---|---|---|---|---|"]
    cells = {m: _lre_rows(out, m, "layers") for m in MODELS}
    names = list(dict.fromkeys(n for m in MODELS for n in cells[m]))  # each relation's models side by side
    for n, m in ((n, m) for n in names for m in MODELS if n in cells[m]):
        x = cells[m][n]
        if not x.get("by_layer"):
            continue
        f = ", ".join(f"{b['layer']}: {b['faithfulness_train_beta']:.2f}" for b in x["by_layer"]
                      if b.get("faithfulness_train_beta") is not None)
        c = ", ".join(f"{b['layer']}: {b['causality']:.2f}" if b.get("causality") is not None
                      else f"{b['layer']}: —" for b in x["by_layer"])
        at_c = next((b.get("faithfulness") for b in x["by_layer"] if b["layer"] == x.get("edit_layer")), None)
        cap = f", ≤{x['max_causality']} edits/trial" if x.get("max_causality") else ""
        rows.append(f"| {n} | {m} | {x['n_test']}×{x.get('n_trials')}{cap} | {f} | {c} | {x['layer']}: "
                    f"{_ci(x, 'faithfulness_train_beta')} / {x.get('edit_layer')}: {_ci(x, 'causality')} | "
                    + ("—" if at_c is None else f"{at_c:.2f} (beta {x.get('beta')})")
                    + f" | {_ci(x, 'majority_baseline')} |")
    return "\n".join(rows)


def lre_figure(out: Path, path: Path) -> None:
    """Faithfulness (fixed beta) and causality (rank chosen on training facts) per relation with 95% intervals,
    the three models side by side (middle layer); degenerate relations hatched."""
    from mechfact.plotting import save, subplots

    res = _lre_all(out)
    names = sorted({n for r in res.values() for n in r if r[n]["faithfulness"] is not None})
    if not names:
        return
    fig, axes = subplots(1, 2, figsize=(11.0, 1.5 + 0.28 * len(names)), sharey=True, layout="constrained")
    y = np.arange(len(names))
    for ax, key, title in ((axes[0], "faithfulness", "LRE faithfulness (fixed beta)"),
                           (axes[1], "causality", "LRE causality (rank chosen on training facts)")):
        for k, m in enumerate(MODELS):
            if not res[m]:  # this model's LRE has not been run: no bars, no "not scored" labels
                ax.barh([], [], color=COLORS[m], label=f"{m} (not run)")
                continue
            xs = [res[m].get(n) or {} for n in names]
            v = [x.get(key) for x in xs]
            err = np.zeros((2, len(v)))
            for i, x in enumerate(xs):
                ci = x.get(f"{key}_ci")
                if v[i] is not None and ci and ci[0] is not None:
                    err[:, i] = [v[i] - ci[0], ci[1] - v[i]]
            ax.barh(y + (k - 1) * 0.27, [0 if a is None else a for a in v], 0.27, xerr=err, color=COLORS[m],
                    label=m, hatch=["//" if x and lre_authors.degenerate(x) else "" for x in xs], error_kw={"lw": 0.6})
            for i, a in enumerate(v):  # no score (too few known facts, no edit target): say so, unlike a 0
                if a is None:
                    ax.text(0.005, y[i] + (k - 1) * 0.27, "not scored", fontsize=5, color=COLORS[m], va="center")
        ax.set_xlim(0, 1)
        ax.set_title(title, fontsize=9)
        ax.grid(axis="x", lw=0.3)
    axes[0].set_yticks(y, names, fontsize=7)
    axes[0].invert_yaxis()
    axes[0].legend(fontsize=7, loc="lower right")
    save(fig, path)


def trials24_section(out: Path) -> str:
    """The faithfulness-only runs at 24 trials (:data:`TRIALS24`): F(β*) against the best constant first token
    and the majority object, over relations and per relation, paired on the same facts."""
    res = {m: {} for m in MODELS}
    for m, part in TRIALS24:
        r = _read(out / m / f"lre_trials24_{part}" / "result.json")
        res[m].update({x["relation"]: {**x, "part": part} for x in (r or {}).get("per_relation", [])})
    if not any(res.values()):
        return "Not run yet (`--run` makes them)."
    lines = []
    for m in MODELS:
        if res[m]:
            mb = lre_authors.add_model_beta(list(res[m].values()))
            n_ok = sum(x.get("faithfulness") is not None and not lre_authors.degenerate(x) for x in res[m].values())
            lines.append(f"{m}: {len(res[m])} relations run ({', '.join(p for mm, p in TRIALS24 if mm == m)}), "
                         f"{n_ok} scored and not degenerate; the model's beta {mb}, chosen on the training facts "
                         "of these relations; intervals draw trials (each its own split, prompt and operator), "
                         "then subjects.")
    rows = ["| relation | " + " | ".join(f"{m}: n, F(β*) [95%], best constant token [95%] (token), majority "
                                         "[95%]" for m in MODELS if res[m]) + " |",
            "|---|" + "---|" * sum(bool(res[m]) for m in MODELS)]
    for n in sorted({n for r in res.values() for n in r}):
        cells = []
        for m in (m for m in MODELS if res[m]):
            x = res[m].get(n)
            if x is None or x.get("faithfulness") is None:
                cells.append("not run" if x is None else f"{x['n_known']}/{x['n_samples']}: too few known")
                continue
            toks = sorted({t.get("constant_token") for t in x["trials"] if not t.get("skipped")} - {None})
            deg = " **degenerate**" if lre_authors.degenerate(x) else ""
            cells.append(f"{x['n_test']}×{x['n_trials']}: {_ci(x, 'faithfulness_model_beta')}, "
                         f"{_ci(x, 'constant_token_baseline')} ({', '.join(repr(t) for t in toks[:3])}"
                         f"{', …' if len(toks) > 3 else ''}), {_ci(x, 'majority_baseline')}{deg}")
        rows.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(["\n".join(lines), "", *rows, "", paired_table(res), "", relation_tests_table(res)])


def _best_rank(x: dict) -> str:
    """The rank best on the scored test facts and its C (an upper bound: chosen on the facts it scores)."""
    by = {int(k): v for k, v in (x.get("causality_by_rank") or {}).items() if v is not None}
    if not by:
        return "—"
    k = max(by, key=lambda r: (by[r], -r))
    return f"rank {k}: {by[k]:.2f}"


def _drawn(x: dict) -> str:
    """" (subjects)" where a row's intervals draw subjects alone (written before they drew trials, then subjects)."""
    return "" if x.get("intervals") == "trials+subjects" else " (subjects)"


def rank_grid_section(out: Path) -> str:
    """The authors' edit-rank grid (:data:`probes.families.RANK_GRID` runs) beside the default grid of the
    authors'-protocol run on the same relations, layer, trials and edits: C at the rank chosen on training facts on
    each grid, the best-on-test upper bound of each, and the largest difference at the ranks both grids hold (0
    where the two runs made the same edits)."""
    rows = ["| relation | model | n | default grid (16, 32, 64, 128, 256, full): rank chosen on training facts: C "
            "[95%] | best on test (upper bound) | authors' grid (0 to 312 by 8): rank chosen on training facts: C "
            "[95%] | best on test (upper bound) | C, authors' minus default | largest difference at the ranks both "
            "hold |", "|---|---|---|---|---|---|---|---|---|"]
    n_rows, scored = 0, []  # (same rank chosen, C difference) of each relation scored on both grids
    for m in dict.fromkeys(m for m, _ in RANK_GRID):  # each model's runs read once
        parts = {p for mm, p in RANK_GRID if mm == m}
        grid, base = _lre_rows(out, m, "ranks"), _lre_rows(out, m, "authors")
        for name, x in grid.items():
            if x["part"] not in parts:
                continue
            a = base.get(name)
            n_rows += 1
            if x.get("causality") is None or a is None or a.get("causality") is None:
                rows.append(f"| {name} | {m} | {x['n_known']}/{x['n_samples']} known | "
                            + ("not scored | | | | | |" if a is None or a.get("causality") is None
                               else "| | not scored | | | |"))
                continue
            cap = x.get("max_causality")
            shared = sorted(set(x["causality_by_rank"]) & set(a["causality_by_rank"]), key=int)
            diffs = [abs(x["causality_by_rank"][k] - a["causality_by_rank"][k]) for k in shared
                     if x["causality_by_rank"][k] is not None and a["causality_by_rank"][k] is not None]
            scored.append((x["rank"] == a["rank"], x["causality"] - a["causality"]))
            rows.append(f"| {name} | {m} | {x['n_test']}×{x['n_trials']}"
                        f"{f', ≤{cap} edits/trial' if cap is not None else ''} | "
                        f"rank {a['rank']}: {_ci(a, 'causality')}{_drawn(a)} | {_best_rank(a)} | "
                        f"rank {x['rank']}: {_ci(x, 'causality')}{_drawn(x)} | {_best_rank(x)} | "
                        f"{x['causality'] - a['causality']:+.2f} | "
                        + (f"{max(diffs):.3f} (ranks {', '.join(shared)})" if diffs else "none shared") + " |")
    if not n_rows:
        return "Not run yet (`--run` makes them)."
    if scored:
        rows += ["", f"The training facts choose the same rank on both grids on {sum(s for s, _ in scored)} of "
                     f"{len(scored)} relations; C at the chosen rank differs by at most "
                     f"{max(abs(d) for _, d in scored):.2f}."]
    return "\n".join(rows)
