"""The LRE authors' protocol (Hernandez et al., ICLR 2024), with every choice made on training facts.

As their sweep (github evandez/relations, ``src/sweeps.py``) runs it, per trial ``t`` of a relation:

1. **Split.** The relation's samples are shuffled and taken round-robin over objects (their
   ``Relation.split``: as many distinct objects as possible first); the first ``n_train`` are the training
   facts, the rest the test facts (a test fact whose subject is a training subject is dropped).
2. **Prompt.** Every prompt of the trial shows the training facts as in-context examples (a prompt never shows
   its own subject).
3. **Filter.** Test facts are kept when the model, under THIS trial's prompt, answers the fact's own object
   (its top token, stripped and lower-cased, is a non-empty prefix of the object); training facts are not
   filtered. A trial with ``n_train`` or fewer known test facts is skipped, as theirs.
4. **Operator.** ``J`` and ``b`` are the means over training facts of ``dz/ds`` and ``z - J s`` (``s``: the
   subject's last-token state at the layer, ``z``: the last layer's state at the prompt's last token).
5. **Faithfulness** of test fact ``i`` at scale beta: the top token of ``beta J s_i + b`` (through the final
   norm and unembedding) is a prefix of the fact's own object.
6. **Causality** of test fact ``i`` toward target ``j`` (another TEST fact, drawn at random among those with
   another subject and another object): the model, with ``s_i <- s_i + pinv_r(J) (z_j - z_i)``, answers ``j``'s
   object. Every edit is a run of the prompt's tail per rank, by far the protocol's largest cost on a relation
   the model knows well; ``max_causality`` (default None: every test fact, as the authors) caps a trial's edits
   at that many pairs, taken round-robin over their objects (:func:`cap_pairs`; faithfulness still scores every
   test fact; rows carry ``max_causality`` and each trial its ``n_causality_candidates``; 0: no edits at all,
   faithfulness only). Ranks: 16, 32, 64, 128, 256 and full by default; ``ranks=AUTHORS_RANKS`` (``--ranks
   authors``) is the authors' sweep ``range(0, 320, 8)``, about 7x the edits (:func:`rank_grid`).

What the authors chose on the scored facts is chosen here without them (``selected_on`` in every row):

* ``faithfulness``: at the fixed ``beta`` (default 2.25, the authors' GPT-J value; ``selected_on`` "fixed");
* ``faithfulness_train_beta``: at the beta that is best on the TRAINING facts, by leave-one-out (fact ``k`` is
  decoded by the operator of the other training facts: ``J_-k``, ``b_-k``; free, the Jacobians are already
  there); ties go to the beta nearest the fixed one;
* ``causality``: at the edit rank best on the training facts (leave-one-out edits among training facts, each
  toward another training fact of another object; their objects sit in the prompt, so this favours copying:
  it picks the rank, it is never reported as a result); ties go to the smaller rank;
* a layer sweep picks the faithfulness layer by the training facts' leave-one-out faithfulness and the edit
  layer separately by their leave-one-out causality;
* :func:`model_beta` picks ONE beta for a whole run from the training facts pooled over relations (the
  authors' rule for their published numbers: one beta per model), giving ``faithfulness_model_beta``.

Best-on-test values remain only as ``*_best_on_test_upper_bound``. Each rate is the mean over trials of the
trial's rate (the authors' aggregation) with a 95% hierarchical bootstrap interval that draws trials (each its
own split, prompt and operator), then subjects (:func:`mechfact.stats.trial_mean`, ``intervals`` in every
row; rows written before said subjects only); ``_n`` counts subjects. Baselines beside it:
``faithfulness_bias_only`` (beta = 0: one constant prediction for every subject), ``majority_baseline`` (share
of test facts whose object is the trial's most common test object) and ``constant_token_baseline`` (the share
the best constant first TOKEN gets under the same first-token match F is scored by, chosen per trial on the
scored facts: :func:`best_constant_token`; "University" for every ``person university`` fact). F is tested
against the last two per relation, paired on the same facts (``faithfulness_vs_constant_token_by_beta``,
``faithfulness_vs_majority_by_beta``: per beta, the difference, its interval and p from one bootstrap drawing
trials, then subjects: :func:`mechfact.stats.trial_difference`). A relation whose scored
test facts all have one object, or whose bias alone (beta 0, one constant answer) is right on every scored test
fact (e.g. "University" is a prefix of every object of ``person university``), is ``degenerate``
(:func:`degenerate`: a constant scores 1.00; ``degenerate_reason`` says which) and is left out of every mean.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import torch

from ... import stats
from ...runs import atomic_path
from ...seeding import derive_seed
from .operator import LRE, decode_top, edited_predictions, jacobians, states_at
from ...probes.known import prefix_match
from ..prompts import build_prompts
from .shared_prefix import Heads, head_of

logger = logging.getLogger(__name__)

AUTHORS_BETAS = tuple(round(0.25 * i, 2) for i in range(21))  # 0 .. 5 in 21 steps, as the LRE authors
FIXED_BETA = 2.25  # the authors' beta for GPT-J (LLaMA-13B: 8.0, outside this grid's 0..5)
DEFAULT_TRIALS = 8
AUTHORS_RANKS = tuple(range(0, 320, 8))  # the authors' edit-rank sweep (0 .. 312), clipped to d_model
DEFAULT_RANKS = (16, 32, 64, 128, 256)  # and the full rank: the default sweep (7x fewer edits than the authors')
INTERVALS = "trials+subjects"  # rates' intervals draw trials (operators), then subjects (stats.trial_mean)


def rank_grid(ranks, d_model: int) -> list[int]:
    """The edit ranks a run sweeps: ``ranks`` (None: :data:`DEFAULT_RANKS` and the full rank) clipped to
    ``d_model``, sorted, once each."""
    return sorted({min(int(r), d_model) for r in ((*DEFAULT_RANKS, d_model) if ranks is None else ranks)})


_VOCAB: dict[int, frozenset] = {}


def _vocab_strings(tok) -> frozenset:
    """Every token's decoded text, stripped and lower-cased (what :func:`prefix_match` compares), once per
    tokenizer."""
    key = id(tok)
    if key not in _VOCAB:
        n = len(tok)
        _VOCAB[key] = frozenset(t.strip().lower() for t in tok.batch_decode([[i] for i in range(n)]))
    return _VOCAB[key]


def best_constant_token(objects: list[str], vocab: frozenset) -> tuple[str | None, list[bool]]:
    """The one first token that, answered for every fact, is right on the most of ``objects`` under the
    authors' first-token match (a token's stripped, lower-cased text is a non-empty prefix of the object):
    among every prefix of an object that is some token's text, the one most objects start with (ties: the
    longer, then the alphabetically first). Chosen on the scored facts themselves, so it is what the best
    constant answer gets -- an upper bound for any constant. Returns the token text and its hit per object."""
    low = [str(o).lower() for o in objects]
    cands = {o[:k] for o in low for k in range(1, len(o) + 1) if o[:k] in vocab and o[:k].strip()}
    if not cands:
        return None, [False] * len(objects)
    best = max(cands, key=lambda c: (sum(o.startswith(c) for o in low), len(c), [-ord(ch) for ch in c]))
    return best, [o.startswith(best) for o in low]


def max_coverage_split(objects: list[str], subjects: list[str], n_train: int, rng: np.random.Generator
                       ) -> tuple[list[int], list[int]]:
    """(train, test) sample indices: shuffled, round-robin over objects, the first ``n_train`` for training; test
    facts of a training subject are dropped."""
    by_obj: dict[str, list[int]] = {}
    for i in rng.permutation(len(objects)).tolist():
        by_obj.setdefault(objects[i], []).append(int(i))
    queues, order = list(by_obj.values()), []
    while any(queues):
        for q in queues:
            if q:
                order.append(q.pop(0))
    train = order[:n_train]
    seen = {subjects[i] for i in train}
    return sorted(train), sorted(i for i in order[n_train:] if subjects[i] not in seen)


def stratified_subset(rel, max_samples: int | None, seed: int = 0):
    """At most ``max_samples`` samples taken round-robin over objects in a seeded random order (the object mix
    of a capped relation stays as even as the file allows)."""
    if max_samples is None or max_samples >= len(rel):
        return rel
    from ..relations import Relation

    rng = np.random.default_rng(derive_seed(seed, f"llm.lre.subset.{rel.name}"))
    keep, _ = max_coverage_split(rel.objects, rel.subjects, max_samples, rng)
    return Relation(rel.name, rel.prompt_templates, [rel.samples[i] for i in keep], kind=rel.kind,
                    description=rel.description, source=rel.source)


def cap_pairs(pairs: list, objects: list, cap: int, rng: np.random.Generator) -> list:
    """At most ``cap`` of a trial's edit pairs, taken round-robin over their source facts' objects in a seeded
    random order (:func:`max_coverage_split`), in their original order."""
    if len(pairs) <= cap:
        return list(pairs)
    keep, _ = max_coverage_split([str(o) for o in objects], [str(k) for k in range(len(pairs))], cap, rng)
    return [pairs[k] for k in keep]


def _pick(scores: np.ndarray, values: list, prefer) -> int:
    """Index of the best score; ties broken by ``prefer(value)`` (smaller is preferred)."""
    best = np.nanmax(scores)
    cands = [k for k in range(len(values)) if scores[k] == best]
    return min(cands, key=lambda k: prefer(values[k]))


def select_beta(hits: np.ndarray, n: int, fixed: float) -> float:
    """The beta of ``AUTHORS_BETAS`` with the most training hits (ties: nearest ``fixed``)."""
    if n == 0:
        return fixed
    return AUTHORS_BETAS[_pick(np.asarray(hits, float), list(AUTHORS_BETAS), lambda b: abs(b - fixed))]


def select_rank(hits: np.ndarray, n: int, ranks: list[int]) -> int | None:
    if n == 0:
        return None
    return ranks[_pick(np.asarray(hits, float), ranks, lambda r: r)]


class _Outcomes:
    """Per (setting, trial, subject) counts of right answers, and per (trial, subject) counts of outcomes."""

    def __init__(self, n_settings: int, n_trials: int, n_subjects: int):
        self.hits = np.zeros((n_settings, n_trials, n_subjects))
        self.counts = np.zeros((n_trials, n_subjects))

    def add(self, t: int, s: int, right) -> None:
        self.counts[t, s] += 1
        self.hits[:, t, s] += np.asarray(right, dtype=float)

    def estimate(self, seed: int):
        """Rates with intervals (a trial without outcomes, e.g. skipped, is left out by the statistics)."""
        return stats.trial_mean(self.hits, self.counts, seed=seed, resample=INTERVALS)


def degenerate(row: dict) -> str | None:
    """Why a relation's row is solved by a constant answer (None: it is not): its scored test facts have one
    object, or the bias alone (beta 0) is right on every one of them."""
    if row.get("n_objects_test") == 1 or (row.get("degenerate") and row.get("n_objects_test") is None):
        return "one object"
    if row.get("faithfulness_bias_only") is not None and row["faithfulness_bias_only"] >= 1.0:
        return "the bias alone is right on every test fact"
    return None


def mark_degenerate(rows: list[dict]) -> None:
    """Sets ``degenerate`` and ``degenerate_reason`` on every row (rows written before the bias rule included)."""
    for r in rows:
        why = degenerate(r)
        r["degenerate"] = why is not None
        if why:
            r["degenerate_reason"] = why
        else:
            r.pop("degenerate_reason", None)


def _f(x) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def _checkpoint_key(rel, cfg, layers: list[int], seed: int, ranks: list[int]) -> dict:
    """What a trial checkpoint must match to be resumed: the relation, the config, the layers, ranks and seed."""
    cfg_d = cfg.to_dict()
    for k in ("relations", "relation_names"):  # where the run's relations come from: the relation's own hash
        cfg_d.pop(k, None)                     # below says which facts it is (a run moved to other folders resumes)
    facts = json.dumps([rel.name, list(rel.prompt_templates), list(rel.subjects), list(rel.objects)])
    return json.loads(json.dumps({"relation": rel.name, "n_samples": len(rel),
                                  "facts_sha256": hashlib.sha256(facts.encode()).hexdigest(),
                                  "layers": list(layers), "ranks": list(ranks), "seed": seed, "config": cfg_d},
                                 default=str))


def _save_trials(path: Path, key: dict, next_trial: int, per_layer: dict, majority: "_Outcomes",
                 constant: "_Outcomes", known: set, objects: set, trials_meta: list) -> None:
    """The accumulated outcomes of a relation's finished trials, written atomically (one .npz)."""
    arrays = {"majority_hits": majority.hits, "majority_counts": majority.counts,
              "constant_hits": constant.hits, "constant_counts": constant.counts}
    counts = {}
    for layer, acc in per_layer.items():
        for name in ("faith", "caus", "proj"):
            arrays[f"{layer}_{name}_hits"], arrays[f"{layer}_{name}_counts"] = acc[name].hits, acc[name].counts
        arrays[f"{layer}_train_f"], arrays[f"{layer}_train_c"] = acc["train_f"], acc["train_c"]
        counts[str(layer)] = [acc["train_f_n"], acc["train_c_n"]]
    meta = {"key": key, "next_trial": next_trial, "train_counts": counts, "trials": trials_meta,
            "known_facts": sorted(known), "scored_objects": sorted(objects, key=lambda o: (type(o).__name__, o))}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez_compressed(f, **arrays)


