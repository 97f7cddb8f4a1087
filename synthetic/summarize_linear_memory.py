"""Print markdown tables of the linear-memory results from run directories.

    python -m synthetic.summarize_linear_memory runs/linear_memory [FIG.png] > tables.md

Reads every `*/result.json` under the folder written by `synthetic.linear_memory`
(or by the equivalent `mechfact memory ...` commands) and prints the tables used
in docs/results_linear_memory.md; with a second argument it also draws the
capacity of every run against 1/ln p_c into that figure.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mechfact.memory.experiments import fit_extrapolation


def _f(x, nd=3):
    return "—" if x is None else f"{x:.{nd}f}"


def capacity_tables(root: Path) -> list[str]:
    lines = ["| run | d | method | problem | seeds | alpha_c median | q25 | q75 | p_c values |", "|---|---|---|---|---|---|---|---|---|"]
    fits = ["| run | alpha_inf (fit a + b/ln p_c) | s.e. | 95% CI | slope b | points |", "|---|---|---|---|---|---|"]
    for res_file in sorted(root.glob("cap_*/result.json")):
        r = json.loads(res_file.read_text())
        name = res_file.parent.name
        for s in r["summary"]:
            pcs = [c["p_c"] for c in r["capacity"] if c["d"] == s["d"]]
            lines.append(f"| {name} | {s['d']} | {s['method']} | {s['problem']} | {s.get('n_seeds', len(pcs))} | "
                         f"{_f(s['alpha_c_median'])} | {_f(s['alpha_c_q25'])} | {_f(s['alpha_c_q75'])} | {pcs} |")
        e = fit_extrapolation(r["capacity"])  # recomputed: the stored one may predate a finished run
        if e.get("alpha_inf") is not None:
            fits.append(f"| {name} | {_f(e['alpha_inf'])} | {_f(e['alpha_inf_se'])} | [{_f(e['ci95'][0])}, {_f(e['ci95'][1])}] | "
                        f"{_f(e['slope'])} | {e['n']} |")
    return lines + [""] + fits


def main(root: str) -> None:
    root = Path(root)
    print("\n".join(capacity_tables(root)))
    for name in ("scores", "spectrum", "rank"):
        f = root / name / "result.json"
        if f.exists():
            r = json.loads(f.read_text())
            print(f"\n## {name}\n")
            if name == "scores":
                keys = ["accuracy", "z_target_mean", "z_target_std", "z_max_competitor_mean", "z_margin_mean", "z_margin_min",
                        "target_std_over_comp_std", "evt_sqrt_2lnp", "expected_max_gaussian"]
                print("| method | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys))
                for m, s in r["summary"].items():
                    print(f"| {m} | " + " | ".join(_f(s[k]) for k in keys) + " |")
            elif name == "spectrum":
                print(f"d={r['d']} p={r['p']} alpha={r['alpha']:.3f} seeds={r.get('seeds')} accuracy={r['accuracy']}")
                print("| W | KS to quarter circle |\n|---|---|")
                for k, v in r["ks_to_theory"].items():
                    print(f"| {k} | {_f(v)} |")
                print("\n| pair | KS |\n|---|---|")
                for k, v in r["ks_pairs"].items():
                    print(f"| {k} | {_f(v)} |")
            else:
                print("| kappa | d | alpha_c median | q25 | q75 |\n|---|---|---|---|---|")
                for s in r["summary"]:
                    print(f"| {s['kappa']} | {s['d']} | {_f(s['alpha_c_median'])} | {_f(s['alpha_c_q25'])} | {_f(s['alpha_c_q75'])} |")
                print("\n| kappa | kappa(2-kappa)/2 | quarter-circle energy / 2 |\n|---|---|---|")
                for t in r.get("theory", []):
                    print(f"| {t['kappa']} | {_f(t['alpha_c_dof'])} | {_f(t['alpha_c_energy'])} |")



def plot_all(root: Path, path: Path) -> None:
    """One figure: median alpha_c (IQR bars) against 1/ln p_c for every capacity run, with 1/2 and 1/8."""
    import math

    import numpy as np

    from mechfact.memory import theory
    from mechfact.plotting import save, subplots

    fig, ax = subplots(figsize=(7.2, 4.6))
    for res_file in sorted(root.glob("cap_*/result.json")):
        r = json.loads(res_file.read_text())
        if not r["summary"]:
            continue
        xs, ys, lo, hi = [], [], [], []
        for s in r["summary"]:
            pcs = [c["p_c"] for c in r["capacity"] if c["d"] == s["d"]]
            xs.append(1 / math.log(float(np.median(pcs))))
            ys.append(s["alpha_c_median"]); lo.append(s["alpha_c_median"] - s["alpha_c_q25"]); hi.append(s["alpha_c_q75"] - s["alpha_c_median"])
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o-", ms=4, capsize=2, label=res_file.parent.name.replace("cap_", ""))
    ax.axhline(theory.ALPHA_OPTIMAL, color="k", ls="--", lw=1, label="optimal 1/2")
    ax.axhline(theory.ALPHA_HEBB, color="tab:red", ls=":", lw=1, label="Hebb 1/8")
    ax.set_xlim(left=0)
    ax.set_xlabel(r"$1/\ln p_c$  (0 = infinite size)")
    ax.set_ylabel(r"perfect-recall capacity $\alpha_c = p_c\ln p_c/d^2$ (median, IQR)")
    ax.set_title("Linear associative memory: capacity vs size")
    ax.legend(fontsize=7, ncol=2)
    save(fig, path)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/linear_memory")
    if len(sys.argv) > 2:
        plot_all(Path(sys.argv[1]), Path(sys.argv[2]))
