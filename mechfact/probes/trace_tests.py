"""Causal-tracing claims decided by tests stated before the run, with intervals that resample RELATIONS.

A trace's facts are not independent units: facts of one relation share a template, an object set and often a
mechanism. Every interval here comes from one relation-clustered bootstrap: each draw resamples the relations with
replacement and pools their facts, and every statistic of a page is computed on the SAME draws, so a difference of
two statistics is paired. What the draws give:

* :func:`curve` -- the average indirect effect per layer of one token bucket, with its interval;
* :func:`peak` -- the peak layer of that curve as a distribution over draws (its mode, a 95% interval of the
  layer, the share of draws at each layer), not one best-of-layers value;
* :func:`peak_values` / :func:`early_mean` -- a curve's peak AIE and the last subject token's early-layer mean in
  every draw, from which :func:`decide` forms the paired differences and ratios of two kinds on the same facts
  (severing, MLP 0 excluded);
* :func:`verdict` -- a rule written before the run: ``holds`` when the statistic's whole interval lies on the
  claim's side of the threshold, ``does not`` when it lies wholly on the other side, else ``undecided``.

The published comparison (Meng et al. 2022, GPT-2 XL, 1000 facts) is :data:`RULES`: each claim, the statistic
that decides it and the threshold.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ..stats import CONFIDENCE, N_BOOT
from .tracing import BUCKETS

# A rule per published claim: (name, the claim in words, the statistic, side, threshold). "side" says which side of
# the threshold the statistic must lie on for the claim to hold.
RULES = (
    ("mlp_depth", "the MLP effect at the last subject token peaks at an early-middle depth (GPT-2 XL: layer 17 of "
     "48, 0.35)", "peak depth of the MLP (window w) curve at the last subject token, 95% interval over draws",
     "inside", (0.15, 0.55)),
    ("mlp_place", "the MLP effect is stronger at the last subject token than at the last token",
     "peak AIE at the last subject token minus peak AIE at the last token (MLP, window w), paired", ">", 0.0),
    ("attn_place", "the attention effect is stronger at the last token than at the last subject token",
     "peak AIE at the last token minus peak AIE at the last subject token (attention, window w), paired", ">", 0.0),
    ("attn_depth", "the attention effect at the last token peaks in the later half",
     "peak depth of the attention curve at the last token, 95% interval over draws", "inside", (0.5, 1.0)),
    ("sever_mlp", "severing the later MLPs removes more than half of the last subject token's early-layer effect",
     "1 - (severed-MLP effect / effect restored alone), early layers, last subject token, paired", ">", 0.5),
    ("sever_attn", "severing the later attention keeps more than half of that effect",
     "severed-attention effect / effect restored alone, early layers, last subject token, paired", ">", 0.5),
)
# The first claim again on the other MLP curves, beside window w: one layer's MLP (window 1), and window w with MLP 0
# never restored (where the window-w peak is MLP 0's, this curve says where the rest of the MLP effect lies).
VARIANTS = {
    "mlp_w1": ("mlp_depth_w1", "the same, MLP of one layer (window 1)", "peak depth of the window-1 MLP curve at the "
               "last subject token, 95% interval over draws", "inside", (0.15, 0.55)),
    "mlp_no0": ("mlp_depth_no0", "the same, window w with MLP 0 excluded", "peak depth of the MLP-0-excluded curve "
                "at the last subject token, 95% interval over draws", "inside", (0.15, 0.55)),
}
# The two corruptions compared: whether Gaussian noise on the subject's embeddings and the subject swapped for another
# of the same token length (Zhang & Nanda 2024) put the last subject token's state peak at the same depth. Written
# after SmolLM2's two point estimates were seen (layers 9 and 11 of 30), before any other model's replace traces ran.
CORRUPTION_RULE = ("corruptions", "noise and subject replacement put the last subject token's state peak at the same "
                   "depth, within a tenth of the depth", "peak depth under replace minus peak depth under noise "
                   "(state, last subject token), the same relations drawn for both runs, 95% interval over draws",
                   "inside", (-0.1, 0.1))
MIN_RELATIONS = 5  # fewer relations than this: no interval (a resample of 2-4 clusters has few distinct draws)
# The MLP-0 check: an MLP "peak" that vanishes when MLP 0 is never restored is MLP 0's detokenisation under
# embedding noise, not a mid-layer store. Flagged when the MLP-0-excluded peak keeps less than half of the MLP peak.
MLP0_RULE = ("mlp0", "the MLP effect does not rest on MLP 0 alone",
             "peak AIE of the MLP-0-excluded curve / peak AIE of the MLP curve, at the token bucket where the MLP "
             "curve peaks highest, paired", ">", 0.5)


@dataclass(frozen=True)
class Traces:
    """The indirect effects of one kind: ``ie`` (facts, 6 buckets, layers), a relation label per fact."""

    ie: np.ndarray
    relations: tuple[str, ...]
    layers: tuple[int, ...]
    n_layers: int

    @classmethod
    def from_rows(cls, rows: list[dict], kind: str, n_layers: int) -> "Traces | None":
        """From a trace run's ``per_relation`` rows (``mlp_no0`` merged with ``mlp`` over every layer)."""
        from .tracing import FactTrace

        ie, rel, layers = [], [], None
        for r in rows:
            if r["kind"] != kind or not r.get("facts"):
                continue
            r = merged_no0(r, rows) if kind == "mlp_no0" else r
            if layers is not None and tuple(r["layers"]) != layers:
                raise ValueError(f"kind {kind}: relations traced on different layers")
            layers = tuple(r["layers"])
            for f in r["facts"]:
                ft = FactTrace(index=f["index"], target=f["target"], subject=tuple(f["subject"]),
                               answer_pos=f["answer_pos"], clean=f["clean"], corrupt=f["corrupt"],
                               scores=np.array(f["scores"], dtype=float))
                ie.append(ft.buckets() - ft.corrupt)
                rel.append(r["relation"])
        if not ie:
            return None
        return cls(np.stack(ie), tuple(rel), layers, n_layers)

    def subset(self, relations) -> "Traces":
        """The facts of ``relations`` only, in the same order."""
        keep = set(relations)
        rows = [i for i, r in enumerate(self.relations) if r in keep]
        return Traces(self.ie[rows], tuple(self.relations[i] for i in rows), self.layers, self.n_layers)

    def align(self, other: "Traces") -> None:
        if self.relations != other.relations:
            raise ValueError("paired statistics need the same facts in the same order in both kinds")