def _meta(z) -> dict:
    """The JSON metadata :func:`_save_trials` stores in a checkpoint (its ``meta`` array)."""
    return json.loads(bytes(z["meta"]).decode())


def _load_trials(path: Path, key: dict, per_layer: dict, majority: "_Outcomes", constant: "_Outcomes", known: set,
                 objects: set, trials_meta: list) -> int:
    """Restores a relation's finished trials from :func:`_save_trials`' file; the first trial still to run (0
    when there is no file, or one written for another relation, config, layers or seed)."""
    if not path.is_file():
        return 0
    try:
        with np.load(path) as z:
            meta = _meta(z)
            if meta["key"] != key:
                logger.warning("%s: written for another relation, config, layers or seed; starting the relation "
                               "over", path)
                return 0
            majority.hits[:], majority.counts[:] = z["majority_hits"], z["majority_counts"]
            constant.hits[:], constant.counts[:] = z["constant_hits"], z["constant_counts"]
            for layer, acc in per_layer.items():
                for name in ("faith", "caus", "proj"):
                    acc[name].hits[:], acc[name].counts[:] = z[f"{layer}_{name}_hits"], z[f"{layer}_{name}_counts"]
                acc["train_f"][:], acc["train_c"][:] = z[f"{layer}_train_f"], z[f"{layer}_train_c"]
                acc["train_f_n"], acc["train_c_n"] = meta["train_counts"][str(layer)]
    except (OSError, ValueError, KeyError, EOFError) as e:  # a damaged file: the relation starts over
        logger.warning("%s: unreadable trial checkpoint (%s); starting the relation over", path, e)
        for o in (majority, constant, *(acc[n] for acc in per_layer.values() for n in ("faith", "caus", "proj"))):
            o.hits[:], o.counts[:] = 0, 0  # nothing half-restored stays
        for acc in per_layer.values():
            acc["train_f"][:], acc["train_c"][:], acc["train_f_n"], acc["train_c_n"] = 0, 0, 0, 0
        return 0
    known.update(meta["known_facts"])
    objects.update(meta["scored_objects"])
    trials_meta.extend(meta["trials"])
    logger.info("%s: %d of %d trials restored from %s", key["relation"], meta["next_trial"], key["config"].get(
        "n_trials", "?"), path.name)
    return int(meta["next_trial"])


