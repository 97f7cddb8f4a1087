"""Layer-wise linear readouts of relational facts from a pretrained model's hidden states.

For every relation: build (k-shot) prompts, extract the subject's hidden state
at every requested layer (:mod:`.extract`), mark the facts the model knows
(greedy next token(s) = the object's first token(s)), and score a linear
readout ``state -> object`` on held-out subjects with
:func:`mechfact.probes.readout.linear_readout` -- the same readout the synthetic
models use.

* many-to-one relations: ``kind="classifier"`` over the relation's objects.
* one-to-one relations (every object unique, so a held-out subject's object is
  never a training class): ``kind="vector"``; ridge regression onto the
  model's unembedding row of the object's first token, decoded as the nearest
  (cosine) among the relation's objects' rows. Objects that share a first token
  share a class (they are indistinguishable by that token).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..config import DictConfig
from ..probes.readout import linear_readout, split_indices
from ..runs import RunDir, read_json
from ..seeding import derive_seed
from .extract import PADDING, SITES, extract_states, greedy_tokens
from .loading import DTYPES, LoadedModel, load_model
from .prompts import POSITIONS, build_prompts, object_token_ids
from .relations import Relation, load_relations

logger = logging.getLogger(__name__)


@dataclass
class ProbeConfig(DictConfig):
    model: str = "default"  # hub name, local HF folder, .gguf file, or "default" (embedded SmolLM2-135M-Instruct)
    relations: str | None = None  # relation file or folder; None = the shipped dataset
    relation_names: list[str] | None = None  # keep only these relations (None = all)
    layers: list[int] | None = None  # None = every layer
    site: str = "resid_post"  # resid_pre | resid_mid | resid_post | attn_out | mlp_out
    position: str = "subject_last"  # subject_last | subject_first | last
    k_shot: int = 3  # in-context examples (other subjects of the relation) before each query
    template: int = 0  # which prompt template of each relation
    max_samples: int | None = None  # N evenly spaced samples per relation (None = all)
    known_tokens: int = 1  # a fact is known when the greedy next tokens match the object's first N tokens
    readout_on: str = "all"  # all | known: which facts the readout is fitted/scored on
    heldout_fraction: float = 0.25  # held-out subjects per split
    n_splits: int = 3  # readout accuracy averaged over this many random subject splits
    C: float = 1.0  # logistic-regression regularisation (classifier readout)
    alpha: float = 10.0  # ridge regularisation (vector readout)
    dtype: str = "float32"
    batch_size: int = 16
    padding: str = "right"  # right | left (both exact; tested)
    cache_states: bool = True  # disk cache of hidden states (model + prompts + site)

    def validate(self) -> None:
        if self.site not in SITES:
            raise ValueError(f"--site {self.site}: allowed values are {', '.join(SITES)}")
        if self.position not in POSITIONS:
            raise ValueError(f"--position {self.position}: allowed values are {', '.join(POSITIONS)}")
        check_prompt_options(self)
        if self.template < 0:
            raise ValueError(f"--template {self.template}: must be >= 0")
        if self.known_tokens < 1:
            raise ValueError(f"--known-tokens {self.known_tokens}: must be >= 1")
        if self.readout_on not in ("all", "known"):
            raise ValueError(f"--readout-on {self.readout_on}: allowed values are all, known")
        if not 0 < self.heldout_fraction < 1:
            raise ValueError(f"--heldout-fraction {self.heldout_fraction}: must lie in (0, 1)")
        if self.n_splits < 1:
            raise ValueError(f"--splits {self.n_splits}: must be >= 1")
        if self.batch_size < 1:
            raise ValueError(f"--batch-size {self.batch_size}: must be >= 1")
        if self.padding not in PADDING:
            raise ValueError(f"--padding {self.padding}: allowed values are {', '.join(PADDING)}")
        if self.layers is not None and not self.layers:
            raise ValueError("--layers: give at least one layer, or all")


def check_prompt_options(cfg) -> None:
    """The checks shared by every LLM config: ``k_shot``, ``max_samples``, ``dtype``."""
    if cfg.k_shot < 0:
        raise ValueError(f"--k-shot {cfg.k_shot}: must be >= 0")
    if cfg.max_samples is not None and cfg.max_samples < 4:
        raise ValueError(f"--max-samples {cfg.max_samples}: need at least 4")
    if cfg.dtype not in DTYPES:
        raise ValueError(f"--dtype {cfg.dtype}: allowed values are {', '.join(DTYPES)}")


def subset(rel: Relation, max_samples: int | None) -> Relation:
    """``max_samples`` evenly spaced samples (files are often grouped by object; this keeps the object mix)."""
    if max_samples is None or max_samples >= len(rel):
        return rel
    from dataclasses import replace

    keep = sorted({int(i) for i in np.linspace(0, len(rel) - 1, max_samples).round()})
    return replace(rel, subjects=tuple(rel.subjects[i] for i in keep), objects=tuple(rel.objects[i] for i in keep))


@dataclass
class RelationStates:
    """One relation's prompts, hidden states and known-fact mask."""

    relation: Relation
    prompts: list
    states: torch.Tensor  # (layers, n, d_model)
    layers: list[int]
    next_token: torch.Tensor  # (n,)
    object_first: list[int]  # first token of " " + object
    known: np.ndarray  # (n,) bool


