"""Three real model families side by side: readout, LRE (the authors' protocol), superposition.

    python -m probes.families --run --relations DIR   # runs every missing part into runs/fam (hours on 2 CPU cores)
    python -m probes.families                         # tables (markdown) + figures, from the run folders alone
    python -m probes.families --run --relations DIR --resume-from docs/runs/fam   # continue the shipped runs

``DIR`` is the LRE authors' data folder (github evandez/relations, ``data/``: ``factual/`` and ``linguistic/``).
What it runs, per packaged model (``mechfact llm models``; install lines in the README):

* ``mechfact llm probe --layers all --k-shot 3 --max-samples 40`` (the 14 shipped relations);
* ``mechfact llm lre --relations DIR/{factual,linguistic}``: the authors' protocol with its defaults (whole
  relation files, 8 trials, fixed beta 2.25, rank chosen on training facts) at the middle layer, and a layer
  sweep (``--layers``; faithfulness and edit layers chosen on training facts) on the relations of ``SWEEP``, its
  causality edits capped at ``SWEEP_MAX_CAUSALITY`` per trial and layer (``--max-causality``);
* ``mechfact llm superposition`` on the shipped countries at every ``STRIDE``-th layer.

Run folders: ``runs/fam/<model>/{probe,lre_authors_factual,lre_authors_linguistic,lre_layers_<part>,superposition}``.
Reruns skip finished runs (and a stopped run resumes relation by relation). Every number printed comes from
these run folders; a part split over several processes (``lre_authors_<part>_*``, each with its own
``--relation-names``) is read as one, and ``--run`` finishes it without running a relation twice
(:func:`lre_part_jobs`). (One script of ~470 lines: running the parts, reading them back and
writing the page share the run-folder layout, so they stay together.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from mechfact.llm import lre_authors

MODELS = ("smollm2-135m-instruct", "gemma3-270m", "qwen2.5-coder-0.5b-instruct")
PARTS = ("factual", "linguistic")  # folders of the LRE authors' data/ (github evandez/relations)
SWEEP = {"factual": ("country capital city", "person native language", "landmark on continent"),
         "linguistic": ("adjective comparative", "word first letter")}
# Qwen's: ~20 min a relation on one CPU core
SWEEP_MODELS = ("smollm2-135m-instruct", "gemma3-270m", "qwen2.5-coder-0.5b-instruct")
SWEEP_LAYERS = {"smollm2-135m-instruct": "3,9,15,21,25", "gemma3-270m": "2,5,9,12,15",
                "qwen2.5-coder-0.5b-instruct": "2,7,12,16,20"}
STRIDE = {"smollm2-135m-instruct": "0,3,6,9,12,15,18,21,24,27,29", "gemma3-270m": "0,2,4,6,8,10,12,14,16,17",
          "qwen2.5-coder-0.5b-instruct": "0,3,6,9,12,15,18,21,23"}
# Faithfulness-only runs at the paper's 24 trials (no edits: --max-causality 0), where every test fact's outcome
# is kept for the per-relation paired tests against the constants: (model, part)
TRIALS24 = (("smollm2-135m-instruct", "factual"),)
SWEEP_MAX_CAUSALITY = 64  # the sweep's edits per trial and layer: edits are most of its cost on a known relation
LRE_LAYER = {"smollm2-135m-instruct": 15, "gemma3-270m": 9,
             "qwen2.5-coder-0.5b-instruct": 12}  # n_layers // 2, the default
# The authors' LRE faithfulness (recall@1, in-context prompt) per relation for GPT-J and LLaMA-13B, as stored in
# their repository evandez/relations, notebooks/figures/relation_order_{gptj,llama-13b}.json (commit 093c389),
# the data of their relation-wise faithfulness figure; LLaMA's president relations failed in their sweep (None).
PUBLISHED = {  # relation: (GPT-J, LLaMA-13B)
    "company CEO": (0.06, 0.02), "person father": (0.07, 0.02), "person mother": (0.14, 0.01),
    "pokemon evolution": (0.15, 0.07), "company hq": (0.21, 0.30), "superhero archnemesis": (0.30, 0.16),
    "product by company": (0.31, 0.59), "landmark in country": (0.36, 0.62), "star constellation name": (0.41, 0.08),
    "person sport position": (0.42, 0.64), "superhero person": (0.44, 0.31), "city in country": (0.44, 0.55),
    "person occupation": (0.49, 0.60), "food from country": (0.51, 0.71), "president election year": (0.52, None),
    "president birth year": (0.54, None), "landmark on continent": (0.56, 0.69), "word last letter": (0.57, 0.39),
    "country currency": (0.58, 0.32), "word first letter": (0.58, 0.85), "person plays instrument": (0.59, 0.41),
    "person lead singer of band": (0.64, 0.68), "person university": (0.64, 0.19),
    "person native language": (0.65, 0.88), "adjective antonym": (0.69, 0.45), "plays pro sport": (0.75, 0.84),
    "country capital city": (0.88, 0.65), "country language": (0.88, 0.88), "country largest city": (0.92, 0.58),
    "adjective superlative": (0.93, 0.83), "verb past tense": (0.95, 0.92), "adjective comparative": (0.98, 0.90),
}
COLORS = {"smollm2-135m-instruct": "tab:blue", "gemma3-270m": "tab:orange", "qwen2.5-coder-0.5b-instruct": "tab:green"}


def _read(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def run(out: Path, data: Path) -> None:
    cli = [sys.executable, "-m", "mechfact.cli"]
    for m in MODELS:
        jobs = [(out / m / "probe", ["llm", "probe", "--model", m, "--layers", "all", "--k-shot", "3",
                                      "--max-samples", "40"])]
        lre = ["llm", "lre", "--model", m]
        for part in PARTS:
            jobs += lre_part_jobs(out, m, part, data)
        for part in PARTS if m in SWEEP_MODELS else ():
            jobs.append((out / m / f"lre_layers_{part}", lre + ["--relations", str(data / part), "--relation-names",
                                                                 *SWEEP[part], "--layers", SWEEP_LAYERS[m],
                                                                 "--max-causality", str(SWEEP_MAX_CAUSALITY)]))
        for part in (p for mm, p in TRIALS24 if mm == m):
            jobs.append((out / m / f"lre_trials24_{part}", lre + ["--relations", str(data / part), "--trials", "24",
                                                                   "--max-causality", "0"]))
        jobs.append((out / m / "superposition", ["llm", "superposition", "--model", m, "--layers", STRIDE[m]]))
        jobs.append((out / m / "superposition_words", ["llm", "superposition", "--model", m, "--layers", STRIDE[m],
                                                       "--prompt", "words"]))
        for folder, argv in jobs:
            if (folder / "meta.json").is_file() and not _stale_rows(folder, argv):
                continue
            subprocess.run(cli + argv + ["--threads", "1", "--quiet", "--out", str(folder)], check=True)


def _stale_rows(folder: Path, argv: list[str]) -> bool:
    """A finished superposition run whose rows an earlier version wrote: the command resumes it, recomputing
    those rows (the LRE and readout runs have no row format: finished is finished)."""
    from mechfact.llm.superposition_stats import ROW_FORMAT

    if argv[:2] != ["llm", "superposition"]:
        return False
    rows = (_read(folder / "result.json") or {}).get("per_layer", [])
    return any(r.get("format") != ROW_FORMAT for r in rows)


# LreConfig fields a split part's folder may set, and their flags (the rest must be at their defaults)
_LRE_FLAGS = {"relation_names": "--relation-names", "max_causality": "--max-causality", "n_trials": "--trials",
              "max_samples": "--max-samples", "max_test": "--max-test", "n_train": "--n-train", "beta": "--beta",
              "layer": "--layer", "layers": "--layers", "ranks": "--ranks", "k_shot": "--k-shot",
              "template": "--template", "facts": "--facts"}


def _lre_args(folder: Path) -> list[str]:
    """The ``mechfact llm lre`` flags (beyond --model, --relations, --out) that rebuild ``folder``'s config."""
    from mechfact.llm.lre import LreConfig

    cfg, default = (_read(folder / "config.json") or {}).get("config") or {}, LreConfig().to_dict()
    args = []
    for k, v in cfg.items():
        if k in ("model", "relations") or v == default.get(k, v):
            continue
        if k not in _LRE_FLAGS:
            raise ValueError(f"{folder}: config field {k} = {v!r} has no flag here; resume it by hand")
        vals = v if k == "relation_names" else [",".join(map(str, v))] if isinstance(v, list) else [str(v)]
        args += [_LRE_FLAGS[k], *vals]
    return args