def trials_kept(path: str | Path) -> tuple[str, int, int] | None:
    """What a trial checkpoint holds: (relation, finished trials, trials asked for); None when unreadable."""
    try:
        with np.load(path) as z:
            meta = _meta(z)
        return meta["key"]["relation"], int(meta["next_trial"]), int(meta["key"]["config"]["n_trials"])
    except (OSError, ValueError, KeyError, TypeError, EOFError):
        return None


def evaluate(lm, rel, cfg, layers: list[int], seed: int, progress: bool = False,
             checkpoint: str | Path | None = None) -> tuple[list[dict], LRE | None]:
    """One row per layer of ``rel`` (see the module docstring; the trials' splits, known facts and edit targets are
    the same at every layer) and the last trial's operator at the last layer.

    ``checkpoint``: a file where the outcomes are saved after every finished trial; an interrupted relation
    resumes from it at its next trial with the same numbers as an uninterrupted run (each trial draws from its own
    seed), so a relation longer than a run may take is never lost. The operator returned is None when every
    trial was restored.

    The model-facing steps (states, Jacobians, decoding, edited runs) are :mod:`.lre_operator`'s; the protocol
    is this module's only job.
    """
    tok = lm.tokenizer
    n = len(rel)
    subj_ids = {s: k for k, s in enumerate(dict.fromkeys(rel.subjects))}
    n_subj = len(subj_ids)
    fixed = cfg.beta if cfg.beta is not None else FIXED_BETA
    ranks = rank_grid(cfg.ranks, lm.d_model)
    T = cfg.n_trials
    B = len(AUTHORS_BETAS)
    per_layer = {l: {"faith": _Outcomes(B, T, n_subj), "caus": _Outcomes(len(ranks), T, n_subj),
                     "proj": _Outcomes(len(ranks), T, n_subj), "train_f": np.zeros(B), "train_f_n": 0,
                     "train_c": np.zeros(len(ranks)), "train_c_n": 0} for l in layers}
    majority = _Outcomes(1, T, n_subj)
    constant = _Outcomes(1, T, n_subj)  # the best constant first token (:func:`best_constant_token`)
    vocab = _vocab_strings(tok) if cfg.facts != "all" else frozenset()
    known_facts: set[int] = set()
    scored_objects: set[str] = set()
    trials_meta, op = [], None
    key = _checkpoint_key(rel, cfg, layers, seed, ranks)
    state = (per_layer, majority, constant, known_facts, scored_objects, trials_meta)
    start = 0 if checkpoint is None else _load_trials(Path(checkpoint), key, *state)
    for t in range(start, T):
        if checkpoint is not None and t > start:  # trial t - 1 is finished: keep it
            _save_trials(Path(checkpoint), key, t, *state)
        rng = np.random.default_rng(derive_seed(seed, f"llm.lre.authors.{rel.name}", t))
        train, test = max_coverage_split(rel.objects, rel.subjects, cfg.n_train, rng)
        if len(train) < 2:
            logger.warning("%s: %d samples, need at least 2 training facts", rel.name, n)
            break
        order = train + test
        prompts = build_prompts(rel, tok, lm.bos_id, template=cfg.template, examples=train, samples=order)
        heads = Heads(lm)  # the trial's shared prompt head, run once for the states and every edited run
        S_at, Z, own = states_at(lm, prompts, layers, cfg.batch_size, cfg.cache_states, heads)
        pos = {i: k for k, i in enumerate(order)}

        def right(token, i: int) -> bool:  # facts="all": judged against the model's own prediction
            if cfg.facts == "all":
                return int(token) == int(own[pos[i]])
            return prefix_match(tok, token, [rel.objects[i]])

        def target(i: int):  # what a fact is scored against: its object, or (facts="all") the model's prediction
            return int(own[pos[i]]) if cfg.facts == "all" else rel.objects[i]

        kept = [i for i in test if cfg.facts == "all" or right(own[pos[i]], i)]
        known_facts.update(kept)
        if len(kept) <= cfg.n_train:
            logger.info("%s trial %d: %d known test facts (need more than %d); trial skipped", rel.name, t,
                        len(kept), cfg.n_train)
            trials_meta.append({"train_subjects": [rel.subjects[i] for i in train], "n_test": len(kept),
                                "skipped": True})
            continue
        if cfg.max_test is not None and len(kept) > cfg.max_test:
            kept = sorted(rng.permutation(kept)[:cfg.max_test].tolist())
        scored_objects.update(target(i) for i in kept)
        counts: dict = {}
        for i in kept:
            counts[target(i)] = counts.get(target(i), 0) + 1
        top_obj = max(counts, key=lambda o: (counts[o], str(o)))
        for i in kept:
            majority.add(t, subj_ids[rel.subjects[i]], [target(i) == top_obj])
        if cfg.facts == "all":  # scored against the model's own token: the best constant is the commonest one
            const_tok, const_hits = str(top_obj), [target(i) == top_obj for i in kept]
        else:
            const_tok, const_hits = best_constant_token([rel.objects[i] for i in kept], vocab)
        for i, hit in zip(kept, const_hits):
            constant.add(t, subj_ids[rel.subjects[i]], [hit])
        pairs = []  # edit targets: other test facts with another subject and another object
        for i in kept:
            others = [j for j in kept if rel.subjects[j] != rel.subjects[i] and target(j) != target(i)]
            if others:
                pairs.append((i, int(rng.choice(others))))
        n_pairs = len(pairs)
        if cfg.max_causality == 0:  # faithfulness only: no edits at all (nor the training facts' rank choice)
            pairs = []
        elif cfg.max_causality is not None and n_pairs > cfg.max_causality:
            pairs = cap_pairs(pairs, [target(i) for i, _ in pairs], cfg.max_causality,
                              np.random.default_rng(derive_seed(seed, f"llm.lre.authors.causality.{rel.name}", t)))
        train_pairs = []
        for i in (train if cfg.max_causality != 0 else ()):
            others = [j for j in train if rel.subjects[j] != rel.subjects[i] and target(j) != target(i)]
            if others:
                train_pairs.append((i, int(rng.choice(others))))
        tp = [pos[i] for i in train]
        for layer in layers:
            acc = per_layer[layer]
            S = S_at[layer]
            Js, bs = jacobians(lm, [prompts[k] for k in tp], layer, cfg.chunk, progress)
            J, b = Js.mean(0), bs.mean(0)
            op = LRE(J=J, b=b, beta=fixed)
            # faithfulness of the test facts at every beta, in one decoding
            St = S[[pos[i] for i in kept]]
            tops = decode_top(lm, torch.cat([bt * St @ J.T + b for bt in AUTHORS_BETAS])).view(B, len(kept))
            for k, i in enumerate(kept):
                acc["faith"].add(t, subj_ids[rel.subjects[i]], [right(tops[q, k], i) for q in range(B)])
            # leave-one-out on the training facts (beta and rank selection)
            m = len(train)
            loo = [((Js.sum(0) - Js[k]) / (m - 1), (bs.sum(0) - bs[k]) / (m - 1)) for k in range(m)]
            Str = S[tp]
            tops = decode_top(lm, torch.cat([bt * Str[k:k + 1] @ loo[k][0].T + loo[k][1]
                                             for bt in AUTHORS_BETAS for k in range(m)])).view(B, m)
            acc["train_f"] += np.array([[right(tops[q, k], train[k]) for k in range(m)] for q in range(B)]).sum(1)
            acc["train_f_n"] += m
            for i, j in train_pairs:
                k = train.index(i)
                P = LRE(*loo[k], 1.0).pinvs(ranks)
                dz = Z[pos[j]] - Z[pos[i]]
                new = torch.stack([S[pos[i]] + dz @ P[r].T for r in ranks])
                q = prompts[pos[i]]
                pred = edited_predictions(lm, q.tokens, q.subject_last, layer, new, prefix=heads.cache(head_of(q)),
                                          start=q.subject_first)
                acc["train_c"] += np.array([right(p, j) for p in pred], dtype=float)
                acc["train_c_n"] += 1
            # causality of the test facts at every rank, and the first protocol's projection edit beside it
            if pairs:
                proj = LRE(J, b, fixed)
                P, Pb = LRE(J, b, 1.0).pinvs(ranks), proj.pinvs(ranks)  # rank-r pseudo-inverses of J, beta J
                for i, j in pairs:
                    dz = Z[pos[j]] - Z[pos[i]]
                    dp = (proj(S[pos[j]:pos[j] + 1]) - proj(S[pos[i]:pos[i] + 1]))[0]
                    new = [S[pos[i]] + d for r in ranks for d in (dz @ P[r].T, dp @ Pb[r].T)]
                    q = prompts[pos[i]]
                    pred = edited_predictions(lm, q.tokens, q.subject_last, layer, torch.stack(new),
                                              prefix=heads.cache(head_of(q)), start=q.subject_first)
                    hits = np.array([right(p, j) for p in pred]).reshape(len(ranks), 2)
                    acc["caus"].add(t, subj_ids[rel.subjects[i]], hits[:, 0])
                    acc["proj"].add(t, subj_ids[rel.subjects[i]], hits[:, 1])
        trials_meta.append({"train_subjects": [rel.subjects[i] for i in train], "n_test": len(kept),
                            "n_causality": len(pairs), "n_causality_candidates": n_pairs,
                            "constant_token": const_tok, "skipped": False})
    head = {"relation": rel.name, "kind": rel.kind, "n_samples": n, "n_train": cfg.n_train,
            "n_trials": sum(not m["skipped"] for m in trials_meta), "n_trials_asked": T,
            "n_known": len(known_facts), "protocol": "authors", "beta": fixed,
            "max_causality": cfg.max_causality}
    rows = [_layer_row(head, per_layer[l], majority, constant, trials_meta, scored_objects, ranks, fixed, l, seed)
            for l in layers]
    return rows, op


