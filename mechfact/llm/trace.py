"""Causal-tracing queries from relations of a pretrained model: the facts it knows, as the tracing authors pick
them.

A fact is traced when the model knows it. ``known="spells"`` (tracing's default): the clean prompt's top-1 token
spells the object (:func:`mechfact.probes.known.spells_object`: a generic first token such as " the" before "the
United States" does not count -- the tracing authors trace facts whose prediction IS the attribute);
``known="prefix"``: the LRE authors' match, the top-1 token is a prefix of the object
(:func:`mechfact.probes.known.prefix_match`). Prompts are zero-shot by default (``k_shot=0``, the
tracing authors' setting: the template with the subject, e.g. "The capital of France is"). For token-replacement
corruption each fact gets up to ``n_replace`` other subjects of the same relation whose prompt has the same token
length and the same subject token span (Zhang & Nanda's rule: a subject of the same token length); a fact with
none is left out of that corruption and counted.
"""

from __future__ import annotations

import functools
import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..config import DictConfig, check_choice, check_float, check_int
from ..probes.queries import ProbeSet, predictions
from ..seeding import derive_seed
from ..probes.known import KNOWN_RULES, knows
from .prompts import Prompt, check_template, prompt_text, tokenize_prompt
from .relations import Relation, as_relations, keep_named

logger = logging.getLogger(__name__)


def relation_queries(lm, relations, *, k_shot: int = 0, template: int = 0, seed: int = 0,
                     max_facts: int | None = None, n_replace: int = 0, batch_size: int = 16,
                     known: str = "prefix", all_known: list | None = None,
                     top1: dict | None = None) -> tuple[list[dict], list[dict]]:
    """(queries, per-relation counts). Each query: ``tokens`` (n,), ``subject`` (first, last), ``index``,
    ``relation``, ``subject_text``, ``object``, and with ``n_replace`` > 0 ``replacements`` (K, n) when any.
    ``max_facts``: at most this many known facts per relation (the first in a seeded order). ``known``: the rule
    (module docstring); the counts give both rules' known facts. ``all_known``: a list that receives (tokens,
    subject span) of EVERY known fact, traced or not (the noise scale is measured over them). ``top1``: each
    relation's top-1 token ids already screened (:func:`screen_relation`), one per fact; a relation not there, or
    with another number of facts, is screened here."""
    check_choice("known", known, KNOWN_RULES)
    out, counts = [], []
    for rel in as_relations(relations):
        check_template(rel, template)
        prompts = _prompts(lm, rel, k_shot, template, seed)
        cached = (top1 or {}).get(rel.name)
        if cached is not None and len(cached) == len(rel):
            top = torch.tensor(cached, dtype=torch.long)
        else:
            top = _top1(lm, [p[3] for p in prompts], batch_size)
        prefix = [i for i, ok in enumerate(knows(lm.tokenizer, top, rel.objects, "prefix")) if ok]
        spelled = [i for i, ok in enumerate(knows(lm.tokenizer, top, rel.objects, "spells")) if ok]
        known = spelled if known == "spells" else prefix
        if all_known is not None:
            all_known += [(torch.tensor(prompts[i][3].tokens), (prompts[i][3].subject_first,
                                                                prompts[i][3].subject_last)) for i in known]
        rng = np.random.default_rng(derive_seed(seed, f"llm.trace.{rel.name}"))
        order = [known[k] for k in rng.permutation(len(known))] if max_facts is not None else known
        chosen = sorted(order[:max_facts]) if max_facts is not None else known
        n_rep = 0
        for i in chosen:
            text, a, b, p = prompts[i]
            toks, first, last = p.tokens, p.subject_first, p.subject_last
            q = {"tokens": torch.tensor(toks), "subject": (first, last), "index": i, "relation": rel.name,
                 "subject_text": rel.subjects[i], "object": rel.objects[i]}
            if n_replace:
                reps = _replacements(lm, rel, i, text, a, b, toks, (first, last), n_replace, rng)
                if reps is not None:
                    q["replacements"] = reps
                    n_rep += 1
            out.append(q)
        counts.append({"relation": rel.name, "n_samples": len(rel), "n_known": len(known),
                       "n_known_prefix": len(prefix), "n_known_spells": len(spelled), "n_traced": len(chosen),
                       **({"n_with_replacements": n_rep} if n_replace else {})})
    return out, counts


