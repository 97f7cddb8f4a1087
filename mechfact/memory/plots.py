"""Figures for the linear-memory experiments, drawn from result.json only."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np

from ..plotting import save, subplots
from . import theory


def _lines(ax, vertical: bool = True) -> None:
    f = ax.axvline if vertical else ax.axhline
    f(theory.ALPHA_OPTIMAL, color="k", ls="--", lw=1, label="optimal 1/2")
    f(theory.ALPHA_HEBB, color="tab:red", ls=":", lw=1, label="Hebb 1/8")


def plot_sweep(result: dict, path) -> None:
    pts = result["points"]
    fig, ax = subplots(figsize=(6.4, 4.2))
    groups = defaultdict(list)
    for r in pts:
        groups[(r["d"], r["method"], r["problem"], r["kappa"])].append(r)
    for (d, method, problem, kappa), rs in sorted(groups.items()):
        by_p = defaultdict(list)
        for r in rs:
            by_p[r["alpha"]].append(r["accuracy"])
        a = np.array(sorted(by_p))
        m = np.array([np.mean(by_p[x]) for x in a])
        lo = np.array([np.min(by_p[x]) for x in a])
        hi = np.array([np.max(by_p[x]) for x in a])
        line, = ax.plot(a, m, "o-", ms=3, label=f"d={d} {method} {problem}" + (f" k={kappa}" if kappa != 1 else ""))
        ax.fill_between(a, lo, hi, color=line.get_color(), alpha=0.15)
    _lines(ax)
    ax.set_xlabel(r"load $\alpha = p\ln p / d^2$")
    ax.set_ylabel("recall accuracy (fraction of inputs)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Accuracy vs load (band: min-max over seeds)")
    ax.legend(fontsize=7)
    save(fig, path)


def plot_capacity(result: dict, path) -> None:
    caps = result["capacity"]
    fig, ax = subplots(figsize=(6.4, 4.2))
    if caps:
        x = np.array([1 / math.log(c["p_c"]) for c in caps if c["p_c"] >= 3])
        y = np.array([c["alpha_c"] for c in caps if c["p_c"] >= 3])
        ds = np.array([c["d"] for c in caps if c["p_c"] >= 3])
        sc = ax.scatter(x, y, c=np.log2(ds), cmap="viridis", s=18, label="per (d, seed)")
        cb = fig.colorbar(sc, ax=ax)
        cb.set_label("log2 d")
        fit = result.get("extrapolation") or {}
        if fit.get("alpha_inf") is not None:
            xs = np.linspace(0, max(x) * 1.05, 50)
            ax.plot(xs, fit["alpha_inf"] + fit["slope"] * xs, "-", color="tab:purple",
                    label=f"fit: alpha_inf = {fit['alpha_inf']:.3f} ± {fit['alpha_inf_se']:.3f}")
        m = caps[0]
        ax.set_title(f"Perfect-recall capacity ({m['method']}, {m['problem']}, kappa={m['kappa']})")
    _lines(ax, vertical=False)
    ax.set_xlim(left=0)
    ax.set_xlabel(r"$1/\ln p_c$  (0 = infinite size)")
    ax.set_ylabel(r"$\alpha_c = p_c \ln p_c / d^2$")
    ax.legend(fontsize=7)
    save(fig, path)


def plot_scores(result: dict, path) -> None:
    per = result["per_input"]
    methods = list(per)
    fig, axes = subplots(1, len(methods), figsize=(5.2 * len(methods), 3.8), squeeze=False)
    for ax, meth in zip(axes[0], methods):
        zt, zm = np.array(per[meth]["z_target"]), np.array(per[meth]["z_max"])
        bins = np.linspace(min(zt.min(), zm.min()) - 0.2, max(zt.max(), zm.max()) + 0.2, 50)
        ax.hist(zm, bins=bins, alpha=0.6, color="tab:gray", label="max competitor")
        ax.hist(zt, bins=bins, alpha=0.6, color="tab:blue", label="target")
        s = result["summary"][meth]
        ax.axvline(s["evt_sqrt_2lnp"], color="k", ls="--", lw=1, label=r"$\sqrt{2\ln p}$")
        ax.axvline(s["expected_max_gaussian"], color="tab:red", ls=":", lw=1, label="E max of p Gaussians")
        ax.set_title(f"{meth}: acc {s['accuracy']:.3f}, target spread {s['z_target_std']:.2f}")
        ax.set_xlabel("score in units of that input's competitor std")
        ax.legend(fontsize=7)
    save(fig, path)


def plot_spectrum(result: dict, path) -> None:
    sv = result["singular_values"]
    kappa = result.get("kappa", 1.0)
    fig, ax = subplots(figsize=(6.4, 4.2))
    bins = np.linspace(0, 3.2, 40)
    for name, v in sv.items():
        ax.hist(v, bins=bins, density=True, histtype="step", lw=1.5, label=f"{name} (KS {result['ks_to_theory'][name]:.3f})")
    xs = np.linspace(0, 3.2, 300)
    ys = theory.quarter_circle_pdf(xs) if kappa >= 1 else theory.truncated_quarter_circle_pdf(xs, kappa)
    ax.plot(xs, ys, "k--", lw=1.2, label="quarter circle" if kappa >= 1 else f"truncated quarter circle k={kappa}")
    ax.set_xlabel("singular value / RMS singular value")
    ax.set_ylabel("density")
    ax.set_title("Singular values of W")
    ax.legend(fontsize=7)
    save(fig, path)


def plot_rank(result: dict, path) -> None:
    fig, ax = subplots(figsize=(6.4, 4.2))
    summ = result["summary"]
    for d in sorted({s["d"] for s in summ}):
        rows = sorted((s for s in summ if s["d"] == d), key=lambda s: s["kappa"])
        k = [s["kappa"] for s in rows]
        ax.errorbar(k, [s["alpha_c_median"] for s in rows],
                    yerr=[[s["alpha_c_median"] - s["alpha_c_q25"] for s in rows], [s["alpha_c_q75"] - s["alpha_c_median"] for s in rows]],
                    fmt="o-", capsize=3, label=f"measured d={d}")
    ks = np.linspace(0.05, 1, 60)
    ax.plot(ks, [theory.alpha_c_rank_dof(k) for k in ks], "k--", lw=1, label=r"$\frac{1}{2}\kappa(2-\kappa)$")
    ax.plot(ks, [theory.alpha_c_rank_energy(k) for k in ks], "k:", lw=1, label="1/2 x quarter-circle energy")
    ax.set_xlabel(r"rank fraction $\kappa = m/d$")
    ax.set_ylabel(r"$\alpha_c(\kappa)$")
    ax.set_title("Capacity of rank-constrained memories")
    ax.legend(fontsize=7)
    save(fig, path)
