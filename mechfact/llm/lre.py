"""Linear relational embeddings (Hernandez et al., ICLR 2024): faithfulness and causality.

For a relation and a subject layer ``l``:

* ``s`` = the subject's last-token ``resid_post`` at layer ``l`` in its
  prompt; ``z`` = the last layer's ``resid_post`` at the prompt's last token
  (before the final norm).
* ``J_i = dz/ds`` at training fact ``i``; ``J = mean_i J_i``,
  ``b = mean_i (z_i - J_i s_i)``; ``LRE(s) = beta * J s + b``.

Two protocols (``LreConfig.protocol``):

* ``authors`` (default) -- as the authors' sweep (evandez/relations) runs it, with every choice made on
  training facts (:mod:`mechfact.llm.lre_authors`): per trial an object-balanced split, the training facts as
  the in-context examples of every prompt, test facts filtered under that prompt (the fact's own object),
  faithfulness at a fixed beta and at the beta best on the training facts (leave-one-out), causality toward
  other test facts at the rank best on the training facts, baselines and bootstrap intervals over subjects.
* ``mechfact`` -- the first protocol: k random in-context examples from the
  whole relation, known = one prompt's greedy first token equals the object's,
  one train/test split, beta fixed, the projection edit.

Jacobians are exact (:func:`mechfact.llm.jacobian.jacobian`: forward mode, every input direction at once,
with the batched-copies autograd method for blocks it does not reproduce). Edited runs
(:func:`edited_logits`) run the prompt prefix once and the suffix as one copy per edited state.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import hooks
from ..config import DictConfig, check_choice, check_float, check_int, check_int_list
from ..probes.queries import ProbeSet
from ..runs import RunDir
from ..seeding import derive_seed
from .loading import LanguageModel, check_remote, load_model, worker_model
from .probe import ProbeConfig, check_prompt_options, map_relations, relation_states
from . import lre_authors
from .jacobian import _copies, _prefix_cache, _putter, jacobian  # noqa: F401 (jacobian: public here too)
from .lre_authors import AUTHORS_BETAS, DEFAULT_TRIALS, FIXED_BETA
from .relations import Relation, as_relations

logger = logging.getLogger(__name__)


BETA_SWEEP = (0.5, 1.0, 2.0, 3.0, 5.0)  # the mechfact protocol's faithfulness_by_beta
PROTOCOLS = ("authors", "mechfact")


@dataclass
class LreConfig(DictConfig):
    model: str = "default"
    relations: str | None = None  # relation file or folder; None = the shipped dataset
    relation_names: list[str] | None = None
    layer: int | None = None  # subject layer l; None = n_layers // 2
    layers: list[int] | None = None  # a sweep of subject layers (instead of `layer`); rows report the best
    beta: float | None = None  # LRE(s) = beta * J s + b, fixed in advance; None: 2.25 (authors), 1.0 (mechfact)
    rank: int = 64  # rank of the pseudo-inverse used for causality edits
    n_train: int = 5  # facts whose Jacobians are averaged (the rest are test facts)
    facts: str = "known"  # known: facts the model completes correctly | all: every fact, scored against the model's prediction
    k_shot: int = 3  # in-context examples in every prompt
    template: int = 0
    max_samples: int | None = None  # cap per relation file (authors: taken round-robin over objects); None: all
    max_test: int | None = None  # cap on test facts per relation (None = all known facts left)
    chunk: int | None = None  # Jacobian input directions per tangent product (None: all at once; lower: less memory)
    protocol: str = "authors"  # authors: Hernandez et al.'s code (module docstring) | mechfact: the first protocol
    n_trials: int = DEFAULT_TRIALS  # authors: trials (split, prompt, filter, operator) averaged; 24 as the paper
    ranks: list[int] | None = None  # authors: edit ranks swept (None: 16, 32, 64, 128, 256 and full, up to d_model)
    dtype: str = "float32"
    batch_size: int = 16
    cache_states: bool = True

    def __post_init__(self) -> None:
        if self.layer is not None:
            check_int("layer", self.layer, 0)
        if self.layers is not None:
            check_int_list("layers", self.layers, 0)
            if self.layer is not None:
                raise ValueError(f"--layer {self.layer} and --layers {self.layers}: give one of them "
                                 "(--layers sweeps, --layer is one layer)")
        if self.beta is not None:
            check_float("beta", self.beta, lo=0, lo_open=True)
        check_int("rank", self.rank, 1)
        check_int("n_train", self.n_train, 1)
        check_choice("facts", self.facts, ("known", "all"))
        if self.max_test is not None:
            check_int("max_test", self.max_test, 1)
        if self.chunk is not None:
            check_int("chunk", self.chunk, 1)
        check_int("batch_size", self.batch_size, 1)
        check_choice("protocol", self.protocol, PROTOCOLS)
        check_int("n_trials", self.n_trials, 1)
        if self.ranks is not None:
            check_int_list("ranks", self.ranks, 1)
        check_prompt_options(self)


def default_layer(n_layers: int) -> int:
    return n_layers // 2


def edited_logits(lm: LanguageModel, tokens: list[int], pos: int, layer: int, states: torch.Tensor,
                  chunk: int = 64) -> torch.Tensor:
    """Next-token logits (m, vocab) of one prompt with its state at (``layer``, ``pos``) set to each row of
    ``states`` (m, d).

    The prefix before ``pos`` runs once; the suffix runs as ``m`` copies (in chunks) from the block after
    ``layer`` on -- the same numbers as patching the full prompt ``m`` times (tested), a fraction of the work.
    """
    toks = torch.tensor([tokens], device=lm.device)
    pkv = _prefix_cache(lm, toks, pos)
    out = []
    with torch.no_grad():
        for c0 in range(0, len(states), chunk):
            st = states[c0:c0 + chunk].to(lm.device, lm.dtype)
            logits = lm.bridge.run_with_hooks(toks[:, pos:], past_key_values=_copies(pkv, layer, len(st)),
                                              fwd_hooks=[(hooks.resid(layer, "post"), _putter(st))])
            out.append(logits[:, -1].float().cpu())
    return torch.cat(out)


def edited_predictions(lm: LanguageModel, tokens: list[int], pos: int, layer: int, states: torch.Tensor,
                       chunk: int = 64) -> torch.Tensor:
    """Greedy next token (m,) of :func:`edited_logits`."""
    return edited_logits(lm, tokens, pos, layer, states, chunk).argmax(-1)


@dataclass
class LRE:
    J: torch.Tensor  # (d, d) mean Jacobian
    b: torch.Tensor  # (d,)
    beta: float

    def __call__(self, s: torch.Tensor) -> torch.Tensor:  # (n, d) -> (n, d)
        return self.beta * s @ self.J.T + self.b

    def pinv(self, rank: int) -> torch.Tensor:
        """Rank-``rank`` pseudo-inverse of ``beta J``."""
        return self.pinvs([rank])[rank]

    def pinvs(self, ranks: list[int]) -> dict[int, torch.Tensor]:
        """Rank-r pseudo-inverses of ``beta J`` for every r of ``ranks``, from one SVD."""
        U, S, Vh = torch.linalg.svd(self.beta * self.J.double())
        n = int((S > S[0] * 1e-10).sum())
        return {rank: (Vh[:r].T @ torch.diag(1 / S[:r]) @ U[:, :r].T).float()
                for rank in ranks for r in [min(rank, n)]}


def estimate_lre(lm: LanguageModel, prompts: list, idx: list[int], layer: int, beta: float, chunk: int | None = None,
                 progress: bool = False) -> LRE:
    Js, bs = _jacobians(lm, [prompts[i] for i in idx], layer, chunk, progress)
    return LRE(J=Js.mean(0), b=bs.mean(0), beta=beta)


def decode_top(lm: LanguageModel, o: torch.Tensor) -> torch.Tensor:
    """Top token of final-layer states o (n, d) through the final norm and the unembedding."""
    with torch.no_grad():
        x = o.to(lm.device, lm.dtype)[:, None]
        return lm.bridge.unembed(lm.bridge.ln_final(x))[:, 0].argmax(-1).cpu()


def patched_predictions(lm: LanguageModel, prompts: list, idx: list[int], layer: int, new_states: torch.Tensor
                        ) -> torch.Tensor:
    """Greedy next token of prompts ``idx`` with the subject state at ``layer`` set to ``new_states[k]``.

    Uses the shared patching engine (:func:`mechfact.probes.patching.run_with_interventions`, kind ``set``
    at the subject position), one prompt at a time since each gets its own vector.
    """
    from ..probes.patching import Intervention, run_with_interventions

    ps = ProbeSet.from_prompts([prompts[i] for i in idx], pad_id=lm.pad_id, objects=idx, subjects=idx)
    out = torch.empty(len(idx), dtype=torch.long)
    for k in range(len(idx)):
        iv = Intervention(site=hooks.resid(layer, "post"), kind="set", position="subject",
                          values=new_states[k].tolist())
        out[k] = run_with_interventions(lm, ps.subset([k]), [iv]).argmax(-1)[0]
    return out


def evaluate_relation(lm: LanguageModel, rel, cfg: LreConfig, layer: int, seed: int, progress: bool = False
                      ) -> tuple[dict, "LRE | None"]:
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
               faithfulness_bias_only=bias_only, faithfulness_by_beta=by_beta, train_subjects=[rel.subjects[i] for i in train])
    return row, lre


def _states_at(lm: LanguageModel, prompts: list, layers: list[int], cfg
               ) -> tuple[dict[int, torch.Tensor], torch.Tensor, torch.Tensor]:
    """({layer: subject states}, last-layer states at the last token, greedy next tokens) of ``prompts``."""
    from ..probes.queries import Site, collect

    ps = ProbeSet.from_prompts(prompts, pad_id=lm.pad_id)
    s_sites = {l: Site(hooks.resid(l, "post"), "subject") for l in layers}
    z_site = Site(hooks.resid(lm.n_layers - 1, "post"), "last")
    acts = collect(lm, ps, [*s_sites.values(), z_site], batch_size=cfg.batch_size, cache=cfg.cache_states)
    return {l: acts[st] for l, st in s_sites.items()}, acts[z_site], acts.next_token


def _jacobians(lm: LanguageModel, prompts: list, layer: int, chunk: int | None, progress: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(Js (n, d, d), bs (n, d)): each prompt's Jacobian ``dz/ds`` and ``z - J s`` at its subject's last token."""
    Js, bs = [], []
    for p in tqdm(prompts, desc="jacobians", leave=False, **({} if progress else {"disable": True})):
        J, s, o = jacobian(lm, p.tokens, p.subject_last, layer, chunk)
        Js.append(J)
        bs.append(o - J @ s)
    return torch.stack(Js), torch.stack(bs)


