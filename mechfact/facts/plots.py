"""Figures for the fact experiments, drawn from result.json only."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..plotting import save, subplots

_COLORS = {"trainable": "tab:blue", "frozen": "tab:red", "frozen-input": "tab:orange"}


def plot_train(result: dict, path) -> None:
    h = result["history"]
    fig, ax = subplots(figsize=(6.0, 3.8))
    if h:
        steps = [r["step"] for r in h]
        ax.plot(steps, [r["accuracy"] for r in h], "-", color="tab:blue", label="accuracy (all training facts)")
        ax2 = ax.twinx()
        ax2.semilogy(steps, [max(r["loss"], 1e-12) for r in h], "-", color="tab:gray", lw=1, label="loss")
        ax2.set_ylabel("cross-entropy (log)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("step")
    ax.set_ylabel("accuracy")
    ax.set_title(f"N={result['subjects']} R={result['relations']} d={result['d']} m={result['mlp_width']} "
                 f"{result['embeddings']}: final {result['accuracy']:.3f}", fontsize=9)
    ax.legend(loc="lower right", fontsize=7)
    save(fig, path)


def plot_capacity(result: dict, path) -> None:
    """d* against R ln N per regime with the fitted line; and, when the width was searched, width vs N R."""
    summary = result.get("summary") or {"table": [], "fits": {}}
    table = summary["table"]
    searched = result["thresholds"][0]["searched"] if result["thresholds"] else "d"
    xname, xlabel = ("r_log_n", r"$R \ln N$") if searched == "d" else ("n_facts", r"number of facts $N R$")
    fig, ax = subplots(figsize=(6.4, 4.4))
    by_emb = defaultdict(list)
    for t in table:
        by_emb[t["embeddings"]].append(t)
    for emb, rows in sorted(by_emb.items()):
        c = _COLORS.get(emb, None)
        for t in rows:
            for v in t["thresholds"]:
                if v is not None:
                    ax.scatter(t[xname], v, color=c, s=14, alpha=0.5)
        pts = [(t[xname], t["median_threshold"]) for t in rows if t["median_threshold"] is not None]
        if pts:
            x, y = map(np.array, zip(*sorted(pts)))
            ax.plot(x, y, "o", color=c, ms=6, label=f"{emb} (median)")
        fit = summary["fits"].get(emb, {}).get(xname)
        if fit:
            xs = np.linspace(0, max(t[xname] for t in rows) * 1.05, 50)
            ax.plot(xs, fit["slope"] * xs + fit["intercept"], "--", color=c, lw=1,
                    label=f"{emb} fit: slope {0.0 if abs(fit['slope']) < 1e-9 else fit['slope']:.3g}" + (f", R2 {fit['r2']:.2f}" if fit["r2"] is not None else ""))
        missing = [t for t in rows if t["median_threshold"] is None]
        for t in missing:
            ax.axvline(t[xname], color=c, ls=":", lw=1)
    if any(t["median_threshold"] is None for t in table):
        ax.text(0.02, 0.98, "settings that never reached the target within the grid are listed in result.json",
                transform=ax.transAxes, fontsize=7, va="top")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("smallest d reaching 99%" if searched == "d" else "smallest MLP width reaching 99%")
    ax.set_title(f"Memorisation threshold ({searched} searched)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    save(fig, path)


def plot_multihop(result: dict, path) -> None:
    pts = result["points"]
    fig, ax = subplots(figsize=(5.6, 3.8))
    ks = sorted({p["hops"] for p in pts})
    for j, mode in enumerate(("direct", "cot")):
        acc = {p["hops"]: p["accuracy"] for p in pts if p["mode"] == mode}
        xs = [k + (j - 0.5) * 0.35 for k in ks if k in acc]
        ax.bar(xs, [acc[k] for k in ks if k in acc], width=0.35,
               label="direct" if mode == "direct" else "chain of thought", color=["tab:gray", "tab:green"][j])
    ax.set_xticks(ks)
    ax.set_xlabel("hops k")
    ax.set_ylabel("exact-chain accuracy")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"N={result['subjects']} R={result['relations']} d={result['d']} m={result['mlp_width']}", fontsize=9)
    ax.legend(fontsize=8)
    save(fig, path)