def lre_part_jobs(out: Path, m: str, part: str, data: Path) -> list[tuple[Path, list[str]]]:
    """The runs that finish model ``m``'s authors'-protocol LRE on ``data/part``.

    Unsplit (no ``lre_authors_<part>_*`` folder): the one folder of the whole part. Split over several folders
    (as the shipped runs are): each unfinished folder resumes with its own config when every relation it still
    asks for is held by no other folder; a relation that no folder holds and none of those will run goes to
    ``lre_authors_<part>_capped`` (causality capped at ``SWEEP_MAX_CAUSALITY`` edits per trial, as the shipped
    large files), so no relation runs twice."""
    from mechfact.llm.relations import load_relations

    base = out / m / f"lre_authors_{part}"
    lre = ["llm", "lre", "--model", m, "--relations", str(data / part)]
    folders = [f for f in [base, *sorted((out / m).glob(f"{base.name}_*"))] if (f / "config.json").is_file()]
    if folders == [base] or not folders:
        return [(base, lre)]
    every = [r.name for r in load_relations(str(data / part))]
    rows = {f: {x["relation"] for x in (_read(f / "result.json") or {}).get("per_relation", [])} for f in folders}
    held = set().union(*rows.values())
    jobs, coming = [], set()
    for f in folders:
        if (f / "meta.json").is_file():
            continue
        asked = ((_read(f / "config.json") or {}).get("config") or {}).get("relation_names") or every
        left = set(asked) - rows[f]
        if left and not left & held and not left & coming:
            jobs.append((f, lre + _lre_args(f)))
            coming |= left
    missing = [r for r in every if r not in held and r not in coming]
    if missing:
        rest = out / m / f"{base.name}_capped"
        k = 2
        while (rest / "config.json").is_file():
            rest, k = out / m / f"{base.name}_capped{k}", k + 1
        jobs.append((rest, lre + ["--relation-names", *missing, "--max-causality", str(SWEEP_MAX_CAUSALITY)]))
    return jobs