def _prompts(lm, rel: Relation, k_shot: int, template: int, seed: int) -> list[tuple]:
    """(text, subject start, subject end, Prompt) of every fact of ``rel``."""
    out = []
    for i in range(len(rel)):
        text, a, b = prompt_text(rel, i, k=k_shot, template=template, seed=seed)
        toks, first, last = tokenize_prompt(lm.tokenizer, text, (a, b), lm.bos_id)
        out.append((text, a, b, Prompt(text, rel.subjects[i], rel.objects[i], toks, first, last)))
    return out


def _top1(lm, prompts: list, batch_size: int = 16) -> torch.Tensor:
    return predictions(lm, ProbeSet.from_prompts(prompts, pad_id=lm.pad_id), batch_size=batch_size)


def screen_relation(lm, rel: Relation, *, k_shot: int = 0, template: int = 0, seed: int = 0,
                    batch_size: int = 16) -> list[int]:
    """The screening of :func:`relation_queries`: the top-1 token id of every fact's prompt (one forward pass per
    fact, the bulk of a trace's start on a large relation set)."""
    check_template(rel, template)
    return [int(t) for t in _top1(lm, [p[3] for p in _prompts(lm, rel, k_shot, template, seed)], batch_size)]


def _screen_job(cfg, seed: int, rel: Relation, device: str) -> list[int]:
    """:func:`screen_relation` in an executor worker, which loads ``cfg.model`` once."""
    from .models.loading import worker_model

    return screen_relation(worker_model(cfg.model, device, cfg.dtype), rel, k_shot=cfg.k_shot,
                           template=cfg.template, seed=seed)


SCREEN = "screen.json"  # a trace folder's screening: written relation by relation, read back by a resumed run


def _read_screen(out: Path, identity: dict) -> dict:
    """The screened relations (name -> top-1 ids) of ``out``'s screen file when it was made with ``identity`` (the
    model and the prompts); otherwise none."""
    from ..runs import read_json

    f = Path(out) / SCREEN
    if not f.is_file():
        return {}
    got = read_json(f)
    return dict(got.get("top1", {})) if isinstance(got, dict) and got.get("identity") == identity else {}


def _replacements(lm, rel: Relation, i: int, text: str, a: int, b: int, toks: list[int], span: tuple[int, int],
                  k: int, rng) -> torch.Tensor | None:
    """Up to ``k`` prompts with sample ``i``'s subject replaced by another subject of the relation whose prompt
    keeps the token length and the subject's token span (and whose subject is not ``i``'s)."""
    rows = []
    others = sorted({s for s in rel.subjects if s != rel.subjects[i]})
    for j in rng.permutation(len(others)).tolist():
        s = others[j]
        new = text[:a] + s + text[b:]
        t2, f2, l2 = tokenize_prompt(lm.tokenizer, new, (a, a + len(s)), lm.bos_id)
        if len(t2) == len(toks) and (f2, l2) == span and t2[:span[0]] == toks[:span[0]] and \
                t2[span[1] + 1:] == toks[span[1] + 1:]:
            rows.append(t2)
            if len(rows) == k:
                break
    return torch.tensor(rows) if rows else None


# ---- run directory: mechfact llm trace ------------------------------------------------------------------------

TRACE_KINDS = ("state", "mlp", "attn", "severed_mlp", "severed_attn", "mlp_w1", "mlp_no0")
# mlp_w1: the MLP output of ONE layer restored (window 1); mlp_no0: the window-w restoration with MLP 0 never copied
# back, traced on the layers whose window holds layer 0 (elsewhere it equals mlp): an effect that sits in MLP 0
# alone (the detokenisation MLP under embedding noise) vanishes there.


