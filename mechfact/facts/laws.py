"""Which law of the threshold d* (the smallest embedding width that stores every fact) predicts settings it was not
fitted on: the candidate laws compared by leave-one-N-out prediction, with AIC / BIC on the same data.

Candidates, each fitted to the thresholds of trainable-embedding models (one point per (setting, seed): a seed is
a new world and a new initialisation):

* affine in a named quantity, ``d* = a f + b`` (2 parameters): ``R ln N`` (paper B's Theta(R log N)), ``R ln A``
  (the attributes' bits), ``N R`` (the facts), ``R ln N ln ln N``;
* the free power law ``d* = C R^alpha N^beta A^gamma`` (a factor that takes one value is left out).

All are fitted to minimise the squared RELATIVE error (thresholds span 2 to 100; a law is as wrong at 3 for 2 as at
60 for 40), the power law by least squares on logs. **Leave one N out**: every law is refitted on the settings of
all other N and predicts the held-out N's thresholds; the error is the root mean square relative error over the
held-out points, per held-out N and pooled. **AIC / BIC** from the relative residuals of the full fit (Gaussian,
``n ln(RSS / n) + 2k`` and ``+ k ln n``). **The verdict** is paired: the held-out squared relative errors of the
best law and of each rival, averaged per setting (seeds together), compared over settings by a sign-flip test
(:func:`mechfact.stats.paired_difference`), Holm-corrected over the rivals; the best law "beats" a rival when
the corrected p < 0.05.

A settings whose seeds did not all reach a threshold above the grid's smallest width is left out (a bound is not a
value), as in :func:`mechfact.facts.capacity.power_law_fit`.
"""

from __future__ import annotations

import math

import numpy as np

from .. import stats

LAWS = {
    "R ln N": lambda n, r, a: r * np.log(n),
    "R ln A": lambda n, r, a: r * np.log(a),
    "N R": lambda n, r, a: n * r,
    "R ln N ln ln N": lambda n, r, a: r * np.log(n) * np.log(np.log(n)),
}
POWER = "free power law"


def threshold_points(thresholds: list[dict]) -> dict[str, np.ndarray]:
    """Arrays ``n``, ``r``, ``a``, ``d``, ``seed`` of the usable trainable-embedding thresholds (module docstring)."""
    return _points([t for t in thresholds
                    if t.get("embeddings", "trainable") == "trainable" and t.get("searched", "d") == "d"])


def width_points(thresholds: list[dict], embeddings: str) -> dict[str, np.ndarray]:
    """The same arrays for the MLP-width thresholds m* of one embedding regime (``d`` holds m*)."""
    return _points([t for t in thresholds if t.get("searched") == "mlp-width" and t["embeddings"] == embeddings])


def _points(rows: list[dict]) -> dict[str, np.ndarray]:
    key = lambda t: (t["subjects"], t["relations"], t.get("attributes", t["subjects"]))  # noqa: E731
    bad = {key(t) for t in rows if t["threshold"] is None or t.get("at_grid_min")}
    rows = [t for t in rows if key(t) not in bad]
    cols = {"n": [key(t)[0] for t in rows], "r": [key(t)[1] for t in rows], "a": [key(t)[2] for t in rows],
            "d": [t["threshold"] for t in rows], "seed": [t["seed"] for t in rows]}
    return {k: np.asarray(v, dtype=float) for k, v in cols.items()}


def _fit(law: str, p: dict, idx: np.ndarray, laws: dict):
    """(predict(points, idx) -> d*, number of parameters) of ``law`` (a name in ``laws`` or the power law) fitted
    on the points ``idx``."""
    d = p["d"][idx]
    if law == POWER:
        names = [k for k in ("r", "n", "a") if len(np.unique(p[k][idx])) >= 2]
        X = np.column_stack([np.ones(len(idx))] + [np.log(p[k][idx]) for k in names])
        beta = np.linalg.lstsq(X, np.log(d), rcond=None)[0]

        def predict(q, j):
            return np.exp(beta[0] + sum(b * np.log(q[k][j]) for b, k in zip(beta[1:], names)))
        return predict, 1 + len(names)
    f = laws[law](p["n"][idx], p["r"][idx], p["a"][idx])
    X = np.column_stack([f / d, 1.0 / d])  # minimise sum ((d - a f - b) / d)^2
    coef = np.linalg.lstsq(X, np.ones(len(idx)), rcond=None)[0]

    def predict(q, j):
        return coef[0] * laws[law](q["n"][j], q["r"][j], q["a"][j]) + coef[1]
    return predict, 2