def relation_states(lm: LoadedModel, rel: Relation, *, layers: list[int] | None, site: str, position: str,
                    k_shot: int, template: int, seed: int, known_tokens: int = 1, batch_size: int = 16,
                    padding: str = "right", use_cache: bool = True, progress: bool = True) -> RelationStates:
    prompts = build_prompts(rel, lm.tokenizer, lm.bos_id, k=k_shot, template=template, seed=seed)
    seqs = [p.tokens for p in prompts]
    ex = extract_states(lm, seqs, [p.position(position) for p in prompts], layers=layers, site=site,
                        batch_size=batch_size, padding=padding, use_cache=use_cache, progress=progress,
                        desc=rel.name)
    obj_toks = [object_token_ids(lm.tokenizer, p.object) for p in prompts]
    if known_tokens == 1:
        known = np.array([int(t) == o[0] for t, o in zip(ex.next_token, obj_toks)])
    else:
        greedy = greedy_tokens(lm, seqs, known_tokens, batch_size=batch_size, first=ex.next_token)
        known = np.array([greedy[i, :min(known_tokens, len(o))].tolist() == o[:known_tokens]
                          for i, o in enumerate(obj_toks)])
    return RelationStates(relation=rel, prompts=prompts, states=ex.states, layers=ex.layers,
                          next_token=ex.next_token, object_first=[o[0] for o in obj_toks], known=known)


def readout_targets(rs: RelationStates, lm: LoadedModel, idx: np.ndarray):
    """(kind, object ids, object vectors or None) for the readout over samples ``idx``."""
    rel = rs.relation
    if rel.kind == "many_to_one":
        objs = [rel.objects[i] for i in idx]
        classes = {o: c for c, o in enumerate(dict.fromkeys(objs))}
        return "classifier", np.array([classes[o] for o in objs]), None
    firsts = [rs.object_first[i] for i in idx]
    uniq = list(dict.fromkeys(firsts))
    cls = {t: c for c, t in enumerate(uniq)}
    W_U = lm.bridge.W_U.detach().float().cpu()  # (d_model, vocab)
    vecs = W_U[:, torch.tensor(uniq)].T.numpy()  # (n_classes, d_model)
    return "vector", np.array([cls[t] for t in firsts]), vecs


def layer_readouts(rs: RelationStates, lm: LoadedModel, cfg: ProbeConfig, seed: int) -> list[dict]:
    idx = np.arange(len(rs.prompts)) if cfg.readout_on == "all" else np.flatnonzero(rs.known)
    name = rs.relation.name
    if len(idx) < 4:
        logger.warning("%s: %d facts for the readout (need 4); skipped", name, len(idx))
        return []
    kind, y, vecs = readout_targets(rs, lm, idx)
    splits = [split_indices(len(idx), cfg.heldout_fraction, seed=derive_seed(seed, f"llm.split.{name}", s))
              for s in range(cfg.n_splits)]
    rows = []
    for j, layer in enumerate(rs.layers):
        X = rs.states[j, idx].double().numpy()
        scores = [linear_readout(X, y, tr, te, kind=kind, object_vectors=vecs, C=cfg.C, alpha=cfg.alpha,
                                 seed=derive_seed(seed, f"llm.control.{name}", s))
                  for s, (tr, te) in enumerate(splits)]
        rows.append({"layer": layer, "relation": name, "readout_kind": kind,
                     "readout_accuracy": float(np.mean([s.accuracy for s in scores])),
                     "control_accuracy": float(np.mean([s.control_accuracy for s in scores])),
                     "chance": float(np.mean([s.chance for s in scores])),
                     "n_train": scores[0].n_train, "n_test": scores[0].n_test, "n_classes": scores[0].n_classes})
    return rows


