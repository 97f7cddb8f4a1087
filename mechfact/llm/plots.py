"""Figures for the LLM probes, drawn from result.json only."""

from __future__ import annotations

import math

import numpy as np

from ..plotting import save, subplots


def plot_readout(result: dict, path, cols: int = 4) -> None:
    """One panel per relation: held-out readout accuracy, shuffled control and chance across layers.

    ``cols``: panels per row (the report uses 2, so each panel stays readable at page width)."""
    rels = [r for r in result["relations"] if any(p["relation"] == r["relation"] for p in result["per_layer"])]
    n = max(1, len(rels))
    cols = max(1, min(cols, n))
    rows = math.ceil(n / cols)
    wide = cols <= 2  # few, large panels: larger text
    size = (4.6, 3.0) if wide else (3.3, 2.8)
    fig, axes = subplots(rows, cols, figsize=(size[0] * cols, size[1] * rows), squeeze=False, sharey=True,
                         layout="constrained")
    for ax, rel in zip(axes.flat, rels):
        pts = sorted((p for p in result["per_layer"] if p["relation"] == rel["relation"]), key=lambda p: p["layer"])
        x = [p["layer"] for p in pts]
        ax.plot(x, [p["readout_accuracy"] for p in pts], "o-", ms=2.5, label="readout (held-out)")
        ax.plot(x, [p["control_accuracy"] for p in pts], "s--", ms=2, color="tab:gray", label="shuffled control")
        ax.plot(x, [p["chance"] for p in pts], ":", color="tab:red", label="majority class")
        if all("prior_baseline" in p for p in pts):
            ax.plot(x, [p["prior_baseline"] for p in pts], "-.", color="tab:purple", lw=0.8, label="class prior")
        ax.set_title(f"{rel['relation']} ({pts[0]['readout_kind'] if pts else ''})\n"
                     f"known {rel['n_known']}/{rel['n_samples']}", fontsize=10 if wide else 8)
        if pts and pts[0]["readout_kind"] == "vector" and max(p["readout_accuracy"] for p in pts) < 0.1:
            ax.text(0.5, 0.5, "vector readout at chance: held-out subjects'\nobjects never occur in training",
                    transform=ax.transAxes, ha="center", va="center", fontsize=9 if wide else 7, color="dimgray")
        ax.set_ylim(-0.02, 1.02)
        ax.tick_params(labelsize=9 if wide else 7)
    for ax in list(axes.flat)[len(rels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8 if wide else 6, loc="lower right")
    fig.supxlabel("layer")
    fig.supylabel("accuracy")
    fig.suptitle(f"{result.get('model', '')}: linear readout of the object from the subject state", fontsize=10)
    save(fig, path)


def plot_readout_mean(result: dict, path) -> None:
    fig, ax = subplots(figsize=(6.2, 4))
    colors = {"many_to_one": "tab:blue", "one_to_one": "tab:green", "one_to_many": "tab:orange",
              "many_to_many": "tab:purple", "all": "k"}
    for group, c in colors.items():
        pts = [r for r in result.get("mean_per_layer", []) if r["group"] == group]
        if not pts:
            continue
        x = [r["layer"] for r in pts]
        ax.plot(x, [r["mean_readout_accuracy"] for r in pts], "o-", ms=3, color=c,
                label=f"{group} (n={pts[0]['n_relations']}) readout")
        ax.plot(x, [r["mean_control_accuracy"] for r in pts], "--", color=c, alpha=0.5, label=f"{group} control")
        ax.plot(x, [r["mean_chance"] for r in pts], ":", color=c, alpha=0.7, label=f"{group} chance")
    ax.set_xlabel("layer")
    ax.set_ylabel("mean held-out accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)
    ax.set_title(f"{result.get('model', '')}: mean readout across relations")
    save(fig, path)


def plot_known(result: dict, path) -> None:
    rels = result["relations"]
    fig, ax = subplots(figsize=(6.4, 0.3 * len(rels) + 1.2))
    y = np.arange(len(rels))
    ax.barh(y, [r["n_samples"] for r in rels], color="lightgray", label="samples")
    ax.barh(y, [r["n_known"] for r in rels], color="tab:blue", label="known (greedy = object)")
    ax.set_yticks(y, [r["relation"] for r in rels], fontsize=8)
    ax.invert_yaxis()
    ax.legend(fontsize=7)
    ax.set_xlabel("facts")
    save(fig, path)


def _err(rows: list[dict], key: str) -> np.ndarray:
    """(2, n) error-bar lengths from each row's ``<key>_ci`` (zeros where there is none)."""
    out = np.zeros((2, len(rows)))
    for k, r in enumerate(rows):
        ci, v = r.get(f"{key}_ci"), r.get(key)
        if v is not None and ci and ci[0] is not None:
            out[:, k] = [max(0.0, v - ci[0]), max(0.0, ci[1] - v)]
    return out


def plot_lre(result: dict, path) -> None:
    """Per relation: faithfulness (fixed beta) and causality (rank chosen on training facts) with 95% intervals,
    the bias-only and majority baselines as ticks; degenerate relations (one object) hatched."""
    rels = result["per_relation"]
    fig, ax = subplots(figsize=(max(5, 0.6 * len(rels) + 2), 3.8))
    x = np.arange(len(rels))
    val = lambda r, k: r.get(k) if r.get(k) is not None else 0  # noqa: E731
    hatch = ["//" if r.get("degenerate") else "" for r in rels]
    ax.bar(x - 0.2, [val(r, "faithfulness") for r in rels], 0.4, yerr=_err(rels, "faithfulness"), capsize=2,
           label="faithfulness", hatch=hatch)
    ax.bar(x + 0.2, [val(r, "causality") for r in rels], 0.4, yerr=_err(rels, "causality"), capsize=2,
           label="causality", hatch=hatch)
    for key, mk, lab in (("faithfulness_bias_only", "_", "beta = 0 (bias only)"),
                         ("majority_baseline", "x", "majority object")):
        pts = [(k, r[key]) for k, r in enumerate(rels) if r.get(key) is not None]
        if pts:
            ax.plot([k - 0.2 for k, _ in pts], [v for _, v in pts], mk, color="k", ms=8, label=lab)
    ax.set_xticks(x, [r["relation"] for r in rels], rotation=45, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    c = result.get("config", {})
    beta = rels[0].get("beta", c.get("beta")) if rels else c.get("beta")
    ax.set_title(f"{result.get('model', '')}: LRE at layer {result.get('layer')} (beta {beta} fixed, rank chosen "
                 "on training facts; 95% intervals over subjects)", fontsize=8)
    save(fig, path)


def plot_superposition_layers(result: dict, path) -> None:
    """Held-out R^2 of h_s ~ c + sum_r a_r(s) M_r per layer, beside its controls; each relation alone."""
    rows = sorted(result["per_layer"], key=lambda r: r["layer"])
    x = [r["layer"] for r in rows]
    fig, (a, b) = subplots(1, 2, figsize=(11.0, 4.0), layout="constrained")
    a.plot(x, [r["r2_heldout"] for r in rows], "o-", ms=3, color="k", label="all relations (held-out)")
    a.fill_between(x, [r["r2_heldout_range"][0] for r in rows], [r["r2_heldout_range"][1] for r in rows],
                   color="k", alpha=0.12, label="range over splits")
    a.plot(x, [r["control_random_features_r2_heldout"] for r in rows], "s--", ms=2, color="tab:orange",
           label="random object vectors, same size")
    a.plot(x, [r["control_shuffled_r2_heldout"] for r in rows], ":", color="tab:gray", label="attributes shuffled")
    a.axhline(0, color="k", lw=0.5)
    a.set_xlabel("layer")
    a.set_ylabel(r"held-out $R^2$ of the subject state")
    a.set_title(f"{result.get('model', '')}: superposition of {len(result['relations'])} attributes "
                f"({result.get('attributes')}, {len(result['subjects'])} subjects)", fontsize=9)
    a.legend(fontsize=7)
    for name in result["relations"]:
        b.plot(x, [r["r2_heldout_each_relation_alone"][name] for r in rows], "o-", ms=2, lw=1, label=name)
    b.axhline(0, color="k", lw=0.5)
    b.set_xlabel("layer")
    b.set_ylabel(r"held-out $R^2$, one relation alone")
    b.set_title("each relation alone", fontsize=9)
    b.legend(fontsize=7)
    save(fig, path)


def plot_lre_layers(result: dict, path) -> None:
    """A layer sweep of the LRE: faithfulness (beta chosen on training facts) and causality (rank chosen on
    training facts), relation x layer heatmaps."""
    rows = [r for r in result.get("per_relation_layer", []) if r["faithfulness"] is not None]
    names = sorted({r["relation"] for r in rows})
    layers = sorted({r["layer"] for r in rows})
    if not names:
        return plot_lre(result, path)
    cell = {(r["relation"], r["layer"]): r for r in rows}
    fig, axes = subplots(1, 2, figsize=(4.0 + 1.1 * len(layers), 1.2 + 0.32 * len(names)), layout="constrained")
    for ax, key, title in ((axes[0], "faithfulness_train_beta", "faithfulness (beta chosen on training facts)"),
                           (axes[1], "causality", "causality (rank chosen on training facts)")):
        m = np.full((len(names), len(layers)), np.nan)
        for i, n in enumerate(names):
            for j, l in enumerate(layers):
                v = cell.get((n, l), {}).get(key)
                if v is not None:
                    m[i, j] = v
        im = ax.imshow(m, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        for i in range(len(names)):
            for j in range(len(layers)):
                if not np.isnan(m[i, j]):
                    ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if m[i, j] < 0.6 else "black")
        ax.set_xticks(range(len(layers)), layers, fontsize=8)
        ax.set_yticks(range(len(names)), names if ax is axes[0] else [""] * len(names), fontsize=7)
        ax.set_xlabel("subject layer")
        ax.set_title(f"{result.get('model', '')}: {title}", fontsize=9)
    fig.colorbar(im, ax=axes, shrink=0.6)
    save(fig, path)


def plot_lre_detail(result: dict, path) -> None:
    """Per relation: faithfulness against beta (left) and causality against the edit rank (right), the authors'
    edit beside the projection edit; readable with a single relation (a bar pair is not)."""
    rels = [r for r in result["per_relation"] if r.get("faithfulness_by_beta")]
    fig, (a, b) = subplots(1, 2, figsize=(9.6, 3.6), layout="constrained")
    for i, r in enumerate(rels):
        c = f"C{i}"
        fb = sorted((float(k), v) for k, v in r["faithfulness_by_beta"].items() if v is not None)
        a.plot([x for x, _ in fb], [y for _, y in fb], "o-", ms=3, color=c, label=f"{r['relation']} (n={r['n_test']})")
        rk = sorted((int(k), v) for k, v in (r.get("causality_by_rank") or {}).items() if v is not None)
        pb = sorted((int(k), v) for k, v in (r.get("causality_projection_baseline_by_rank") or {}).items()
                    if v is not None)
        if rk:
            b.plot([x for x, _ in rk], [y for _, y in rk], "o-", color=c, label=f"{r['relation']}: authors' edit")
        if pb:
            b.plot([x for x, _ in pb], [y for _, y in pb], "s--", color=c, alpha=0.6,
                   label=f"{r['relation']}: projection edit")
    for r in rels[:1]:
        if r.get("beta") is not None:
            a.axvline(r["beta"], color="k", lw=0.6, ls=":", label=f"fixed beta {r['beta']}")
    a.set_xlabel("beta")
    a.set_ylabel("faithfulness on test facts (top token = object)")
    a.set_ylim(-0.02, 1.02)
    a.set_title(f"{result.get('model', '')}: LRE at layer {result.get('layer')}", fontsize=10)
    a.legend(fontsize=8)
    ranks = sorted({int(k) for r in rels for k in (r.get("causality_by_rank") or {})})
    b.set_xscale("log", base=2)
    if ranks:
        b.set_xticks(ranks, [str(k) for k in ranks])
        b.minorticks_off()
    b.set_xlabel("edit rank (the largest: full rank)")
    b.set_ylabel("causality (answer moved to the target)")
    b.set_ylim(-0.02, 1.02)
    b.set_title("causality against the rank of the edit", fontsize=10)
    b.legend(fontsize=8)
    save(fig, path)


def plot_families(runs: dict, path) -> None:
    """Model families side by side: mean readout against relative depth (left); continent decodability and
    the superposition fit against relative depth (right). ``runs``: {model: {"probe": ..., "superposition": ...}}."""
    fig, (a, b) = subplots(1, 2, figsize=(10.0, 3.8), layout="constrained")
    for i, (m, r) in enumerate(runs.items()):
        c = f"C{i}"
        pr = r.get("probe") or {}
        pts = [p for p in pr.get("mean_per_layer", []) if p["group"] == "all"]
        if pts:
            x = [p["layer"] / max(1, pr["n_layers"] - 1) for p in pts]
            a.plot(x, [p["mean_readout_accuracy"] for p in pts], "o-", ms=3, color=c, label=f"{m}")
            a.plot(x, [p["mean_control_accuracy"] for p in pts], "--", color=c, lw=0.8)
        sup = r.get("superposition") or {}
        rows = sorted(sup.get("per_layer", []), key=lambda x: x["layer"])
        if rows:
            n = max(1, pr.get("n_layers", rows[-1]["layer"] + 1) - 1)
            xs = [x["layer"] / n for x in rows]
            key = next((k for k in rows[0]["decodability"] if k.endswith("continent")), None)
            if key:
                b.plot(xs, [x["decodability"][key]["accuracy"] for x in rows], "o-", ms=3, color=c,
                       label=f"{m}: continent decodable")
            b.plot(xs, [x["r2_heldout"] for x in rows], "s:", ms=3, color=c, label=f"{m}: superposition R^2")
    a.set_xlabel("relative depth (layer / last layer)")
    a.set_ylabel("mean held-out readout (dashed: control)")
    a.set_ylim(-0.02, 1.02)
    a.set_title("readout of the object from the subject state", fontsize=10)
    a.legend(fontsize=8)
    b.axhline(0, color="k", lw=0.5)
    b.set_xlabel("relative depth")
    prompts = {(r.get("superposition") or {}).get("prompt") for r in runs.values()} - {None}
    b.set_title("countries, prompt " + (repr(prompts.pop()) if len(prompts) == 1 else "per model"), fontsize=10)
    b.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save(fig, path)


TRACE_LABELS = {"first_subject": "first subject token", "middle_subject": "middle subject tokens",
                "last_subject": "last subject token", "first_after": "first subsequent token",
                "further": "further tokens", "last": "last token"}


def plot_trace(result: dict, path) -> None:
    """Per kind (a row): the average indirect effect as a heatmap (token bucket x layer) over the kind's facts,
    and the last-subject-token and last-token curves with their 95% bootstrap bands (``result["pooled"]``: a run's
    own pooling, or a page's, which may add ``n_relations``: then the bands resample relations)."""
    pooled = result.get("pooled") or {}
    kinds = [k for k in pooled if pooled[k].get("aie")]
    if not kinds:
        return
    fig, axes = subplots(len(kinds), 2, figsize=(11.0, 2.6 * len(kinds)), squeeze=False, layout="constrained")
    for (ax_h, ax_l), kind in zip(axes, kinds):
        s = pooled[kind]
        buckets = list(TRACE_LABELS)
        layers = [r["layer"] for r in s["aie"][buckets[0]]]
        grid = np.array([[np.nan if r["aie"] is None else r["aie"] for r in s["aie"][b]] for b in buckets])
        vmax = max(1e-6, float(np.nanmax(np.abs(grid)))) if np.isfinite(grid).any() else 1.0
        im = ax_h.imshow(grid, aspect="auto", cmap="RdBu_r", vmin=-vmax, vmax=vmax, interpolation="nearest")
        ax_h.set_yticks(range(len(buckets)), [TRACE_LABELS[b] for b in buckets], fontsize=7)
        step = max(1, len(layers) // 10)
        ax_h.set_xticks(range(0, len(layers), step), [("emb" if l < 0 else str(l)) for l in layers[::step]],
                        fontsize=7)
        ax_h.set_xlabel("layer", fontsize=8)
        over = f" over {s['n_relations']} relations" if s.get("n_relations") else ""
        ax_h.set_title(f"{kind}: average indirect effect ({s['n_facts']} known facts{over}; total effect "
                       f"{s['total_effect']:.2f})", fontsize=8)
        fig.colorbar(im, ax=ax_h, shrink=0.8)
        for b, color in (("last_subject", "tab:red"), ("last", "tab:blue")):
            rows = s["aie"][b]
            x = [r["layer"] for r in rows]
            y = [np.nan if r["aie"] is None else r["aie"] for r in rows]
            lo = [np.nan if r["aie_ci"] is None or r["aie_ci"][0] is None else r["aie_ci"][0] for r in rows]
            hi = [np.nan if r["aie_ci"] is None or r["aie_ci"][1] is None else r["aie_ci"][1] for r in rows]
            ax_l.plot(x, y, "o-", ms=2, color=color, label=TRACE_LABELS[b])
            ax_l.fill_between(x, lo, hi, color=color, alpha=0.2)
        ax_l.axhline(0, color="k", lw=0.5)
        ax_l.set_xlabel("layer (-1: embedding)" if -1 in layers else "layer (window centre)", fontsize=8)
        ax_l.set_ylabel("indirect effect", fontsize=8)
        ax_l.legend(fontsize=7)
        ax_l.grid(lw=0.3)
    fig.suptitle(f"Causal tracing of {result.get('model', '?')}", fontsize=9)
    save(fig, path)