RUN_FILES = ("config.json", "result.json", "meta.json", ".elapsed.json")  # .elapsed.json: an unfinished run's time
DATA_NAME = "evandez-relations/data"  # what an exported config says in place of this machine's data folder


def _portable(x, roots: set[str]):
    """``x`` with every string naming a relations data folder (a ``roots`` path) rewritten to ``DATA_NAME/...``."""
    if isinstance(x, dict):
        return {k: _portable(v, roots) for k, v in x.items()}
    if isinstance(x, list):
        return [_portable(v, roots) for v in x]
    if isinstance(x, str) and x in roots:
        return f"{DATA_NAME}/{Path(x).name}"
    return x


def export(out: Path, dest: Path) -> int:
    """Copies every run folder's JSON files (not figures or caches) and its trial checkpoints (a relation stopped
    part way) from ``out`` to ``dest`` with the same layout,
    the relations data paths in configs written as ``DATA_NAME/<part>``: the numbers a clone rebuilds the page
    from. Returns the number of files written."""
    from mechfact.runs import atomic_path

    n = 0
    for folder in sorted(p for p in out.glob("*/*") if (p / "result.json").is_file()):
        cfg = _read(folder / "config.json") or {}
        rel = (cfg.get("config", cfg) or {}).get("relations")
        rels = rel if isinstance(rel, list) else [rel]  # one source, or several (trace: shipped + a data folder)
        roots = {r for r in rels if isinstance(r, str) and Path(r).name in PARTS}
        for name in RUN_FILES:
            if (folder / name).is_file():
                target = dest / folder.relative_to(out) / name
                target.parent.mkdir(parents=True, exist_ok=True)
                with atomic_path(target) as tmp:
                    tmp.write_text(json.dumps(_portable(_read(folder / name), roots), indent=1) + "\n")
                n += 1
        n += _copy_trials(folder, dest / folder.relative_to(out))
    return n


def _copy_trials(src: Path, dst: Path) -> int:
    """Copies a run's trial checkpoints (``trials/*.npz``: a relation stopped part way, kept trial by trial) and
    drops those ``src`` no longer has (the relation finished); returns the number copied."""
    from mechfact.llm.lre import TRIALS_DIR
    from mechfact.runs import atomic_path

    have = {f.name: f for f in sorted((src / TRIALS_DIR).glob("*.npz"))}
    for old in (dst / TRIALS_DIR).glob("*.npz"):
        if old.name not in have:
            old.unlink()
    for name, f in have.items():
        with atomic_path(dst / TRIALS_DIR / name) as tmp:
            tmp.write_bytes(f.read_bytes())
    if (dst / TRIALS_DIR).is_dir() and not have:
        (dst / TRIALS_DIR).rmdir()
    return len(have)