def evaluate_relation_authors(lm: LanguageModel, rel, cfg: LreConfig, layers: list[int], seed: int,
                              progress: bool = False) -> tuple[list[dict], "LRE | None"]:
    """The LRE authors' protocol (:mod:`mechfact.llm.lre_authors`) at each of ``layers``: one row per layer (the
    trials' splits, known facts and edit targets are the same at every layer), and the last operator."""
    return lre_authors.evaluate(lm, rel, cfg, layers, seed, progress, states_at=_states_at, jacobians=_jacobians,
                                decode_top=decode_top, edited_predictions=edited_predictions)


_COMMON = ("relation", "kind", "n_samples", "n_known", "n_train", "n_test", "faithfulness", "causality")


@dataclass
class LreResult:
    """What :func:`lre` returns: one relation's LRE at one layer (``operator``: the fitted ``J s + b``).

    ``details`` holds the protocol's other numbers (authors: ``train_beta``, ``faithfulness_train_beta``,
    ``faithfulness_bias_only``, ``majority_baseline``, ``rank``, each number's ``_ci`` and ``_n``,
    ``faithfulness_by_beta``, ``causality_by_rank``, ``causality_projection_baseline``, ...), also readable as
    attributes.
    """

    relation: str
    kind: str
    layer: int
    n_samples: int
    n_known: int
    n_train: int
    n_test: int
    faithfulness: float | None  # None: too few usable facts
    causality: float | None
    details: dict = field(default_factory=dict)
    operator: LRE | None = field(default=None, repr=False)

    @classmethod
    def from_row(cls, row: dict, layer: int, operator=None) -> "LreResult":
        return cls(layer=layer, operator=operator, details={k: v for k, v in row.items() if k not in _COMMON},
                   **{k: row[k] for k in _COMMON})

    def __getattr__(self, name: str):
        details = self.__dict__.get("details", {})
        if name in details:
            return details[name]
        raise AttributeError(f"LreResult has no attribute {name!r}")

    def to_dict(self) -> dict:
        """The row of ``result.json["per_relation"]`` (without the layer and the operator)."""
        return {**{k: getattr(self, k) for k in _COMMON}, **self.details}


