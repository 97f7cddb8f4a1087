"""Three real model families side by side: readout, LRE (the authors' protocol), superposition.

    python -m probes.families --run            # runs every missing part into runs/fam (hours on 2 CPU cores)
    python -m probes.families                  # tables (markdown) + docs/img/families.png from finished runs

What it runs, per packaged model (``mechfact llm models``; install lines in the README):

* ``mechfact llm probe --layers all --k-shot 3 --max-samples 40`` (the 14 shipped relations);
* ``mechfact llm lre --relations <authors' file> --max-samples 60 --max-test 12 --trials 2`` on the relations of
  ``AUTHORS`` from ``../shared/data/lre`` (external data, read in place);
* ``mechfact llm superposition`` on the shipped countries at every ``STRIDE``-th layer, 2 splits.

Run folders: ``runs/fam/<model>/{probe,lre_authors_<relation>,superposition}``. Reruns skip finished runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-0.5b")
AUTHORS = ("factual/country_capital_city", "factual/person_plays_pro_sport", "linguistic/adj_antonym")
STRIDE = {"smollm2-135m": "0,3,6,9,12,15,18,21,24,27,29", "gemma3-270m": "0,2,4,6,8,10,12,14,16,17",
          "qwen2.5-0.5b": "0,3,6,9,12,15,18,21,23"}
LRE_DATA = Path("..") / "shared" / "data" / "lre"
COLORS = {"smollm2-135m": "tab:blue", "gemma3-270m": "tab:orange", "qwen2.5-0.5b": "tab:green"}


def _read(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def run(out: Path) -> None:
    cli = [sys.executable, "-m", "mechfact.cli"]
    for m in MODELS:
        jobs = [(out / m / "probe", ["llm", "probe", "--model", m, "--layers", "all", "--k-shot", "3",
                                      "--max-samples", "40"])]
        for f in AUTHORS:
            jobs.append((out / m / f"lre_authors_{Path(f).name}",
                         ["llm", "lre", "--model", m, "--relations", str(LRE_DATA / f"{f}.json"), "--max-samples",
                          "60", "--max-test", "12", "--trials", "2"]))
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


def lre_table(out: Path) -> str:
    rows = ["| relation | model | known | faithfulness (beta 1) | best beta: faithfulness | causality rank 64 | "
            "best rank: causality | full rank: causality / projection baseline |", "|---|---|---|---|---|---|---|---|"]
    for f in AUTHORS:
        for m in MODELS:
            r = _read(out / m / f"lre_authors_{Path(f).name}" / "result.json")
            if not r or not r["per_relation"]:
                continue
            x = r["per_relation"][0]
            if x["faithfulness"] is None:
                rows.append(f"| {x['relation']} | {m} | {x['n_known']}/{x['n_samples']} | too few known facts | | | | |")
                continue
            if not x["causality_by_rank"]:
                rows.append(f"| {x['relation']} | {m} | {x['n_known']}/{x['n_samples']} | {x['faithfulness']:.2f} | "
                            f"{x['best_beta']}: {x['faithfulness_best_beta']:.2f} | no target with another object | "
                            "| |")
                continue
            full = max(x["causality_by_rank"], key=int)
            rows.append(
                f"| {x['relation']} | {m} | {x['n_known']}/{x['n_samples']} | {x['faithfulness']:.2f} | "
                f"{x['best_beta']}: {x['faithfulness_best_beta']:.2f} | {x['causality_by_rank'].get('64', float('nan')):.2f} | "
                f"{x['best_rank']}: {x['causality_best_rank']:.2f} | {x['causality_by_rank'][full]:.2f} / "
                f"{x['causality_projection_baseline_by_rank'][full]:.2f} |")
    return "\n".join(rows)


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
    from mechfact.plotting import save, subplots

    fig, (a, b) = subplots(1, 2, figsize=(11.0, 4.0), layout="constrained")
    for m in MODELS:
        r = _read(out / m / "probe" / "result.json")
        if r and r.get("mean_per_layer"):
            pts = [p for p in r["mean_per_layer"] if p["group"] == "all"]
            x = [p["layer"] / max(1, r["n_layers"] - 1) for p in pts]
            a.plot(x, [p["mean_readout_accuracy"] for p in pts], "o-", ms=2.5, color=COLORS[m], label=f"{m} readout")
            a.plot(x, [p["mean_control_accuracy"] for p in pts], "--", color=COLORS[m], lw=0.8,
                   label=f"{m} shuffled control")
        s = _read(out / m / "superposition" / "result.json")
        if s:
            n = max(x["layer"] for x in s["per_layer"])
            xs = [x["layer"] / max(1, n) for x in s["per_layer"]]
            b.plot(xs, [x["decodability"]["countries_continent"]["accuracy"] for x in s["per_layer"]], "o-", ms=2.5,
                   color=COLORS[m], label=f"{m}: continent decodable")
            b.plot(xs, [x["r2_heldout"] for x in s["per_layer"]], "s:", ms=2, color=COLORS[m],
                   label=f"{m}: superposition R^2")
    a.set_xlabel("relative depth (layer / last layer)")
    a.set_ylabel("mean held-out readout accuracy (14 relations)")
    a.set_ylim(-0.02, 1.02)
    a.set_title("Readout of the object from the subject state (3-shot prompts)", fontsize=9)
    a.legend(fontsize=6)
    b.axhline(0, color="k", lw=0.5)
    b.set_xlabel("relative depth")
    b.set_title("Countries from the bare subject: decodable vs superposition R^2", fontsize=9)
    b.legend(fontsize=6)
    save(fig, path)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/fam")
    ap.add_argument("--run", action="store_true", help="run what is missing first")
    ap.add_argument("--figure", default="docs/img/families.png")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.run:
        run(out)
    print(readout_table(out), "\n")
    print(lre_table(out), "\n")
    print(superposition_table(out))
    figure(out, Path(a.figure))


if __name__ == "__main__":
    main()