@dataclass
class TraceConfig(DictConfig):
    model: str = "default"
    relations: str | list[str] | None = None  # relation file(s) or folder(s); None / "shipped" = the shipped dataset
    relation_names: list[str] | None = None
    kinds: list[str] | None = None  # of TRACE_KINDS; None = state, mlp, attn
    corruption: str = "noise"  # noise | replace
    metric: str = "prob"  # prob | logit_diff (replace only)
    window: int | None = None  # mlp / attn restoration window; None = 10 of 48 layers scaled to the depth
    n_draws: int = 10  # noise draws per fact
    noise_factor: float = 3.0  # nu = noise_factor x std of subject-token embeddings
    n_replace: int = 5  # replacement subjects per fact (replace)
    max_facts: int | None = 20  # known facts traced per relation (seeded choice); None = all
    k_shot: int = 0
    template: int = 0
    dtype: str = "float32"
    batch_rows: int = 256
    layers: list[int] | None = None  # the layers traced; None = every layer (and -1, the embedding, for state)
    known: str = "spells"  # which facts count as known: spells (the prediction spells the object) | prefix

    def __post_init__(self) -> None:
        check_choice("known", self.known, KNOWN_RULES)
        for k in self.kinds or ():
            check_choice("kinds", k, TRACE_KINDS)
        check_choice("corruption", self.corruption, ("noise", "replace"))
        check_choice("metric", self.metric, ("prob", "logit_diff"))
        if self.metric == "logit_diff" and self.corruption != "replace":
            raise ValueError("--metric logit_diff needs --corruption replace (the corrupted runs' own answers)")
        if self.window is not None:
            check_int("window", self.window, 1)
        check_int("n_draws", self.n_draws, 1)
        check_float("noise_factor", self.noise_factor, lo=0, lo_open=True)
        check_int("n_replace", self.n_replace, 1)
        if self.max_facts is not None:
            check_int("max_facts", self.max_facts, 1)
        check_int("k_shot", self.k_shot, 0)
        check_int("batch_rows", self.batch_rows, 1)

    @property
    def kind_list(self) -> list[str]:
        return list(self.kinds or ("state", "mlp", "attn"))


def _split_kind(kind: str) -> tuple[str, str | None]:
    return ("state", kind.split("_", 1)[1]) if kind.startswith("severed_") else (kind.split("_", 1)[0], None)


def kind_options(kind: str, window: int, n_layers: int, layers: list[int] | None = None) -> dict:
    """The :func:`~mechfact.probes.tracing.causal_trace_queries` options of a trace kind (:data:`TRACE_KINDS`)."""
    from ..probes import tracing

    base, sever = _split_kind(kind)
    opts = {"kind": base, "sever": sever, "window": window, "exclude": (), "layers": layers}
    if kind == "mlp_w1":
        opts["window"] = 1
    elif kind == "mlp_no0":
        touched = [l for l in tracing.traced_layers(n_layers, "mlp", layers)
                   if 0 in tracing.window_layers(l, window, n_layers)]
        opts.update(exclude=(0,), layers=touched)
    return opts


def load_sources(relations, names: list[str] | None = None) -> list[Relation]:
    """Relations from one source or several (files / folders; None or "shipped": the shipped dataset), names
    unique across them, kept in ``names`` when given."""
    if not isinstance(relations, (list, tuple)) or (relations and isinstance(relations[0], Relation)):
        return as_relations(relations, names)
    rels, seen = [], {}
    for src in relations:
        for r in as_relations(None if src in (None, "shipped") else src):
            if r.name in seen:
                raise ValueError(f"--relations: relation {r.name!r} is in both {seen[r.name]} and {src}")
            seen[r.name] = src
            rels.append(r)
    return keep_named(rels, names)


def _trace_row(lm, name: str, kind: str, queries: list[dict], counts: list[dict], cfg: TraceConfig, window: int,
               seed: int, progress: bool = False, noise: float | None = None) -> dict:
    """One (relation, kind) row: counts, the noise scale, per-fact scores and the summary with intervals."""
    from ..probes import tracing

    opts = kind_options(kind, window, lm.n_layers, cfg.layers)
    row = {"relation": name, "kind": kind, **counts[0], "n_traced": len(queries)}
    if not queries:
        logger.warning("%s: no known facts to trace", name)
        return row
    res = tracing.causal_trace_queries(lm, queries, corruption=cfg.corruption, metric=cfg.metric, noise=noise,
                                       noise_factor=cfg.noise_factor, n_draws=cfg.n_draws, seed=seed,
                                       batch_rows=cfg.batch_rows, progress=progress, **opts)
    row.update(noise=res.noise, window=opts["window"], exclude=list(opts["exclude"]), layers=list(res.layers),
               summary=res.summary(seed),
               facts=[{**f, "subject_text": q["subject_text"], "object": q["object"]}
                      for f, q in zip(res.to_dict()["facts"], queries)])
    return row