def _layer(lm: LanguageModel, layer: int | None, flag: str = "--layer") -> int:
    layer = default_layer(lm.n_layers) if layer is None else lm.check_layer(layer, flag)
    if layer >= lm.n_layers - 1:
        raise ValueError(f"{flag} {layer}: must be below the last layer ({lm.n_layers - 1}); the LRE maps it there")
    return layer


def _layers_of(lm: LanguageModel, cfg: LreConfig) -> list[int]:
    """The subject layers of a config: ``layers`` (a sweep) or ``[layer]``."""
    if cfg.layers is None:
        return [_layer(lm, cfg.layer)]
    return sorted({_layer(lm, l, "--layers") for l in cfg.layers})


def lre(lm: LanguageModel, relation, layer: int | list[int] | None = None, *, seed: int = 0, progress: bool = False,
        **options) -> "LreResult | list[LreResult]":
    """The linear relational embedding of one relation from subject layer ``layer`` (default ``n_layers // 2``).

    ``relation``: a :class:`~mechfact.llm.relations.Relation` (or a one-relation file). ``layer``: one layer, or
    a list of layers (a sweep: one result per layer, with the same known facts, training facts and edit targets
    at every layer). ``options``: any :class:`LreConfig` field (``beta``, ``rank``, ``ranks``, ``n_train``,
    ``n_trials``, ``facts``, ``protocol``, ``k_shot``, ``template``, ``max_samples``, ``max_test``, ``chunk``,
    ``batch_size``, ``cache_states``), defaults as ``mechfact llm lre``.
    """
    sweep = isinstance(layer, (list, tuple))
    cfg = LreConfig(**({"layers": list(layer)} if sweep else {"layer": layer}), **options)
    rels = as_relations(relation)
    if len(rels) != 1:
        raise ValueError(f"lre takes one relation; got {len(rels)} (call it once per relation)")
    rel = _capped(rels[0], cfg, seed)
    _check_template(rel, cfg.template)
    rows, op = _evaluate(lm, rel, cfg, _layers_of(lm, cfg), seed, progress)
    if cfg.protocol == "authors":
        lre_authors.add_model_beta(rows, rows[0].get("beta", FIXED_BETA))
    out = [LreResult.from_row(r, r["layer"], op if k == len(rows) - 1 else None) for k, r in enumerate(rows)]
    return out if sweep else out[0]


