"""Three real model families side by side: readout, LRE (the authors' protocol), superposition.

    python -m probes.families --run            # runs every missing part into runs/fam (hours on 2 CPU cores)
    python -m probes.families                  # tables (markdown) + docs/img/families.png from finished runs

What it runs, per packaged model (``mechfact llm models``; install lines in the README):

* ``mechfact llm probe --layers all --k-shot 3 --max-samples 40`` (the 14 shipped relations);
* ``mechfact llm lre --relations ../shared/data/lre/{factual,linguistic} --max-samples 50 --max-test 10``
  (the authors' protocol, 3 trials (1 where ``TRIALS`` says so), every one of their 32 relations at the middle
  layer; external data, read in place), and a layer sweep (``--layers``, 1 trial, 3-set known filter) on the
  relations of ``SWEEP`` for ``SWEEP_MODELS``;
* ``mechfact llm superposition`` on the shipped countries at every ``STRIDE``-th layer, 2 splits.

Run folders: ``runs/fam/<model>/{probe,lre_authors_factual,lre_authors_linguistic,lre_layers_<part>,superposition}``.
Reruns skip finished runs (and a stopped run resumes relation by relation). ``--previous docs/results_llm.md``
fills the LRE cells of runs that are not in ``--out`` from the tables of an earlier write-up (the record of runs
made on another machine), so the table and figure cover every family.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-0.5b")
PARTS = ("factual", "linguistic")  # folders of ../shared/data/lre
SWEEP = {"factual": ("country capital city", "person native language", "landmark on continent"),
         "linguistic": ("adjective comparative", "word first letter")}
# trials of the LRE estimate where 3 did not fit the time: the known filter keeps 3 example sets (--filter-trials 3),
# so the known facts and the one trial are those of the 3-trial run (Qwen's factual part: ~45 s a Jacobian)
ONE_TRIAL = ["--trials", "1", "--filter-trials", "3"]
TRIALS = {("qwen2.5-0.5b", "factual"): ONE_TRIAL}
SWEEP_MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-0.5b")  # Qwen's: ~20 min a relation on one CPU core
SWEEP_LAYERS = {"smollm2-135m": "3,9,15,21,25", "gemma3-270m": "2,5,9,12,15", "qwen2.5-0.5b": "2,7,12,16,20"}
STRIDE = {"smollm2-135m": "0,3,6,9,12,15,18,21,24,27,29", "gemma3-270m": "0,2,4,6,8,10,12,14,16,17",
          "qwen2.5-0.5b": "0,3,6,9,12,15,18,21,23"}
LRE_DATA = Path("..") / "shared" / "data" / "lre"
LRE_LAYER = {"smollm2-135m": 15, "gemma3-270m": 9, "qwen2.5-0.5b": 12}  # n_layers // 2, the default
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
COLORS = {"smollm2-135m": "tab:blue", "gemma3-270m": "tab:orange", "qwen2.5-0.5b": "tab:green"}


def _read(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def run(out: Path) -> None:
    cli = [sys.executable, "-m", "mechfact.cli"]
    for m in MODELS:
        jobs = [(out / m / "probe", ["llm", "probe", "--model", m, "--layers", "all", "--k-shot", "3",
                                      "--max-samples", "40"])]
        lre = ["llm", "lre", "--model", m, "--max-samples", "50", "--max-test", "10"]
        for part in PARTS:
            jobs.append((out / m / f"lre_authors_{part}", lre + ["--relations", str(LRE_DATA / part),
                                                                  *TRIALS.get((m, part), ["--trials", "3"])]))
        for part in PARTS if m in SWEEP_MODELS else ():
            jobs.append((out / m / f"lre_layers_{part}", lre + ["--relations", str(LRE_DATA / part), "--relation-names",
                                                                 *SWEEP[part], "--layers", SWEEP_LAYERS[m],
                                                                 *ONE_TRIAL]))
        jobs.append((out / m / "superposition", ["llm", "superposition", "--model", m, "--layers", STRIDE[m],
                                                 "--splits", "2"]))
        for folder, argv in jobs:
            if (folder / "meta.json").is_file():
                continue
            subprocess.run(cli + argv + ["--threads", "1", "--quiet", "--out", str(folder)], check=True)


def readout_table(out: Path) -> str:
    rows = ["| relation | " + " | ".join(f"{m}: best layer / readout (control, majority)" for m in MODELS) + " |",
            "|---|" + "---|" * len(MODELS)]
    res = {m: _read(out / m / "probe" / "result.json") for m in MODELS}
    names = sorted({b["relation"] for r in res.values() if r for b in r.get("best_layers", [])})
    for name in names:
        cells = []
        for m in MODELS:
            b = next((b for b in (res[m] or {}).get("best_layers", []) if b["relation"] == name), None)
            k = next((r for r in (res[m] or {}).get("relations", []) if r["relation"] == name), None)
            cells.append("—" if b is None else f"{b['best_layer']} / {b['readout_accuracy']:.2f} "
                         f"({b['control_accuracy']:.2f}, {b['chance']:.2f}); known {k['n_known']}/{k['n_samples']}")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
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


_CELL = re.compile(r"(?P<k>\d+)/(?P<n>\d+)(?::| known:) (?:F (?P<f>[\d.]+) \(β (?P<b>[\d.]+)\), "
                   r"C (?:(?P<c>[\d.]+) \(r (?P<r>\d+)\)|—)|too few known|skipped)")


def parse_cell(cell: str) -> dict | None:
    """The numbers of one cell written by :func:`_lre_cell` (None for 'not run'); ValueError for anything else."""
    cell = cell.strip()
    if cell == "not run":
        return None
    m = _CELL.fullmatch(cell)
    if m is None:
        raise ValueError(f"LRE table cell {cell!r}: not in the form '12/27: F 0.76 (β 3), C 0.38 (r 32)'")
    num = lambda k, t=float: None if m[k] is None else t(m[k])  # noqa: E731
    return {"n_known": int(m["k"]), "n_samples": int(m["n"]), "faithfulness": num("f"), "faithfulness_best_beta": num("f"),
            "best_beta": num("b"), "causality_best_rank": num("c"), "best_rank": num("r", int), "previous": True}


def previous_lre(text: str) -> dict[str, dict[str, dict]]:
    """{model: {relation: parsed cell}} from every LRE table (header '| relation | <model> (layer N) |...') of a
    markdown write-up; a relation in several tables keeps its first cell that is not 'not run'."""
    out: dict[str, dict[str, dict]] = {m: {} for m in MODELS}
    cols = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells and cells[0] == "relation":
            cols = [next((m for m in MODELS if c.startswith(f"{m} (layer ")), None) for c in cells[1:]]
            cols = cols if any(cols) else None
        elif cells is None:
            cols = None
        elif cols and not set(cells[0]) <= set("-"):
            for m, cell in zip(cols, cells[1:]):
                x = parse_cell(cell) if m else None
                if x is not None and cells[0] not in out[m]:
                    out[m][cells[0]] = {**x, "relation": cells[0]}
    return out


def _lre_cell(x: dict | None) -> str:
    if x is None:
        return "not run"
    known = f"{x['n_known']}/{x['n_samples']}"
    if x["faithfulness"] is None:
        return f"{known}: too few known"
    c = "—" if x.get("causality_best_rank") is None else f"{x['causality_best_rank']:.2f} (r {x['best_rank']})"
    return f"{known}: F {x['faithfulness_best_beta']:.2f} (β {x['best_beta']:g}), C {c}"


def _lre_all(out: Path, previous: dict | None) -> dict[str, dict[str, dict]]:
    """Per model, the rows of the runs in ``out``, and where a relation has no run there, its previous cell."""
    res = {m: _lre_rows(out, m) for m in MODELS}
    parts = {n: x["part"] for r in res.values() for n, x in r.items()}
    for m, rows in (previous or {}).items():
        for n, x in rows.items():
            res[m].setdefault(n, {**x, "part": parts.get(n, "linguistic" if n in LINGUISTIC else "factual")})
    return res


LINGUISTIC = ("adjective antonym", "adjective comparative", "adjective superlative", "verb past tense",
              "word first letter", "word last letter")


def lre_table(out: Path, previous: dict | None = None, part: str | None = None) -> str:
    """Every relation of the authors' dataset (or of one ``part``): known facts, faithfulness at the best beta,
    causality at the best rank, per model (middle layer), beside what the authors published (``PUBLISHED``)."""
    res = _lre_all(out, previous)
    if part is not None:
        res = {m: {n: x for n, x in r.items() if x["part"] == part} for m, r in res.items()}
    names = sorted({n for r in res.values() for n in r}, key=lambda n: (next(r[n]["part"] for r in res.values()
                                                                              if n in r), n))
    rows = ["| relation | " + " | ".join(f"{m} (layer {LRE_LAYER[m]})" for m in MODELS)
            + " | authors: F GPT-J / LLaMA-13B |",
            "|---|" + "---|" * (len(MODELS) + 1)]
    for n in names:
        rows.append(f"| {n} | " + " | ".join(_lre_cell(res[m].get(n)) for m in MODELS) + f" | {_published(n)} |")
    for m in MODELS:  # means over the relations with a score, and how many
        xs = [x for x in res[m].values() if x["faithfulness"] is not None]
        if xs:
            cs = [x["causality_best_rank"] for x in xs if x.get("causality_best_rank") is not None]
            ran = [x for x in xs if x.get("causality_by_rank")]  # full-rank numbers: runs in --out only
            full = (f"; at full rank ({len(ran)} of them) the authors' edit "
                    f"{np.mean([_full(x, 'causality_by_rank') for x in ran]):.2f}, the projection baseline "
                    f"{np.mean([_full(x, 'causality_projection_baseline_by_rank') for x in ran]):.2f}") if ran else ""
            rows.append(f"\n{m}: {len(xs)} of {len(res[m])} relations scored; mean faithfulness (best beta) "
                        f"{np.mean([x['faithfulness_best_beta'] for x in xs]):.2f}, mean causality (best rank) "
                        f"{np.mean(cs):.2f}{full}")
    return "\n".join(rows)


def _published(name: str) -> str:
    if name not in PUBLISHED:
        return ""
    return " / ".join("failed" if v is None else f"{v:.2f}" for v in PUBLISHED[name])


def _full(x: dict, key: str) -> float:
    return x[key][max(x[key], key=int)]


def lre_sweep_table(out: Path) -> str:
    rows = ["| relation | model | F (best beta) by layer | C (best rank) by layer | best layer |", "|---|---|---|---|---|"]
    for m in MODELS:
        for n, x in _lre_rows(out, m, "layers").items():
            if not x.get("by_layer"):
                continue
            f = ", ".join(f"{b['layer']}: {b['faithfulness_best_beta']:.2f}" for b in x["by_layer"])
            c = ", ".join(f"{b['layer']}: {b['causality_best_rank']:.2f}" if b["causality_best_rank"] is not None
                          else f"{b['layer']}: —" for b in x["by_layer"])
            rows.append(f"| {n} | {m} | {f} | {c} | {x['best_layer']} |")
    return "\n".join(rows)


def lre_figure(out: Path, path: Path, previous: dict | None = None) -> None:
    """Faithfulness and causality per relation, the three models side by side (middle layer)."""
    from mechfact.plotting import save, subplots

    res = _lre_all(out, previous)
    names = sorted({n for r in res.values() for n in r if r[n]["faithfulness"] is not None})
    if not names:
        return
    fig, axes = subplots(1, 2, figsize=(11.0, 1.5 + 0.28 * len(names)), sharey=True, layout="constrained")
    y = np.arange(len(names))
    for ax, key, title in ((axes[0], "faithfulness_best_beta", "LRE faithfulness (best beta)"),
                           (axes[1], "causality_best_rank", "LRE causality (the authors' edit, best rank)")):
        for k, m in enumerate(MODELS):
            v = [(res[m].get(n) or {}).get(key) for n in names]
            ax.barh(y + (k - 1) * 0.27, [0 if a is None else a for a in v], 0.27, color=COLORS[m], label=m)
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


def superposition_table(out: Path) -> str:
    rows = ["| model | layer | R^2 held-out (shuffled; random vectors) | in the attribute subspace (shuffled) | "
            "decodable from the same state: continent / language / currency / capital / demonym (controls) |",
            "|---|---|---|---|---|"]
    for m in MODELS:
        r = _read(out / m / "superposition" / "result.json")
        for x in (r or {}).get("per_layer", []):
            dec = x["decodability"]
            d = " / ".join(f"{dec[f'countries_{k}']['accuracy']:.2f} ({dec[f'countries_{k}']['control_accuracy']:.2f})"
                           for k in ("continent", "language", "currency", "capital", "demonym"))
            rows.append(f"| {m} | {x['layer']} | {x['r2_heldout']:.3f} ({x['control_shuffled_r2_heldout']:.3f}; "
                        f"{x['control_random_features_r2_heldout']:.3f}) | {x['r2_heldout_attribute_subspace']:.3f} "
                        f"({x['control_shuffled_r2_heldout_attribute_subspace']:.3f}) | {d} |")
    return "\n".join(rows)


def figure(out: Path, path: Path) -> None:
    from mechfact.llm.plots import plot_families

    runs = {m: {"probe": _read(out / m / "probe" / "result.json"),
                "superposition": _read(out / m / "superposition" / "result.json")} for m in MODELS}
    runs = {m: r for m, r in runs.items() if r["probe"] or r["superposition"]}
    if not runs:  # nothing in --out: keep the figure that is there
        print(f"no probe or superposition runs in {out}: {path} left as it is", file=sys.stderr)
        return
    plot_families(runs, path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/fam")
    ap.add_argument("--run", action="store_true", help="run what is missing first")
    ap.add_argument("--figure", default="docs/img/families.png")
    ap.add_argument("--lre-figure", default="docs/img/families_lre.png")
    ap.add_argument("--previous", default=None, metavar="MD",
                    help="an earlier write-up (docs/results_llm.md) whose LRE tables fill the runs not in --out")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.run:
        run(out)
    prev = previous_lre(Path(a.previous).read_text()) if a.previous else None
    print(readout_table(out), "\n")
    for part in PARTS:
        print(lre_table(out, prev, part), "\n")
    print(lre_sweep_table(out), "\n")
    print(superposition_table(out))
    figure(out, Path(a.figure))
    lre_figure(out, Path(a.lre_figure), prev)


if __name__ == "__main__":
    main()