def resume_shipped(shipped: Path, out: Path, data: Path) -> list[str]:
    """Copies the run folders of ``shipped`` (written by :func:`export`, e.g. docs/runs/fam) that ``out`` lacks
    into ``out``, each ``DATA_NAME/<part>`` written back as ``data/<part>`` and each result's config hash
    recomputed for the config that now names ``data``: the configs are otherwise the shipped ones, so ``--run``
    then skips the shipped finished runs and continues a stopped one relation by relation, instead of starting
    over. Folders already in ``out`` are left as they are. Returns the folders copied (``<model>/<run>``)."""
    from mechfact.runs import config_sha256, write_json_atomic

    def local(x):
        if isinstance(x, dict):
            return {k: local(v) for k, v in x.items()}
        if isinstance(x, list):
            return [local(v) for v in x]
        if isinstance(x, str) and x.startswith(DATA_NAME + "/") and x[len(DATA_NAME) + 1:] in PARTS:
            return str(data / x[len(DATA_NAME) + 1:])
        return x

    copied = []
    for folder in sorted(p for p in shipped.glob("*/*") if (p / "result.json").is_file()):
        target = out / folder.relative_to(shipped)
        if target.exists():
            continue
        files = {name: local(_read(folder / name)) for name in RUN_FILES if (folder / name).is_file()}
        if "config.json" in files and isinstance(files["result.json"], dict) \
                and "config_sha256" in files["result.json"]:
            files["result.json"]["config_sha256"] = config_sha256(files["config.json"])
        _copy_trials(folder, target)  # a relation stopped part way resumes at its next trial
        for name, value in files.items():  # result.json last: a folder with it is a run (see the glob above)
            if name != "result.json":
                write_json_atomic(target / name, value)
        write_json_atomic(target / "result.json", files["result.json"])
        copied.append(str(folder.relative_to(shipped)))
    return copied


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


def _lre_rows(out: Path, m: str, kind: str = "authors") -> dict[str, dict]:
    """Rows of ``lre_<kind>_<part>`` and of its siblings ``lre_<kind>_<part>_*`` (one part split over several
    processes, each with its own --relation-names)."""
    rows = {}
    for part in PARTS:
        for folder in [out / m / f"lre_{kind}_{part}", *sorted((out / m).glob(f"lre_{kind}_{part}_*"))]:
            r = _read(folder / "result.json")
            rows.update({x["relation"]: {**x, "part": part} for x in (r or {}).get("per_relation", [])})
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


def _p(p) -> str:
    return "—" if p is None else f"{p:.3f}" if p >= 0.001 else "< 0.001"  # never a printed 0.000


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


SUPERPOSITION_RUNS = {"superposition": "the subject alone after BOS", "superposition_words":
                      "'Some facts about {subject}'"}


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


def _relation_names(folder: Path) -> set[str]:
    """The relations a run folder holds or was asked for (its config's ``relation_names``)."""
    names = {x["relation"] for x in (_read(folder / "result.json") or {}).get("per_relation", [])}
    asked = ((_read(folder / "config.json") or {}).get("config") or {}).get("relation_names") or []
    return names | set(asked)


def _part_folders(out: Path, m: str, name: str) -> list[Path]:
    siblings = sorted((out / m).glob(f"{name}_*")) if name.startswith("lre_") else []
    return [f for f in [out / m / name, *siblings] if (f / "result.json").is_file()]


def _part_status(out: Path, m: str, name: str) -> str:
    """finished / partial / not run, over the folder and its ``<name>_*`` siblings (a part split over several
    processes); LRE parts say how many relations their folders hold, of all those any model's folders of the part
    hold or were asked for."""
    folders = _part_folders(out, m, name)
    if not folders:
        return "not run"
    done = all((f / "meta.json").is_file() for f in folders)
    state = "finished" if done else "partial (stopped or running; rerun --run to resume)"
    kept = _kept(folders) if name.startswith("lre_") else []  # relations kept part way: (name, done, asked)
    if name.startswith("lre_"):
        rels = [[x["relation"] for x in (_read(f / "result.json") or {}).get("per_relation", [])] for f in folders]
        n, held = sum(map(len, rels)), set().union(*map(set, rels))
        every = set().union(*[_relation_names(f) for mm in MODELS for f in _part_folders(out, mm, name)],
                            [rel for rel, _, _ in kept])  # a relation kept part way has not finished
        if name.startswith("lre_trials24_"):  # its part's relations: those of the part's full runs
            part = name.removeprefix("lre_trials24_")
            every |= set().union(*[_relation_names(f) for mm in MODELS
                                   for f in _part_folders(out, mm, f"lre_authors_{part}")])
        if len(held) >= len(every) and not done:  # a stopped folder whose relations left ran in another
            stopped = sum(not (f / "meta.json").is_file() for f in folders)
            state = (f"finished ({stopped} folder stopped early, what it left ran in another)" if stopped == 1 else
                     f"finished ({stopped} folders stopped early, what they left ran in others)")
        if n < len(every):
            state = (f"{state}, {n} of {len(every)} relations" if not done
                     else f"{n} of {len(every)} relations (the rest not run)")
        else:
            state += f", {n} relations"
    return (state + (f", {len(folders)} folders" if len(folders) > 1 else "")
            + "".join(f"; {rel} at {k} of {t} trials" for rel, k, t in kept))