def mean_curves(result: dict) -> list[dict]:
    """Mean readout / control / chance per layer over relations, per relation kind and overall."""
    kinds = {r["relation"]: r["kind"] for r in result["relations"]}
    out = []
    for group in ("many_to_one", "one_to_one", "all"):
        rows = [r for r in result["per_layer"] if group == "all" or kinds.get(r["relation"]) == group]
        for layer in sorted({r["layer"] for r in rows}):
            at = [r for r in rows if r["layer"] == layer]
            out.append({"group": group, "layer": layer, "n_relations": len(at),
                        **{f"mean_{k}": float(np.mean([r[k] for r in at]))
                           for k in ("readout_accuracy", "control_accuracy", "chance")}})
    return out


def best_layers(result: dict) -> list[dict]:
    out = []
    for rel in result["relations"]:
        rows = [r for r in result["per_layer"] if r["relation"] == rel["relation"]]
        if rows:
            b = max(rows, key=lambda r: (r["readout_accuracy"], -r["layer"]))
            out.append({"relation": rel["relation"], "kind": rel["kind"], "best_layer": b["layer"],
                        **{k: b[k] for k in ("readout_accuracy", "control_accuracy", "chance", "n_test")}})
    return out


def run_llm_probe(cfg: ProbeConfig, out: str | Path, *, device: torch.device | str = "cpu", seed: int = 0,
                  lm: LoadedModel | None = None, progress: bool = True) -> dict:
    """Layer-wise readouts for every relation; writes config.json, result.json, meta.json, fig_*.png.

    Resumes: relations already in ``out/result.json`` are skipped. ``lm`` reuses a loaded model.
    """
    from . import plots

    cfg.validate()
    rels = [subset(r, cfg.max_samples) for r in load_relations(cfg.relations, cfg.relation_names)]
    lm = lm or load_model(cfg.model, device=device, dtype=cfg.dtype)
    layers = None if cfg.layers is None else [lm.check_layer(int(l), "--layers") for l in cfg.layers]
    for r in rels:
        if cfg.template >= len(r.prompt_templates):
            raise ValueError(f"--template {cfg.template}: relation {r.name} has templates 0..{len(r.prompt_templates) - 1}")
    run = RunDir(out, {"config": cfg, "seed": seed, "model_id": lm.model_id}, kind="llm.probe", seed=seed,
                 device=str(lm.device))
    res_file = run.file("result.json")
    result = read_json(res_file) if res_file.exists() else {"model": lm.name, "n_layers": lm.n_layers,
                                                            "relations": [], "per_layer": []}
    done = {r["relation"] for r in result["relations"]}
    for rel in rels:
        if rel.name in done:
            continue
        rs = relation_states(lm, rel, layers=layers, site=cfg.site, position=cfg.position, k_shot=cfg.k_shot,
                             template=cfg.template, seed=seed, known_tokens=cfg.known_tokens,
                             batch_size=cfg.batch_size, padding=cfg.padding, use_cache=cfg.cache_states,
                             progress=progress)
        rows = layer_readouts(rs, lm, cfg, seed)
        n_known = int(rs.known.sum())
        logger.info("%s: %d/%d known; best readout %.2f", rel.name, n_known, len(rel),
                    max([r["readout_accuracy"] for r in rows], default=float("nan")))
        result["relations"].append({"relation": rel.name, "kind": rel.kind, "n_samples": len(rel),
                                    "n_known": n_known, "n_objects": len(rel.object_set),
                                    "known_subjects": [p.subject for p, k in zip(rs.prompts, rs.known) if k]})
        result["per_layer"].extend(rows)
        run.write_result(result)
    result["mean_per_layer"] = mean_curves(result)
    result["best_layers"] = best_layers(result)
    run.write_result(result)
    plots.plot_readout(result, run.file("fig_readout.png"))
    plots.plot_readout_mean(result, run.file("fig_readout_mean.png"))
    plots.plot_known(result, run.file("fig_known.png"))
    run.write_meta(model=lm.name, model_id=lm.model_id)
    return result


QUICK_RELATIONS = ["animal_class", "city_country", "country_continent", "country_capital"]


def quick_probe_config(**over) -> ProbeConfig:
    """A small probe for the quickstart: 4 relations, 7 layers, 32 samples each, one split."""
    base = dict(relation_names=list(QUICK_RELATIONS), layers=[0, 5, 10, 15, 20, 25, 29], max_samples=32, n_splits=1)
    return ProbeConfig(**{**base, **over})