def compare_laws(thresholds: list[dict], *, seed: int = 0, laws: dict | None = None,
                 points: dict[str, np.ndarray] | None = None, hold_out: str = "n") -> dict:
    """Every candidate law's full-fit error, AIC, BIC and held-out error, and the paired verdict of the best
    held-out law against each rival (module docstring). ``laws``: the affine candidates (default :data:`LAWS`; the
    free power law is always one); ``points``: the values to fit (default the d* of ``thresholds``,
    :func:`threshold_points`); ``hold_out``: ``"n"`` leaves one N out, ``"setting"`` one (N, R, A) setting.
    Empty with fewer than three groups to hold out."""
    if hold_out not in ("n", "setting"):
        raise ValueError(f"hold_out {hold_out!r}: allowed values are 'n', 'setting'")
    p = threshold_points(thresholds) if points is None else points
    laws = LAWS if laws is None else laws
    trip = list(zip(p["n"].tolist(), p["r"].tolist(), p["a"].tolist()))
    index = {t: i for i, t in enumerate(sorted(set(trip)))}
    group = p["n"] if hold_out == "n" else np.array([index[t] for t in trip], dtype=float)
    groups = sorted(set(group.tolist()))
    if len(groups) < 3:
        return {}
    m = len(p["d"])
    allidx = np.arange(m)
    out_laws = {}
    held_err = {}
    for law in [*laws, POWER]:
        predict, k = _fit(law, p, allidx, laws)
        rel = (p["d"] - predict(p, allidx)) / p["d"]
        rss = float(rel @ rel)
        out = np.empty(m)
        per_n = {}
        for g in groups:
            tr, te = allidx[group != g], allidx[group == g]
            pr, _ = _fit(law, p, tr, laws)
            out[te] = (p["d"][te] - pr(p, te)) / p["d"][te]
            if hold_out == "n":
                per_n[int(g)] = float(np.sqrt(np.mean(out[te] ** 2)))
        held_err[law] = out ** 2
        out_laws[law] = {"k": k, "rms_rel_error": math.sqrt(rss / m), "aic": m * math.log(rss / m) + 2 * k,
                         "bic": m * math.log(rss / m) + k * math.log(m),
                         "held_out_rms_rel_error": float(np.sqrt(np.mean(out ** 2))), "held_out_per_n": per_n}
    laws = out_laws
    best = min(laws, key=lambda law: laws[law]["held_out_rms_rel_error"])
    settings = sorted({(n, r, a) for n, r, a in zip(p["n"], p["r"], p["a"])})

    def per_setting(err):
        return [float(np.mean([e for e, *s in zip(err, p["n"], p["r"], p["a"]) if tuple(s) == key]))
                for key in settings]
    vs = {}
    for law in laws:
        if law != best:
            vs[law] = stats.paired_difference(per_setting(held_err[law]), per_setting(held_err[best]), seed=seed)
    rivals = list(vs)
    for law, q in zip(rivals, stats.holm([vs[law]["p_value"] for law in rivals])):
        vs[law]["p_holm"] = q
        vs[law]["beaten"] = bool(q < 0.05 and vs[law]["diff"] > 0)
    return {"n_points": m, "n_settings": len(settings), "n_values": sorted({int(n) for n in p["n"]}),
            "n_seeds": int(len(set(p["seed"].tolist()))), "hold_out": hold_out, "laws": laws, "best": best,
            "best_vs": vs}


# paper A's linear memory at capacity: p ln p / d^2 = 1/2 associations, log2 p bits each, on d^2 parameters
LINEAR_MEMORY_BITS = 1 / (2 * math.log(2))


def bits_per_parameter(thresholds: list[dict]) -> list[dict]:
    """Per setting (median d* over its seeds): the facts' information ``N R log2 A`` bits over the trainable
    parameters of the fact model at that width (its MLP width as searched)."""
    from .model import build_fact_model
    from .world import FactWorld

    p = threshold_points(thresholds)
    width = {(t["subjects"], t["relations"], t.get("attributes", t["subjects"])): t.get("mlp_width", 64)
             for t in thresholds}
    out = []
    for key in sorted({(int(n), int(r), int(a)) for n, r, a in zip(p["n"], p["r"], p["a"])}):
        sel = (p["n"] == key[0]) & (p["r"] == key[1]) & (p["a"] == key[2])
        d = int(math.ceil(float(np.median(p["d"][sel]))))
        model = build_fact_model(FactWorld(key[0], key[1], seed=0, attributes=key[2]), d=d, mlp_width=width[key])
        params = sum(q.numel() for q in model.parameters() if q.requires_grad)
        out.append({"subjects": key[0], "relations": key[1], "attributes": key[2], "d": d, "parameters": params,
                    "bits": key[0] * key[1] * math.log2(key[2]),
                    "bits_per_parameter": key[0] * key[1] * math.log2(key[2]) / params})
    return out


def bits_summary(thresholds: list[dict]) -> str:
    """:func:`bits_per_parameter` in words: the settings counted, the median and range, where the most is."""
    bpp = bits_per_parameter(thresholds)
    v = np.array([b["bits_per_parameter"] for b in bpp])
    top = max(bpp, key=lambda b: b["bits_per_parameter"])
    return (f"{len(bpp)} settings, median {np.median(v):.3f}, range {v.min():.3f}-{v.max():.3f} (the most at "
            f"N = {top['subjects']}, R = {top['relations']}, A = {top['attributes']}, d* = {top['d']})")