def _evaluate(lm, rel, cfg: LreConfig, layers: list[int], seed: int, progress: bool) -> tuple[list[dict], "LRE | None"]:
    """One row per layer (each with its ``layer``) and the last fitted operator."""
    if cfg.protocol == "authors":
        return evaluate_relation_authors(lm, rel, cfg, layers, seed, progress)
    rows, op = [], None
    for layer in layers:
        row, op = evaluate_relation(lm, rel, cfg, layer, seed, progress)
        rows.append({**row, "layer": layer})
    return rows, op


_SUMMARY = ("layer", "faithfulness", "faithfulness_best_beta", "best_beta", "causality", "causality_best_rank",
            "best_rank", "causality_projection_baseline")


def _capped(rel: Relation, cfg: LreConfig, seed: int) -> Relation:
    """The relation under ``max_samples``: round-robin over objects (authors), evenly spaced (mechfact)."""
    if cfg.protocol == "authors":
        return lre_authors.stratified_subset(rel, cfg.max_samples, seed)
    return rel.subset(cfg.max_samples)


def best_layer_row(rows: list[dict]) -> dict:
    """A relation's row. Authors: :func:`mechfact.llm.lre_authors.relation_row` (every choice on training facts).
    Mechfact (the first protocol, kept for comparison): the row at the layer best on its own test facts
    (``layer_selected_on`` says so: an upper bound), with ``best_layer`` and ``by_layer``."""
    if rows and rows[0].get("protocol") == "authors":
        return lre_authors.relation_row(rows)
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


def _check_template(rel: Relation, template: int) -> None:
    if template >= len(rel.prompt_templates):
        raise ValueError(f"--template {template}: relation {rel.name} has templates 0..{len(rel.prompt_templates) - 1}")