def _paired(acc: _Outcomes, base: _Outcomes, seed: int) -> dict[str, list]:
    """Per beta: [difference, low, high, p] of F against a constant's hits on the same test facts (a paired
    bootstrap that draws trials, then subjects: :func:`mechfact.stats.trial_difference`)."""
    d = stats.trial_difference(acc.hits, base.hits[0], acc.counts, seed=seed, resample=INTERVALS)
    return {str(b): [_f(d["diff"][q]), _f(d["low"][q]), _f(d["high"][q]), _f(d["p_value"][q])]
            for q, b in enumerate(AUTHORS_BETAS)}


def _layer_row(head: dict, acc: dict, majority: _Outcomes, constant: _Outcomes, trials: list[dict], objects: set,
               ranks: list[int], fixed: float, layer: int, seed: int) -> dict:
    ran = [m for m in trials if not m["skipped"]]
    row = {**head, "layer": layer, "n_test": int(round(np.mean([m["n_test"] for m in ran]))) if ran else 0,
           "n_causality": int(round(np.mean([m["n_causality"] for m in ran]))) if ran else 0,
           "n_objects_test": len(objects), "degenerate": len(objects) == 1,
           "faithfulness": None, "causality": None, "trials": trials}
    if not ran:
        return row
    fv, flo, fhi, fn = acc["faith"].estimate(seed)
    k_fixed = AUTHORS_BETAS.index(min(AUTHORS_BETAS, key=lambda b: abs(b - fixed)))
    train_beta = select_beta(acc["train_f"], acc["train_f_n"], fixed)
    k_train = AUTHORS_BETAS.index(train_beta)
    best_test = int(np.nanargmax(fv))

    def est(v, lo, hi, k, n):
        return stats.Estimate(_f(v[k]), _f(lo[k]), _f(hi[k]), n, "bootstrap")

    mv, mlo, mhi, mn = majority.estimate(seed)
    cv_, clo_, chi_, cn_ = constant.estimate(seed)
    row.update(
        intervals=INTERVALS, **stats.fields("constant_token_baseline", est(cv_, clo_, chi_, 0, cn_)),
        faithfulness_vs_constant_token_by_beta=_paired(acc["faith"], constant, seed),
        faithfulness_vs_majority_by_beta=_paired(acc["faith"], majority, seed),
        **stats.fields("faithfulness", est(fv, flo, fhi, k_fixed, fn)), faithfulness_selected_on="fixed",
        train_beta=train_beta, **stats.fields("faithfulness_train_beta", est(fv, flo, fhi, k_train, fn)),
        faithfulness_train_beta_selected_on="train",
        **stats.fields("faithfulness_bias_only", est(fv, flo, fhi, 0, fn)),
        **stats.fields("majority_baseline", est(mv, mlo, mhi, 0, mn)),
        faithfulness_by_beta={str(b): _f(fv[q]) for q, b in enumerate(AUTHORS_BETAS)},
        faithfulness_by_beta_ci={str(b): [_f(flo[q]), _f(fhi[q])] for q, b in enumerate(AUTHORS_BETAS)},
        faithfulness_best_on_test_upper_bound=_f(fv[best_test]), beta_best_on_test=AUTHORS_BETAS[best_test],
        train_faithfulness_by_beta={str(b): [int(acc["train_f"][q]), int(acc["train_f_n"])]
                                    for q, b in enumerate(AUTHORS_BETAS)},
    )
    why = degenerate(row)
    row.update(degenerate=why is not None, **({"degenerate_reason": why} if why else {}))
    if acc["caus"].counts.sum() > 0:
        cv, clo, chi, cn = acc["caus"].estimate(seed)
        pv, plo, phi, pn = acc["proj"].estimate(seed)
        train_rank = select_rank(acc["train_c"], acc["train_c_n"], ranks)
        q = ranks.index(train_rank) if train_rank is not None else ranks.index(max(ranks))
        row.update(
            rank=ranks[q], **stats.fields("causality", est(cv, clo, chi, q, cn)),
            causality_selected_on="train" if train_rank is not None else "fixed",
            causality_by_rank={str(r): _f(cv[k]) for k, r in enumerate(ranks)},
            causality_by_rank_ci={str(r): [_f(clo[k]), _f(chi[k])] for k, r in enumerate(ranks)},
            causality_best_on_test_upper_bound=_f(np.nanmax(cv)),
            train_causality_by_rank={str(r): [int(acc["train_c"][k]), int(acc["train_c_n"])]
                                     for k, r in enumerate(ranks)},
            **stats.fields("causality_projection_baseline", est(pv, plo, phi, q, pn)),
            causality_projection_baseline_by_rank={str(r): _f(pv[k]) for k, r in enumerate(ranks)})
    return row