def table_rows(c: dict) -> list[str]:
    """The comparison's table: one row per law, best held-out law first."""
    by_n = c["hold_out"] == "n"
    held = ("leave-one-N-out RMS relative error: " + " / ".join(f"N = {n}" for n in c["n_values"]) + " | pooled"
            if by_n else "leave-one-setting-out RMS relative error")
    rows = [f"| law | parameters | RMS relative error (all points) | AIC | BIC | {held} |",
            "|---|---|---|---|---|---|" + ("---|" if by_n else "")]
    for law, x in sorted(c["laws"].items(), key=lambda kv: kv[1]["held_out_rms_rel_error"]):
        rows.append(f"| {law} | {x['k']} | {x['rms_rel_error']:.3f} | {x['aic']:.1f} | {x['bic']:.1f} | "
                    + (" / ".join(f"{x['held_out_per_n'][n]:.3f}" for n in c["n_values"]) + " | " if by_n else "")
                    + f"{x['held_out_rms_rel_error']:.3f} |")
    return rows


def verdict(c: dict) -> str:
    """The comparison's verdict sentence: the best held-out law, the rivals it beats and those it does not."""
    best = c["best"]
    beats = [law for law, v in c["best_vs"].items() if v["beaten"]]
    ties = [law for law in c["best_vs"] if law not in beats]
    detail = "; ".join(f"{law} {v['diff']:+.3f} (Holm p {stats.format_p(v['p_holm'])})"
                       for law, v in c["best_vs"].items())
    return (f"Held out, **{best}** predicts best; it beats " + (", ".join(beats) if beats else "no rival")
            + (" and is not distinguishable from " + ", ".join(ties) if ties else "")
            + f" (each rival's mean squared relative error per setting minus the best law's, paired over the "
            f"{c['n_settings']} settings, sign-flip test, Holm over the {len(c['best_vs'])} rivals: {detail}).")


def _table(c: dict) -> list[str]:
    """The comparison's rows, best held-out law first, and its verdict sentence."""
    return [*table_rows(c), "", verdict(c)]


def laws_section(thresholds: list[dict], budget: str) -> list[str]:
    """The page's section: one row per law and the verdict sentence (nothing with fewer than three N)."""
    c = compare_laws(thresholds)
    if not c:
        return []
    bits = (f"Bits per parameter at d* (the facts' N R log2 A bits over the model's trainable parameters at the "
            f"median d*): {bits_summary(thresholds)}; paper A's linear memory at capacity stores 1 / (2 ln 2) = "
            f"{LINEAR_MEMORY_BITS:.2f} bits per parameter. With the subject embeddings (N d) most of the parameters, "
            "the ratio is about R log2 A / d*.")
    return ["Laws compared on held-out N (`mechfact.facts.laws`): every law refitted without one N and asked to "
            f"predict it; {c['n_points']} thresholds ({c['n_settings']} settings, seeds {c['n_seeds']} at most, "
            f"N = {', '.join(map(str, c['n_values']))}), each a {budget} threshold, which has not converged "
            "(see the budget check above): the verdict is about these thresholds, not yet the law at "
            "convergence.", "", *_table(c), "", bits, ""]


# m* of fixed embeddings: the facts N R, or their bits N R log2 A (the same affine family as N R ln A: a law a N R
# log2 A + b is a / ln 2 N R ln A + b, so the two predict alike and are one candidate here)
WIDTH_LAWS = {
    "N R": lambda n, r, a: n * r,
    "N R ln A": lambda n, r, a: n * r * np.log(a),
}


def width_laws_section(thresholds: list[dict], embeddings: tuple[str, ...] = ("frozen-input", "frozen")) -> list[str]:
    """m* per embedding regime: the laws of :data:`WIDTH_LAWS` and the free power law, each refitted without one
    (N, R, A) setting and asked to predict it (two values of N are too few to leave one out), with the verdict."""
    out = []
    for e in embeddings:
        c = compare_laws([], laws=WIDTH_LAWS, points=width_points(thresholds, e), hold_out="setting")
        if not c:
            continue
        out += [f"m* laws, `{e}` embeddings ({c['n_points']} thresholds, {c['n_settings']} settings that reached "
                f"above the grid's smallest width, N = {', '.join(map(str, c['n_values']))}, seeds "
                f"{c['n_seeds']} at most): every law refitted without one setting and asked to predict it. "
                "N R log2 A (the facts' bits) is N R ln A rescaled, the same candidate.", "", *_table(c), ""]
    return out


__all__ = ["LAWS", "WIDTH_LAWS", "POWER", "LINEAR_MEMORY_BITS", "threshold_points", "width_points", "compare_laws",
           "bits_per_parameter", "laws_section", "width_laws_section", "table_rows", "verdict"]
