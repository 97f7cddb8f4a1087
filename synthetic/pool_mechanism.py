"""The page ``docs/results_pool.md``'s section on the mechanism as a continuous outcome: every trained model's
zero-shot accuracy and held-out superposition R^2 against d / (R A), in bands with bootstrap intervals, per-loss
Spearman with Holm, and its figure."""

from __future__ import annotations

import statistics
from pathlib import Path

from synthetic.threshold_study import GEOMETRIC, REGIMES


MECHANISM_BINS = (0.0, 0.05, 0.1, 0.25, 1.0, float("inf"))  # edges of d / (R A) for the mechanism's curve


def _ratio(r: dict) -> float:
    return r["d"] / (r["relations"] * r["attributes"])


def mechanism_rows(rows: list[dict]) -> list[dict]:
    """Every trained model of sections 2 and 3 (threshold and regime-map runs) as one point: its loss, d / (R A),
    training accuracy, held-out superposition R^2 and zero-shot accuracy."""
    return [{"loss": r["train_config"]["loss"], "ratio": _ratio(r), "train_accuracy": r["train_accuracy"],
             "r2_heldout": r["r2_heldout"], "zero_shot_accuracy": r["zero_shot_accuracy"]}
            for r in rows if r.get("zero_shot_accuracy") is not None and r.get("r2_heldout") is not None]


def mechanism_section(points: list[dict]) -> list[str]:
    """The mechanism as a continuous outcome: per training loss and band of d / (R A) (the width over what
    orthogonal attribute codes would need), the models' mean zero-shot accuracy and held-out R^2 with 95%
    bootstrap intervals over models, and per loss Spearman's rho of each against d / (R A) (permutation p, Holm
    over the four tests). No cutoff decides anything here."""
    from mechfact import stats

    if not points:
        return []
    losses = sorted({p["loss"] for p in points})
    name = {"ce": "cross-entropy", "mse": "squared error"}
    out = ["## The mechanism as a continuous outcome", "",
           f"Every trained model of sections 2 and 3 ({len(points)} models) by its training loss and by d / (R A), "
           "its width over the R A that orthogonal attribute codes would need: mean zero-shot accuracy and held-out "
           "superposition R^2 with 95% bootstrap intervals over models (n: models; each a world, seed and "
           "configuration), the mean training accuracy beside them. The models were trained for sections 2 and 3, "
           "not for this curve: the bands are unevenly filled and N, R and A vary inside each.", "",
           "| loss | d / (R A) | n | train accuracy | zero-shot [95%] | R^2 held-out [95%] |", "|---|---|---|---|---|---|"]
    tests = []
    for loss in losses:
        mine = [p for p in points if p["loss"] == loss]
        for lo, hi in zip(MECHANISM_BINS[:-1], MECHANISM_BINS[1:]):
            b = [p for p in mine if lo <= p["ratio"] < hi]
            if not b:
                continue
            z = stats.bootstrap([p["zero_shot_accuracy"] for p in b], seed=0)
            r2 = stats.bootstrap([p["r2_heldout"] for p in b], seed=0)
            band = f"{lo:g}-{hi:g}" if hi != float("inf") else f">= {lo:g}"

            def ci(e):
                return f"{e.value:.2f}" if e.low is None else f"{e.value:.2f} [{e.low:.2f}, {e.high:.2f}]"
            out.append(f"| {name.get(loss, loss)} | {band} | {len(b)} | "
                       f"{statistics.mean(p['train_accuracy'] for p in b):.2f} | {ci(z)} | {ci(r2)} |")
        for key in ("zero_shot_accuracy", "r2_heldout"):
            t = stats.spearman([p["ratio"] for p in mine], [p[key] for p in mine], seed=0)
            if t["p_value"] is not None:
                tests.append((loss, key, t, len(mine)))
    if tests:
        holm = stats.holm([t[2]["p_value"] for t in tests])
        out += ["", "Spearman's rho against d / (R A), per loss (permutation p; Holm over these "
                f"{len(tests)} tests): " + "; ".join(
                    f"{name.get(loss, loss)}, {'zero-shot' if key == 'zero_shot_accuracy' else 'R^2'}: rho "
                    f"{t['rho']:+.2f} [{t['rho_ci'][0]:+.2f}, {t['rho_ci'][1]:+.2f}] (n {n}, p "
                    f"{t['p_value']:.3g}, Holm {h:.3g})" for (loss, key, t, n), h in zip(tests, holm)) + ".", ""]
    out += ["![the mechanism against d / (R A)](img/mechanism_pool.png)", ""]
    return out


def mechanism_figure(points: list[dict], path: Path) -> None:
    from mechfact.plotting import save, subplots

    fig, axes = subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "zero_shot_accuracy", "zero-shot accuracy"),
                           (axes[1], "r2_heldout", "held-out superposition R^2")):
        for loss, color, name in (("ce", "tab:blue", "cross-entropy"), ("mse", "tab:orange", "squared error")):
            mine = [p for p in points if p["loss"] == loss]
            if mine:
                ax.scatter([p["ratio"] for p in mine], [p[key] for p in mine], s=12, alpha=0.6, color=color,
                           label=f"{name} ({len(mine)} models)")
        ratio_axis(ax, label)
    fig.suptitle("The geometric mechanism against width over R A (every model of sections 2 and 3)")
    save(fig, path)


def ratio_axis(ax, label: str, legend: int = 8) -> None:
    """An axis against d / (R A): log scale, a dashed line at d = R A, the labels and the legend."""
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel("d / (R A)  (dashed: d = R A)")
    ax.set_ylabel(label)
    ax.legend(fontsize=legend)


def _reading(rows: list[dict]) -> str:
    """Per regime and factor: how many (world, seed) models show the geometric mechanism (held-out R^2 and
    zero-shot accuracy both >= GEOMETRIC), with the medians."""
    out = [f"Models showing the geometric mechanism (held-out R^2 >= {GEOMETRIC} and zero-shot accuracy >= "
           f"{GEOMETRIC}), over every world and seed:", ""]
    ns = sorted({r["subjects"] for r in rows})
    for regime, n in ((g, n) for g in REGIMES for n in ns):
        parts = []
        for f in sorted({r["factor"] for r in rows if r["regime"] == regime and r["subjects"] == n}):
            g = [r for r in rows if r["regime"] == regime and r["factor"] == f and r["subjects"] == n]
            k = sum(r["r2_heldout"] >= GEOMETRIC and r["zero_shot_accuracy"] >= GEOMETRIC for r in g)
            parts.append(f"{f:g} d*: {k} of {len(g)} (train accuracy "
                         f"{statistics.median(r['train_accuracy'] for r in g):.2f}, "
                         f"R^2 {statistics.median(r['r2_heldout'] for r in g):.2f}, "
                         f"zero-shot {statistics.median(r['zero_shot_accuracy'] for r in g):.2f})")
        if parts:
            out.append(f"- {regime}" + (f", N = {n}" if len(ns) > 1 else "") + ": " + "; ".join(parts) + ".")
    return "\n".join(out)