def _trace_job(cfg: TraceConfig, window: int, seed: int, noise: float | None, job: tuple, rel: Relation,
               device: str) -> list[dict]:
    """One relation's rows (of ``job``'s kinds) in an executor worker, which loads ``cfg.model`` once.
    ``job``: that relation's (queries, counts, kinds), the only queries shipped to the worker."""
    from .models.loading import worker_model

    queries, counts, kinds = job
    lm = worker_model(cfg.model, device, cfg.dtype)
    return [_trace_row(lm, rel.name, kind, queries, counts, cfg, window, seed, noise=noise) for kind in kinds]


def run_llm_trace(cfg: TraceConfig, out: str | Path, *, device="cpu", seed: int = 0, lm=None,
                  progress: bool = False, executor=None) -> dict:
    """Causal tracing of every relation's known facts, one kind at a time, as a run directory: ``per_relation``
    rows (relation, kind: counts, the noise scale, per-fact scores and the summary with intervals) written as
    each finishes (a rerun resumes), ``pooled``: per kind, the summary over all traced facts; one heatmap per
    kind (``fig_trace_<kind>.png``).

    ``executor``: None or a local executor screens and traces the relations one after another in this process; a Ray
    executor runs one screening task per relation, then one tracing task per relation and kind (each worker loads
    ``cfg.model`` itself, once per worker process); the driver alone writes result.json, rows in relation and kind
    order whatever order they finish in."""
    from ..probes import tracing
    from ..runs import RunDir, check_writable, write_json_atomic
    from . import plots
    from .models.loading import check_remote, load_model
    from .jobs import map_relations, map_units

    check_remote(executor, lm)  # before anything is loaded or written

    rels = load_sources(cfg.relations, cfg.relation_names)
    lm = lm or load_model(cfg.model, device=device, dtype=cfg.dtype)
    window = tracing.default_window(lm.n_layers) if cfg.window is None else cfg.window
    if window > lm.n_layers:
        raise ValueError(f"--window {window}: larger than the depth of {lm.name} ({lm.n_layers} layers)")
    for kind in cfg.kind_list:
        tracing.traced_layers(lm.n_layers, _split_kind(kind)[0], cfg.layers)
    reps = cfg.n_replace if cfg.corruption == "replace" else 0
    # the screening first, relation by relation (one task each with an executor), kept in the folder as it goes
    identity = {"model_id": lm.model_id, "dtype": cfg.dtype, "k_shot": cfg.k_shot, "template": cfg.template,
                "seed": seed}
    top1 = _read_screen(check_writable(out), identity)

    def screened(name: str, top: list[int]) -> None:
        top1[name] = top
        write_json_atomic(Path(out) / SCREEN, {"identity": identity, "top1": top1})
        if progress:
            print(f"screened {name}: {len(top)} facts ({len(top1)} of {len(rels)} relations)", file=sys.stderr)

    map_relations([rel for rel in rels if len(top1.get(rel.name, ())) != len(rel)], executor, lm,
                  lambda rel: screen_relation(lm, rel, k_shot=cfg.k_shot, template=cfg.template, seed=seed),
                  lambda rel: functools.partial(_screen_job, cfg, seed), screened)
    todo = []  # the known facts of every relation first: a run with nothing to trace stops before it starts
    all_known: list = []
    for rel in rels:
        queries, counts = relation_queries(lm, rel, k_shot=cfg.k_shot, template=cfg.template, seed=seed,
                                           max_facts=cfg.max_facts, n_replace=reps, known=cfg.known,
                                           all_known=all_known, top1=top1)
        if cfg.corruption == "replace":
            queries = [q for q in queries if "replacements" in q]
        todo.append((rel, queries, counts))
    if not any(q for _, q, _ in todo):
        raise ValueError(f"no known facts to trace: {lm.name} answers none of the {sum(len(r) for r in rels)} "
                         f"facts of {', '.join(r.name for r in rels)} with a {cfg.k_shot}-shot prompt"
                         + (" with a same-length replacement subject" if reps else ""))
    # one noise scale for the whole run, as the tracing authors: factor x the std of the subject-token embeddings
    # of EVERY known fact of the model over the run's relations (not only the traced ones, not per relation)
    noise = tracing.noise_scale(lm, [t for t, _ in all_known], [sp for _, sp in all_known], cfg.noise_factor) \
        if cfg.corruption == "noise" else None
    run = RunDir(out, cfg, kind="llm.trace", seed=seed, device=str(lm.device), model_id=lm.model_id)
    result = run.read_result({"model": lm.name, "n_layers": lm.n_layers, "window": window, "noise": noise,
                              "noise_facts": len(all_known) if noise is not None else None,
                              "config": cfg.to_dict(), "per_relation": [], "pooled": {}})
    done = {(r["relation"], r["kind"]) for r in result["per_relation"]}
    if done and noise is not None and result.get("noise") is not None \
            and not math.isclose(noise, result["noise"], rel_tol=1e-6):
        # one run, one noise scale: rows traced at another scale would be pooled as if they were comparable
        raise ValueError(f"{out}: its {len(done)} traced rows used the noise scale {result['noise']:.6g} (from "
                         f"{result.get('noise_facts')} known facts); the screen there now gives {noise:.6g} (from "
                         f"{len(all_known)}): trace into a new folder, or restore the screen the rows were traced on")
    order = {(rel.name, k): i for i, (rel, k) in enumerate((rel, k) for rel in rels for k in cfg.kind_list)}
    jobs = {rel.name: (queries, counts, [k for k in cfg.kind_list if (rel.name, k) not in done])
            for rel, queries, counts in todo}

    def add(name: str, rows: list[dict]) -> None:
        for row in rows:
            result["per_relation"].append(row)
            result["per_relation"].sort(key=lambda r: order.get((r["relation"], r["kind"]), len(order)))
            result["pooled"] = _pooled(result["per_relation"], cfg, window, seed)
            run.write_result(result)

    # one unit per relation and kind (one Ray task each): a stopped run loses only the rows in flight
    units, kind_of = [], {}
    for rel, queries, counts in todo:
        for kind in jobs[rel.name][2]:
            kind_of[f"{rel.name}:{kind}"] = kind
            units.append((f"{rel.name}:{kind}", rel, 1.0 + sum(len(q["tokens"]) for q in queries)))

    def local(key, rel):  # each row written as it finishes (a rerun resumes inside a relation)
        queries, counts, _ = jobs[rel.name]
        return [_trace_row(lm, rel.name, kind_of[key], queries, counts, cfg, window, seed, progress, noise)]

    map_units(units, executor, lm, local,
              lambda key, rel: functools.partial(_trace_job, cfg, window, seed, noise,
                                                 (*jobs[rel.name][:2], [kind_of[key]])), add)
    result["pooled"] = _pooled(result["per_relation"], cfg, window, seed)
    return run.finish(result, plots.plot_trace, "fig_trace.png", model=lm.name, model_id=lm.model_id)


def _pooled(rows: list[dict], cfg: TraceConfig, window: int, seed: int) -> dict:
    """Per kind: the summary over every traced fact of every relation (rebuilt from the stored scores)."""
    from ..probes import trace_tests, tracing

    out = {}
    for kind in cfg.kind_list:
        facts, layers = [], None
        for r in rows:
            if r["kind"] != kind or not r.get("facts"):
                continue
            r = trace_tests.merged_no0(r, rows) if kind == "mlp_no0" else r
            layers = tuple(r["layers"])
            facts += [tracing.FactTrace(index=f["index"], target=f["target"], subject=tuple(f["subject"]),
                                        answer_pos=f["answer_pos"], clean=f["clean"], corrupt=f["corrupt"],
                                        scores=np.array(f["scores"])) for f in r["facts"]]
        if facts:
            base, sever = _split_kind(kind)
            res = tracing.TraceResult(kind=base, corruption=cfg.corruption, metric=cfg.metric, window=window,
                                      sever=sever, layers=layers, noise=None, facts=tuple(facts))
            out[kind] = res.summary(seed)
    return out