def _relation_job(cfg: LreConfig, layers: list[int], seed: int, rel: Relation, device: str) -> list[dict]:
    """One relation's rows in an executor worker (which loads ``cfg.model`` once)."""
    rows, _ = _evaluate(worker_model(cfg.model, device, cfg.dtype), rel, cfg, layers, seed, False)
    return rows


def _summarise(result: dict, cfg: LreConfig, seed: int) -> None:
    """Run-level numbers: the authors' protocol gets the model beta and means with intervals over relations."""
    rows = result["per_relation"]
    if cfg.protocol == "authors":
        fixed = FIXED_BETA if cfg.beta is None else cfg.beta
        result["model_beta"] = lre_authors.add_model_beta(rows, fixed)
        result.update(lre_authors.summary(rows, seed))
        return
    vals = [r for r in rows if r["faithfulness"] is not None]
    result["mean_faithfulness"] = float(np.mean([r["faithfulness"] for r in vals])) if vals else None
    cv = [r["causality"] for r in vals if r["causality"] is not None]
    result["mean_causality"] = float(np.mean(cv)) if cv else None


def run_llm_lre(cfg: LreConfig, out: str | Path, *, device: torch.device | str = "cpu", seed: int = 0,
                lm: LanguageModel | None = None, progress: bool = False, executor=None) -> dict:
    """:func:`lre` for every relation, as a run directory (rows written as relations finish; resumes).

    With ``layers`` (a sweep), ``per_relation`` holds each relation at the layers chosen on its training facts
    (``layer`` for faithfulness, ``edit_layer`` for causality; ``by_layer``) and ``per_relation_layer`` every
    (relation, layer) row. The authors' protocol adds ``model_beta`` (one beta chosen on the training facts
    pooled over the run's relations, ``faithfulness_model_beta`` on every row) and means over the
    non-degenerate relations with bootstrap intervals over relations.

    ``executor``: None or a local executor runs the relations one after another in this process; a Ray executor
    (:func:`mechfact.executor.make_executor`) runs one task per relation, each worker loading ``cfg.model``
    itself (once per worker process) with one thread; the driver alone writes result.json, rows in relation
    order whatever order they finish in, so the file is the local one byte for byte.
    """
    from . import plots

    check_remote(executor, lm)  # before anything is loaded or written
    rels = [_capped(r, cfg, seed) for r in as_relations(cfg.relations, cfg.relation_names)]
    lm = lm or load_model(cfg.model, device=device, dtype=cfg.dtype)
    layers = _layers_of(lm, cfg)
    for r in rels:
        _check_template(r, cfg.template)
    run = RunDir(out, cfg, kind="llm.lre", seed=seed, device=str(lm.device), model_id=lm.model_id)
    result = run.read_result({"model": lm.name, "n_layers": lm.n_layers, "layer": layers[0] if len(layers) == 1
                              else None, "layers": layers, "config": cfg.to_dict(), "per_relation": [],
                              "per_relation_layer": []})
    done = {r["relation"] for r in result["per_relation"]}
    order = {r.name: i for i, r in enumerate(rels)}

    def add(name: str, rows: list[dict]) -> None:
        row = best_layer_row(rows)
        logger.info("%s: known %d, test %d, layer %s, faithfulness %s, causality %s", name, row["n_known"],
                    row["n_test"], row["layer"], row["faithfulness"], row["causality"])
        result["per_relation"].append(row)
        result["per_relation_layer"] += rows
        for key in ("per_relation", "per_relation_layer"):  # relation order (stable: a sweep's layers stay in order)
            result[key].sort(key=lambda x: order.get(x["relation"], len(order)))
        _summarise(result, cfg, seed)
        run.write_result(result)

    todo = [rel for rel in rels if rel.name not in done]
    with tqdm(total=len(todo), desc="relations", disable=not progress or check_remote(executor, None)) as bar:
        def local(rel):
            rows = _evaluate(lm, rel, cfg, layers, seed, progress)[0]
            bar.update()
            return rows

        map_relations(todo, executor, lm, local, functools.partial(_relation_job, cfg, layers, seed), add)
    _summarise(result, cfg, seed)
    plot = plots.plot_lre_layers if len(layers) > 1 else plots.plot_lre
    return run.finish(result, plot, "fig_lre.png", model=lm.name, model_id=lm.model_id)