def _train_rate(table: dict | None, key: str) -> float:
    if not table or key not in table or table[key][1] == 0:
        return -1.0
    h, n = table[key]
    return h / n


_CAUSALITY_KEYS = ("rank", "causality", "train_causality_by_rank", "n_causality")


def relation_row(rows: list[dict]) -> dict:
    """A relation's row from its layer rows: faithfulness at the layer best by the training facts' leave-one-out
    faithfulness (at that layer's train beta), causality at the layer best by their leave-one-out causality
    (at that layer's train rank); ties go to the earlier layer. One layer: that layer, ``selected_on`` fixed."""
    if len(rows) == 1:
        return {**rows[0], "edit_layer": rows[0]["layer"], "layer_selected_on": "fixed"}
    scored = [r for r in rows if r.get("faithfulness") is not None]
    if not scored:
        return {**rows[0], "layer": None, "edit_layer": None, "by_layer": []}
    f_row = max(scored, key=lambda r: (_train_rate(r.get("train_faithfulness_by_beta"), str(r["train_beta"])),
                                       -r["layer"]))
    c_scored = [r for r in scored if r.get("causality") is not None]
    c_row = max(c_scored, key=lambda r: (_train_rate(r.get("train_causality_by_rank"), str(r["rank"])),
                                         -r["layer"])) if c_scored else f_row
    out = {k: v for k, v in f_row.items() if not k.startswith(_CAUSALITY_KEYS)}
    out.update({k: v for k, v in c_row.items() if k.startswith(_CAUSALITY_KEYS)})
    summary = ("layer", "faithfulness", "faithfulness_train_beta", "train_beta", "causality", "rank")
    out.update(edit_layer=c_row["layer"], layer_selected_on="train",
               by_layer=[{k: r.get(k) for k in summary} for r in scored])
    return out


