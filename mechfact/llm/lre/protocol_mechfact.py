"""The first LRE protocol (``protocol="mechfact"``), kept for comparison with the authors' (:mod:`.lre_authors`).

Per relation: ``k`` random in-context examples from the whole relation; a fact is known when one prompt's greedy
first token equals its object's; one train/test split of the known facts; the operator from ``n_train`` training
facts at a fixed beta; faithfulness scored against the model's own prediction (also at the betas of
``BETA_SWEEP``); causality by the projection edit toward another known fact with another first token. A layer
sweep reports each relation at the layer best on its own test facts: an upper bound, and the row says so.
"""

from __future__ import annotations

import logging

import numpy as np

from ...seeding import derive_seed
from .operator import LRE, decode_top, estimate_lre, patched_predictions
from ..readout import ProbeConfig, relation_states

logger = logging.getLogger(__name__)

BETA_SWEEP = (0.5, 1.0, 2.0, 3.0, 5.0)  # faithfulness_by_beta
_SUMMARY = ("layer", "faithfulness", "faithfulness_best_beta", "best_beta", "causality", "causality_best_rank",
            "best_rank", "causality_projection_baseline")


def evaluate(lm, rel, cfg, layer: int, seed: int, progress: bool = False) -> tuple[dict, "LRE | None"]:
    """(row, LRE operator or None when the relation has too few usable facts)."""
    states_cfg = ProbeConfig(site="resid_post", position="subject_last", k_shot=cfg.k_shot, template=cfg.template,
                             batch_size=cfg.batch_size, cache_states=cfg.cache_states)
    rs = relation_states(lm, rel, states_cfg, layers=[layer], seed=seed, progress=progress)
    n_known = int(rs.known.sum())
    known = np.flatnonzero(rs.known) if cfg.facts == "known" else np.arange(len(rel))
    row = {"relation": rel.name, "kind": rel.kind, "n_samples": len(rel), "n_known": n_known,
           "n_train": 0, "n_test": 0, "faithfulness": None, "causality": None}
    if len(known) < cfg.n_train + 1:
        logger.warning("%s: %d usable facts, need %d; skipped", rel.name, len(known), cfg.n_train + 1)
        return row, None
    rng = np.random.default_rng(derive_seed(seed, f"llm.lre.{rel.name}"))
    perm = rng.permutation(known)
    train, test = sorted(perm[:cfg.n_train].tolist()), sorted(perm[cfg.n_train:].tolist())
    if cfg.max_test is not None:
        test = test[:cfg.max_test]
    lre = estimate_lre(lm, rs.prompts, train, layer, 1.0 if cfg.beta is None else cfg.beta, cfg.chunk, progress)
    S = rs.states[0]  # (n, d) subject states at `layer`
    # the model's own prediction; on known facts it is the object's first token
    target = rs.next_token.clone()
    top = decode_top(lm, lre(S[test]))
    faith = float((top == target[test]).float().mean())
    # baseline: the bias alone (one constant prediction for every subject)
    bias_only = float((decode_top(lm, lre.b[None]).expand(len(test)) == target[test]).float().mean())
    by_beta = {}  # faithfulness is cheap to rescore at other beta (J and b do not depend on it)
    for bt in BETA_SWEEP:
        lb = LRE(J=lre.J, b=lre.b, beta=bt)
        by_beta[str(bt)] = float((decode_top(lm, lb(S[test])) == target[test]).float().mean())
    # causality: move fact i towards the object of another known fact j with a different first token
    W_pinv = lre.pinv(cfg.rank)
    pool = known.tolist()
    tgt = []
    for i in test:
        others = [j for j in pool if int(target[j]) != int(target[i])]
        tgt.append(int(rng.choice(others)) if others else -1)
    ok = [k for k, j in enumerate(tgt) if j >= 0]
    caus = None
    if ok:
        ti = [test[k] for k in ok]
        tj = [tgt[k] for k in ok]
        delta = (lre(S[tj]) - lre(S[ti])) @ W_pinv.T
        pred = patched_predictions(lm, rs.prompts, ti, layer, S[ti] + delta)
        caus = float((pred == target[tj]).float().mean())
    row.update(n_train=len(train), n_test=len(test), n_causality=len(ok), faithfulness=faith, causality=caus,
               faithfulness_bias_only=bias_only, faithfulness_by_beta=by_beta,
               train_subjects=[rel.subjects[i] for i in train])
    return row, lre


def relation_row(rows: list[dict]) -> dict:
    """A relation's row: the row at the layer best on its own test facts (``layer_selected_on`` says so: an
    upper bound), with ``best_layer`` and ``by_layer``; one layer: that row."""
    if len(rows) == 1:
        return rows[0]
    scored = [r for r in rows if r["faithfulness"] is not None]
    if not scored:
        return {**rows[0], "layer": None, "best_layer": None, "by_layer": []}
    key = lambda r: (r.get("faithfulness_best_beta", r["faithfulness"]),  # noqa: E731
                     r.get("causality_best_rank", r["causality"]) or 0, -r["layer"])
    best = max(scored, key=key)
    return {**best, "best_layer": best["layer"], "layer_selected_on": "test (an upper bound)",
            "by_layer": [{k: r.get(k) for k in _SUMMARY} for r in scored]}


def summary(rows: list[dict]) -> dict:
    """Plain means over the scored relations (this protocol has no intervals)."""
    vals = [r for r in rows if r["faithfulness"] is not None]
    cv = [r["causality"] for r in vals if r["causality"] is not None]
    return {"mean_faithfulness": float(np.mean([r["faithfulness"] for r in vals])) if vals else None,
            "mean_causality": float(np.mean(cv)) if cv else None}
