"""Figures for the probe runs, drawn from result.json only."""

from __future__ import annotations

import numpy as np

from ..plotting import save, subplots


def plot_readout(result: dict, path) -> None:
    rows = result["per_relation"]
    sites = result["sites"]
    rels = sorted({r["relation"] for r in rows})
    fig, ax = subplots(figsize=(max(5.0, 1.4 * len(sites) + 2), 3.8))
    w = 0.8 / max(len(rels), 1)
    for j, r in enumerate(rels):
        acc = [next((x["accuracy"] for x in rows if x["relation"] == r and x["site"] == s), np.nan) for s in sites]
        ctl = [next((x["control_accuracy"] for x in rows if x["relation"] == r and x["site"] == s), np.nan) for s in sites]
        xs = np.arange(len(sites)) + (j - (len(rels) - 1) / 2) * w
        ax.bar(xs, acc, w, label=f"relation {r}")
        ax.scatter(xs, ctl, marker="x", color="k", s=14, zorder=3, label="shuffled control" if j == 0 else None)
    ax.axhline(rows[0]["chance"] if rows else 0, color="gray", ls=":", lw=1, label="chance")
    ax.set_xticks(np.arange(len(sites)))
    ax.set_xticklabels([s.replace("blocks.", "b").replace("@", "\n@") for s in sites], fontsize=7)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("held-out readout accuracy")
    ax.set_title(f"Linear readout ({result['kind']})")
    ax.legend(fontsize=6, ncol=2)
    save(fig, path)


def plot_superposition(result: dict, path) -> None:
    fig, (a, b) = subplots(1, 2, figsize=(8.5, 3.6))
    names = ["train", "held-out", "control held-out"]
    vals = [result["r2_train"], result["r2_heldout"], result["control_r2_heldout"]]
    a.bar(names, vals, color=["tab:blue", "tab:green", "tab:gray"])
    a.set_ylim(min(0.0, min(vals)) - 0.05, 1.05)
    a.set_ylabel(r"$R^2$ of $x_s$ on its attribute vectors")
    a.set_title("Superposition test")
    ov = np.asarray(result["block_overlap"])
    im = b.imshow(ov, vmin=0, vmax=1, cmap="viridis")
    b.set_title("Overlap of relation subspaces")
    b.set_xlabel("relation")
    b.set_ylabel("relation")
    fig.colorbar(im, ax=b)
    save(fig, path)


def plot_intervene(result: dict, path) -> None:
    pr = result["per_relation"]
    rels = [r["relation"] for r in pr]
    fig, ax = subplots(figsize=(6.0, 3.8))
    x = np.arange(len(rels))
    ax.bar(x - 0.27, [r["accuracy_on_relation"] for r in pr], 0.27, label="ablated relation")
    ax.bar(x, [r["accuracy_on_others"] for r in pr], 0.27, label="other relations")
    ax.bar(x + 0.27, [r["random_units_accuracy_on_relation"] for r in pr], 0.27, label="random units (control)")
    ax.axhline(result["chance"], color="gray", ls=":", lw=1, label="chance")
    ax.set_xticks(x)
    ax.set_xticklabels([f"r={r}\n({p['n_ablated']} units)" for r, p in zip(rels, pr)], fontsize=7)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy after ablation")
    sw = result.get("relation_swaps") or []
    if sw:
        ax.set_title("Selector ablation; relation swap moved " +
                     ", ".join(f"{s['relation']}->{s['new_relation']}: {s['moved_to_new']:.2f}" for s in sw[:4]),
                     fontsize=8)
    ax.legend(fontsize=7)
    save(fig, path)


def plot_swap(result: dict, path) -> None:
    fig, ax = subplots(figsize=(6.0, 3.8))
    for key, label in (("retrain_curve", "new facts (embeddings retrained)"),
                       ("control_relearn_curve", "original facts relearned (control)")):
        c = result[key]
        ax.plot([p["step"] for p in c], [p["accuracy"] for p in c], "o-", ms=3, label=label)
    ax.axhline(result["zero_shot_accuracy"], color="tab:green", ls="--", label="zero-shot (constructed)")
    ax.axhline(result["zero_shot_control_accuracy"], color="gray", ls=":", label="zero-shot control")
    ax.set_xlabel("steps (subject embeddings only; all else frozen)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Freeze-and-swap")
    ax.legend(fontsize=7)
    save(fig, path)