def model_beta(rows: list[dict], fixed: float = FIXED_BETA) -> float:
    """One beta for a model: most training-fact hits pooled over the (non-degenerate) relations of ``rows``."""
    hits, n = np.zeros(len(AUTHORS_BETAS)), 0
    for r in rows:
        t = r.get("train_faithfulness_by_beta")
        if not t or degenerate(r):
            continue
        hits += np.array([t[str(b)][0] for b in AUTHORS_BETAS])
        n += t[str(AUTHORS_BETAS[0])][1]
    return select_beta(hits, n, fixed)


def add_model_beta(rows: list[dict], fixed: float = FIXED_BETA) -> float:
    """Sets ``faithfulness_model_beta`` (+ ``_ci``, ``_n``) on every row at :func:`model_beta`; returns it."""
    mb = model_beta(rows, fixed)
    for r in rows:
        fb = r.get("faithfulness_by_beta")
        if not fb:
            continue
        r.update(model_beta=mb, faithfulness_model_beta=fb[str(mb)],
                 faithfulness_model_beta_ci=r["faithfulness_by_beta_ci"][str(mb)],
                 faithfulness_model_beta_n=r["faithfulness_n"], faithfulness_model_beta_selected_on="train")
        for base in ("constant_token", "majority"):  # the paired per-relation tests at that beta (newer rows)
            paired = (r.get(f"faithfulness_vs_{base}_by_beta") or {}).get(str(mb))
            if paired is not None:
                r[f"faithfulness_model_beta_vs_{base}"] = paired
    return mb


def summary(rows: list[dict], seed: int = 0) -> dict:
    """Means over the scored, non-degenerate relations, each with a bootstrap interval over relations."""
    out = {}
    ok = [r for r in rows if r.get("faithfulness") is not None and not degenerate(r)]
    for key in ("faithfulness", "faithfulness_train_beta", "faithfulness_model_beta", "faithfulness_bias_only",
                "majority_baseline", "constant_token_baseline", "causality"):
        vals = [r[key] for r in ok if r.get(key) is not None]
        out.update(stats.fields(f"mean_{key}", stats.bootstrap(vals, seed=seed)))
    out["n_relations_degenerate"] = sum(degenerate(r) is not None for r in rows if r.get("faithfulness") is not None)
    return out