def _kept(folders: list[Path]) -> list[tuple[str, int, int]]:
    """(relation, finished trials, trials asked for) of each relation the folders keep part way (its trial
    checkpoint; an unreadable one left out)."""
    from mechfact.llm.lre import TRIALS_DIR
    from mechfact.llm.lre_authors import trials_kept

    kept = [trials_kept(f) for folder in folders for f in sorted((folder / TRIALS_DIR).glob("*.npz"))]
    return [k for k in kept if k is not None]


def runs_status(out: Path) -> str:
    """Which run folders exist: every table below says what it rests on."""
    names = ["probe", *[f"lre_authors_{p}" for p in PARTS], *[f"lre_layers_{p}" for p in PARTS],
             *dict.fromkeys(f"lre_trials24_{p}" for _, p in TRIALS24), *SUPERPOSITION_RUNS]
    rows = ["| run | " + " | ".join(MODELS) + " |", "|---|" + "---|" * len(MODELS)]
    for n in names:
        planned = {m for m, p in TRIALS24 if n == f"lre_trials24_{p}"} if n.startswith("lre_trials24_") else MODELS
        rows.append(f"| {n} | " + " | ".join(_part_status(out, m, n) if m in planned else "not planned"
                                             for m in MODELS) + " |")
    return "\n".join(rows)


DOC_HEAD = """# Relational linearity in pretrained LLMs: SmolLM2-135M-Instruct, Gemma-3-270M (base), Qwen2.5-Coder-0.5B-Instruct

This page is written by `python -m probes.families --out docs/runs/fam --doc docs/results_llm.md` from the run
files under `docs/runs/fam` alone: the configs, results and metadata of the run folders that
`python -m probes.families --run --relations PATH` makes under `runs/fam` (PATH: the LRE authors' `data/` folder
from github evandez/relations), copied there by `python -m probes.families --out runs/fam --export docs/runs/fam`.
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
`≤K edits/trial`: K of them, taken round-robin over objects, `--max-causality K`, for the largest files on the
slower models). Intervals: bootstrap over subjects (cells; runs that record the best constant token draw
trials, each its own operator, then subjects) or over relations (means).
`n a×b`: a test facts per trial, b trials. Degenerate relations (every test fact one object, or the bias alone
right on every test fact: a constant answer scores 1.00) are marked and left out of the means.
"""


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


def write_doc(out: Path, path: Path) -> None:
    """The whole results page from the run folders in ``out`` (figures next to it in ``img/``)."""
    from probes.tracing_study import models_legend

    parts = [DOC_HEAD, models_legend(MODELS), "## Runs behind this page\n", runs_status(out), ""]
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/fam")
    ap.add_argument("--run", action="store_true", help="run what is missing first")
    ap.add_argument("--export", default=None, metavar="DIR", help="copy the run folders' JSON files (configs, "
                    "results, meta; no figures) to DIR, e.g. docs/runs/fam, where --out DIR rebuilds the page")
    ap.add_argument("--figure", default="docs/img/families.png")
    ap.add_argument("--lre-figure", default="docs/img/families_lre.png")
    ap.add_argument("--doc", default=None, metavar="MD", help="write the whole results page there (e.g. "
                    "docs/results_llm.md) instead of printing the tables")
    ap.add_argument("--relations", default=None, metavar="DIR",
                    help="with --run: the LRE authors' data folder (github evandez/relations, data/), holding "
                         "factual/ and linguistic/")
    ap.add_argument("--resume-from", default=None, metavar="DIR",
                    help="with --run: first copy the exported runs in DIR (e.g. docs/runs/fam) that --out lacks, "
                         "so the shipped finished runs are skipped and a shipped unfinished one continues")
    a = ap.parse_args(argv)
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
    if a.export:
        print(f"{export(out, Path(a.export))} files copied from {out} to {a.export}")
    if a.doc:
        write_doc(out, Path(a.doc))
        print(f"{a.doc} written from {out}")
    else:
        print(readout_table(out), "\n")
        for part in PARTS:
            print(lre_table(out, part), "\n")
        print(lre_sweep_table(out), "\n")
        for n in SUPERPOSITION_RUNS:
            print(superposition_table(out, n))
    figure(out, Path(a.figure))
    lre_figure(out, Path(a.lre_figure))


if __name__ == "__main__":
    main()