def plot_scores(result: dict, path) -> None:
    fig, (a, b) = subplots(1, 2, figsize=(9.0, 3.6))
    a.hist(result["z_target"], bins=40, alpha=0.7, density=True, label="target")
    a.hist(result["z_max"], bins=40, alpha=0.7, density=True, label="max competitor")
    a.axvline(result["evt_sqrt_2lnn"], color="k", ls="--", lw=1, label=r"$\sqrt{2\ln n}$")
    a.axvline(result["expected_max_gaussian"], color="tab:red", ls=":", lw=1, label="E max of n Gaussians")
    a.set_xlabel("logit in competitor-std units")
    a.legend(fontsize=7)
    a.set_title("Scores")
    from ..randmat import quarter_circle_pdf

    for name, sv in result["spectra"]["singular_values"].items():
        b.hist(sv, bins=30, histtype="step", density=True, label=name)
    xs = np.linspace(0, 2, 100)
    b.plot(xs, quarter_circle_pdf(xs), "k--", lw=1, label="quarter circle")
    b.set_xlabel("normalised singular value")
    b.set_title("Spectra")
    b.legend(fontsize=6)
    save(fig, path)


def plot_probe_regimes(models: list[dict], path) -> None:
    """Headline probes per model of the quickstart's probe section, grouped bars with each model's chance."""
    keys = [("r2_heldout", "superposition R^2 (held-out)"), ("readout_embed_min", "readout, worst relation"),
            ("zero_shot_accuracy", "zero-shot swap"), ("zero_shot_control_accuracy", "zero-shot control"),
            ("train_accuracy", "train accuracy")]
    fig, ax = subplots(figsize=(10.0, 3.8), layout="constrained")
    n, w = len(keys), 0.8 / len(keys)
    x = np.arange(len(models))
    for j, (k, label) in enumerate(keys):
        ax.bar(x + (j - (n - 1) / 2) * w, [max(0.0, float(m[k])) for m in models], w, label=label)
    for i, m in enumerate(models):
        ax.plot([i - 0.42, i + 0.42], [m["chance"]] * 2, color="grey", lw=2)
    ax.set_xticks(x)
    ax.set_xticklabels([m["label"].replace(" (", "\n(") for m in models], fontsize=9)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy / R^2")
    ax.legend(fontsize=8, ncol=3, loc="upper left", bbox_to_anchor=(0, -0.18))
    save(fig, path)


def plot_probe_ablation(models: list[dict], path) -> None:
    """Selector ablation per relation, one panel per model (two per row): accuracy on the ablated relation, on the
    others, and with as many random units."""
    import math

    cols = 2
    rows = math.ceil(len(models) / cols)
    fig, axes = subplots(rows, cols, figsize=(10.0, 2.9 * rows), squeeze=False, sharey=True, layout="constrained")
    for ax, m in zip(axes.flat, models):
        on, oth, rnd = m["ablation_on_relation"], m["ablation_on_others"], m["ablation_random_on_relation"]
        x = np.arange(len(on))
        ax.bar(x - 0.27, on, 0.27, label="ablated relation")
        ax.bar(x, [np.nan if v is None else v for v in oth], 0.27, label="other relations")
        ax.bar(x + 0.27, rnd, 0.27, label="random units")
        ax.axhline(m["chance"], color="gray", ls=":", lw=1)
        ax.set_xticks(x)
        ax.set_xticklabels([f"r={i}\n{k} units" for i, k in enumerate(m["n_ablated"])], fontsize=8)
        ax.set_title(f"{m['label']}, train accuracy {m['train_accuracy']:.2f}", fontsize=10)
        ax.set_ylim(0, 1.05)
    for ax in list(axes.flat)[len(models):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8, loc="lower left")
    fig.supylabel("accuracy after ablation")
    save(fig, path)