def merged_no0(row: dict, rows: list[dict]) -> dict:
    """An ``mlp_no0`` row over every layer: the same relation's ``mlp`` row (window w) with the layers whose window
    holds MLP 0 replaced by their MLP-0-excluded scores (the row itself when that relation has no ``mlp`` row)."""
    full = next((r for r in rows if r["kind"] == "mlp" and r["relation"] == row["relation"] and r.get("facts")),
                None)
    if full is None:
        return row
    cols = [full["layers"].index(l) for l in row["layers"]]
    facts = []
    for f, g in zip(full["facts"], row["facts"]):
        if f["index"] != g["index"]:
            raise ValueError(f"{row['relation']}: mlp and mlp_no0 rows trace different facts")
        sc = np.array(f["scores"], dtype=float)
        sc[:, cols] = np.array(g["scores"], dtype=float)
        facts.append({**f, "scores": sc.tolist()})
    return {**row, "layers": full["layers"], "facts": facts}


def draws(relations, n_boot: int = N_BOOT, seed: int = 0) -> list[np.ndarray]:
    """Relation-clustered resamples: per draw, the fact indices of relations drawn with replacement (one run's
    :func:`paired_draws` with itself)."""
    return paired_draws(relations, relations, n_boot, seed)[0]


def paired_draws(a, b, n_boot: int = N_BOOT, seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Relation-clustered resamples of two runs drawn together: per draw the relations both runs traced, drawn
    with replacement, and each run's fact indices of those relations (``a`` and ``b``: a relation label per fact).
    A statistic comparing the runs is then paired over relations although their facts differ."""
    common = [r for r in dict.fromkeys(a) if r in set(b)]
    if not common:
        raise ValueError("paired draws need relations that both runs traced; they share none")
    ga, gb = ({r: np.flatnonzero(np.asarray(x) == r) for r in common} for x in (a, b))
    rng = np.random.default_rng(seed)
    ia, ib = [], []
    for _ in range(n_boot):
        pick = [common[k] for k in rng.integers(0, len(common), len(common))]
        ia.append(np.concatenate([ga[r] for r in pick]))
        ib.append(np.concatenate([gb[r] for r in pick]))
    return ia, ib


def n_clusters(relations) -> int:
    return len(set(relations))


def _curves(t: Traces, bucket: str, idx: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(the full-data curve (layers,), the draws' curves (n_boot, layers)) of a bucket."""
    b = BUCKETS.index(bucket)
    x = t.ie[:, b, :]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a draw whose facts all lack the bucket: NaN, left out
        full = np.nanmean(x, 0)
        boots = np.stack([np.nanmean(x[i], 0) for i in idx])
    return full, boots


def _interval(v: np.ndarray, confidence: float = CONFIDENCE) -> list[float]:
    v = v[np.isfinite(v)]
    a = (1 - confidence) / 2
    return [float(q) for q in np.quantile(v, [a, 1 - a])] if v.size else [None, None]


def curve(t: Traces, bucket: str, idx: list[np.ndarray]) -> list[dict]:
    """Per layer: the average indirect effect and its relation-clustered 95% interval."""
    full, boots = _curves(t, bucket, idx)
    return [{"layer": l, "aie": float(full[k]), "aie_ci": _interval(boots[:, k])} for k, l in enumerate(t.layers)]


def peak_layers(t: Traces, bucket: str, idx: list[np.ndarray], cols: list[int] | None = None) -> tuple[int, np.ndarray]:
    """(the full-data peak layer of a bucket's curve, the peak layer in every draw), over the curve's columns
    ``cols`` (default all; -1 is the embedding)."""
    return _peak_at(t, *_curves(t, bucket, idx), cols)


def _peak_at(t: Traces, full: np.ndarray, boots: np.ndarray, cols: list[int] | None) -> tuple[int, np.ndarray]:
    """:func:`peak_layers` from a bucket's curves already computed (:func:`_curves`)."""
    cols = list(range(len(t.layers))) if cols is None else cols
    lay = np.array(t.layers)[cols]
    return int(lay[int(np.nanargmax(full[cols]))]), lay[np.nanargmax(boots[:, cols], 1)]


def peak(t: Traces, bucket: str, idx: list[np.ndarray], layers: tuple[int, ...] | None = None) -> dict:
    """The peak layer of a bucket's curve as a distribution over draws: the full-data peak, the draws' mode, the
    95% interval of the peak layer and of its depth (layer / n_layers; the embedding counts as 0), the share of
    draws at each layer; and the peak AIE with its interval (a best-of-layers value in every draw)."""
    full, boots = _curves(t, bucket, idx)
    cols = [k for k, l in enumerate(t.layers) if layers is None or l in layers]
    at = _peak_at(t, full, boots, cols)[1]  # the draws' curves computed once
    vals, counts = np.unique(at, return_counts=True)
    share = {int(v): float(c / len(at)) for v, c in zip(vals, counts)}
    k = cols[int(np.nanargmax(full[cols]))]
    depth = np.maximum(at, 0) / t.n_layers
    return {"layer": int(t.layers[k]), "depth": max(t.layers[k], 0) / t.n_layers, "aie": float(full[k]),
            "aie_ci": _interval(np.nanmax(boots[:, cols], 1)), "mode": int(vals[np.argmax(counts)]),
            "layer_ci": [int(q) for q in np.quantile(at, [0.025, 0.975], method="nearest")],
            "depth_ci": _interval(depth), "share": share, "n_draws": len(at)}


def peak_values(t: Traces, bucket: str, idx: list[np.ndarray]) -> tuple[float, np.ndarray]:
    """(the full-data peak AIE of a bucket's curve, the peak AIE in every draw)."""
    full, boots = _curves(t, bucket, idx)
    return float(np.nanmax(full)), np.nanmax(boots, 1)


def early_mean(t: Traces, idx: list[np.ndarray], early: range) -> tuple[float, np.ndarray]:
    """(the mean AIE of the last subject token over the ``early`` layers, the same in every draw)."""
    full, boots = _curves(t, "last_subject", idx)
    cols = [k for k, l in enumerate(t.layers) if l in early]
    return float(np.mean(full[cols])), boots[:, cols].mean(1)


def stat(value: float, boots: np.ndarray) -> dict:
    return {"value": float(value), "ci": _interval(np.asarray(boots, dtype=float)), "n_draws": int(len(boots))}


def verdict(ci: list, side: str, threshold) -> str:
    """``holds`` / ``does not`` / ``undecided``: where the interval lies against the rule's threshold."""
    lo, hi = ci
    if lo is None:
        return "undecided"
    if side == "inside":
        a, b = threshold
        return "holds" if a <= lo and hi <= b else "does not" if hi < a or lo > b else "undecided"
    if side == ">":
        return "holds" if lo > threshold else "does not" if hi < threshold else "undecided"
    raise ValueError(f"side {side!r}: allowed inside, >")


def early_layers(n_layers: int) -> range:
    """The early layers of the severing test: the first quarter of the depth (at least layer 0)."""
    return range(0, max(1, n_layers // 4))


def decide(kinds: dict[str, Traces], n_layers: int, *, n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """Every rule of :data:`RULES` (and the MLP-0 check) on one model's noise traces: ``kinds`` maps trace kinds
    (state, mlp, attn, severed_mlp, severed_attn, mlp_no0, mlp_w1) to their :class:`Traces`, all of the same facts.
    Returns per rule: the statistic's value and 95% interval, the verdict, the facts and relations it rests on."""
    base = kinds.get("state") or next(iter(kinds.values()))
    for t in kinds.values():
        base.align(t)
    idx = draws(base.relations, n_boot, seed)
    n = {"n_facts": int(base.ie.shape[0]), "n_relations": n_clusters(base.relations), "n_draws": n_boot}
    out = {}

    few = n["n_relations"] < MIN_RELATIONS

    def put(rule, value, boots=None, ci=None):
        name, claim, statistic, side, thr = rule
        s = stat(value, boots) if boots is not None else {"value": value, "ci": ci, "n_draws": n_boot}
        if few:  # refused: too few independent units for an interval
            s["ci"] = [None, None]
        out[name] = {"claim": claim, "statistic": statistic, "rule": f"{side} {thr}", **s,
                     "verdict": verdict(s["ci"], side, thr), **n}

    rules = {r[0]: r for r in RULES}
    if "mlp" in kinds:
        p = peak(kinds["mlp"], "last_subject", idx)
        put(rules["mlp_depth"], p["depth"], ci=p["depth_ci"])
        for kind, rule in VARIANTS.items():  # the same claim on the window-1 and MLP-0-excluded curves
            if kind in kinds:
                p = peak(kinds[kind], "last_subject", idx)
                put(rule, p["depth"], ci=p["depth_ci"])
        a, ab = peak_values(kinds["mlp"], "last_subject", idx)
        b, bb = peak_values(kinds["mlp"], "last", idx)
        put(rules["mlp_place"], a - b, ab - bb)
        if "mlp_no0" in kinds:
            top = max(("last_subject", "last", "first_subject", "first_after"),
                      key=lambda b: peak_values(kinds["mlp"], b, idx[:1])[0])
            a0, ab0 = peak_values(kinds["mlp"], top, idx)
            c, cb = peak_values(kinds["mlp_no0"], top, idx)
            with np.errstate(divide="ignore", invalid="ignore"):
                put(MLP0_RULE, c / a0 if a0 else float("nan"), cb / ab0)
            out["mlp0"]["bucket"] = top
    if "attn" in kinds:
        a, ab = peak_values(kinds["attn"], "last", idx)
        b, bb = peak_values(kinds["attn"], "last_subject", idx)
        put(rules["attn_place"], a - b, ab - bb)
        p = peak(kinds["attn"], "last", idx)
        put(rules["attn_depth"], p["depth"], ci=p["depth_ci"])
    early = early_layers(n_layers)
    if "state" in kinds:
        alone, ab = early_mean(kinds["state"], idx, early)
        with np.errstate(divide="ignore", invalid="ignore"):
            if "severed_mlp" in kinds:
                s, sb = early_mean(kinds["severed_mlp"], idx, early)
                put(rules["sever_mlp"], 1 - s / alone, 1 - sb / ab)
            if "severed_attn" in kinds:
                s, sb = early_mean(kinds["severed_attn"], idx, early)
                put(rules["sever_attn"], s / alone, sb / ab)
    return out


def compare_corruptions(noise: Traces, replace: Traces, *, n_boot: int = N_BOOT, seed: int = 0) -> dict:
    """:data:`CORRUPTION_RULE` on one model's state traces under the two corruptions, on the relations both traced:
    the peak depth of the last subject token's state curve under replace minus under noise, its 95% interval from
    :func:`paired_draws` (no interval below :data:`MIN_RELATIONS` shared relations) and the verdict; with each
    run's peak layer and its facts."""
    common = [r for r in dict.fromkeys(noise.relations) if r in set(replace.relations)]
    if not common:
        raise ValueError("the two corruptions' runs share no relation: nothing to compare")
    a, b = noise.subset(common), replace.subset(common)
    ia, ib = paired_draws(a.relations, b.relations, n_boot, seed)
    (la, da), (lb, db) = peak_layers(a, "last_subject", ia), peak_layers(b, "last_subject", ib)
    _, claim, statistic, side, thr = CORRUPTION_RULE

    def depth(x):  # the embedding (-1) counts as depth 0, as in :func:`peak`
        return np.maximum(x, 0) / a.n_layers

    ci = _interval(depth(db) - depth(da)) if len(common) >= MIN_RELATIONS else [None, None]
    return {"claim": claim, "statistic": statistic, "rule": f"{side} {thr}",
            "value": float(depth(np.array(lb)) - depth(np.array(la))), "ci": ci, "verdict": verdict(ci, side, thr),
            "layers": {"noise": la, "replace": lb}, "n_facts": {"noise": int(a.ie.shape[0]),
                                                                 "replace": int(b.ie.shape[0])},
            "n_relations": len(common), "n_draws": n_boot}


__all__ = ["RULES", "VARIANTS", "MLP0_RULE", "CORRUPTION_RULE", "MIN_RELATIONS", "merged_no0", "Traces", "draws",
           "paired_draws", "curve", "peak", "peak_layers", "peak_values", "early_mean", "verdict", "decide",
           "compare_corruptions", "early_layers"]
