"""``mechfact facts train|construct|capacity|multihop``: synthetic facts and one-layer transformers (paper B)."""

from __future__ import annotations

import argparse

from ._args import common_args, executor_args, finite_float, make_executor_from
from ..facts.experiments import SCANS, SEARCHES
from ..facts.model import ATTENTION, EMBEDDINGS, ENTITY_INIT, OUTPUTS
from ..facts.train import LOSSES, SCHEDULES


def _accuracy_or_none(text: str) -> float | None:
    if text.lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number in (0, 1] or 'none'") from None


def _model_args(p: argparse.ArgumentParser, attention: str = "uniform") -> None:
    p.add_argument("--attention", default=attention, choices=ATTENTION, help=f"(default {attention})")
    p.add_argument("--tied", action="store_true", help="tie the entity unembedding to the input embedding")
    p.add_argument("--layer-norm", action="store_true", help="pre-LayerNorm before attention, MLP and unembedding")
    p.add_argument("--entity-init", default="normal", choices=ENTITY_INIT,
                   help="entity input embeddings at init: normal N(0, I/d) rows, or zero (default normal)")
    p.add_argument("--entity-init-scale", type=finite_float, default=1.0,
                   help="multiplies the std of the normal entity init: N(0, s^2 I/d) rows (default 1)")
    p.add_argument("--outputs", default="auto", choices=OUTPUTS,
                   help="output vocabulary: all entities, or the world's attribute pool (--attributes A: every "
                        "answer is one of them; N / A times cheaper to score); auto: the pool for single-hop "
                        "queries of a pool world, entities otherwise (default auto)")


def _optim_args(p: argparse.ArgumentParser, steps: int, patience: int, lr: float = 1e-2,
                schedule: str = "constant") -> None:
    p.add_argument("--steps", type=int, default=steps, help=f"Adam step budget per model (default {steps})")
    p.add_argument("--lr", type=finite_float, default=lr, help=f"Adam (peak) learning rate (default {lr:g})")
    p.add_argument("--schedule", default=schedule, choices=SCHEDULES,
                   help=f"learning-rate schedule; warmup-cosine: 5%% linear warm-up then cosine to 0 (default {schedule})")
    p.add_argument("--batch-size", type=int, default=0, help="queries per step; 0 = full batch (default 0)")
    p.add_argument("--weight-decay", type=finite_float, default=0.0, help="AdamW decoupled weight decay (default 0)")
    p.add_argument("--l2", type=finite_float, default=0.0,
                   help="coupled L2 penalty (l2/2)*|theta|^2 on every trained tensor, in the loss (default 0)")
    p.add_argument("--loss", default="ce", choices=LOSSES,
                   help="ce: cross-entropy; mse: squared error of the logits against --target-logit on the answer "
                        "and 0 elsewhere (default ce)")
    p.add_argument("--target-logit", type=finite_float, default=1.0, help="the answer's target logit for --loss mse (default 1)")
    p.add_argument("--patience", type=int, default=patience,
                   help=f"give up after this many steps without a better accuracy; 0 = never (default {patience})")
    p.add_argument("--eval-every", type=int, default=50, help="steps between accuracy checks (default 50)")


def _size_args(p: argparse.ArgumentParser, subjects: int, d: int, mlp_width: int = 64) -> None:
    p.add_argument("--subjects", type=int, default=subjects, help=f"N entities (default {subjects})")
    p.add_argument("--relations", type=int, default=4, help="R relations (default 4)")
    p.add_argument("--d", type=int, default=d, help=f"residual width (default {d})")
    p.add_argument("--mlp-width", type=int, default=mlp_width, help=f"MLP hidden units m (default {mlp_width})")


def _seed_args(p: argparse.ArgumentParser, init: bool) -> None:
    p.add_argument("--world-seed", type=int, default=None,
                   help="seed of the facts (default: --seed)")
    if init:
        p.add_argument("--init-seed", type=int, default=None,
                       help="seed of the model's initialisation (default: --seed; --seed also orders the batches)")
    else:
        p.set_defaults(init_seed=None)


def register(sub) -> dict:
    fp = sub.add_parser("facts", help="synthetic facts and one-layer transformers (paper B)")
    fsub = fp.add_subparsers(dest="facts_cmd", required=True, parser_class=type(fp))

    p = fsub.add_parser("train", help="train one model on N*R facts (checkpoints; rerun to resume)")
    _size_args(p, subjects=256, d=32)
    p.add_argument("--embeddings", default="trainable", choices=EMBEDDINGS, help="(default trainable)")
    p.add_argument("--hops", type=int, default=1, help="k-hop queries (default 1)")
    p.add_argument("--cot", action="store_true", help="answer k-hop queries with chain of thought")
    p.add_argument("--attributes", type=int, default=None,
                   help="map the subjects into a shared pool of this many attributes (entities 0..A-1) instead "
                        "of bijections (default: bijections)")
    p.add_argument("--target-accuracy", type=_accuracy_or_none, default=0.99,
                   help="stop early at this accuracy; none = run every step (default 0.99)")
    _model_args(p)
    _optim_args(p, steps=5000, patience=0)
    _seed_args(p, init=True)
    common_args(p)

    p = fsub.add_parser("construct", help="build the explicit construction (no training) as a run directory")
    p.add_argument("--subjects", type=int, default=256)
    p.add_argument("--relations", type=int, default=4)
    p.add_argument("--d", type=int, default=None, help="residual width; default: the smallest reaching 99%%")
    p.add_argument("--hops", type=int, default=1)
    p.add_argument("--cot", action="store_true", help="the chain-of-thought construction (needed for k > 1)")
    _seed_args(p, init=False)
    common_args(p)

    p = fsub.add_parser("capacity", help="smallest d (or MLP width) reaching 99%% per (N, R, regime)")
    p.add_argument("--subjects", type=int, nargs="+", default=[256], help="N values (default 256)")
    p.add_argument("--relations", type=int, nargs="+", default=[2, 4, 8], help="R values (default 2 4 8)")
    p.add_argument("--embeddings", nargs="+", default=["trainable"], choices=EMBEDDINGS)
    p.add_argument("--search", default="d", choices=SEARCHES, help="what to search (default d)")
    p.add_argument("--grid", type=int, nargs="+", default=None,
                   help="values searched (default 4 6 8 12 16 24 32 48 64 96 128 192 256)")
    p.add_argument("--scan", default="bisect", choices=SCANS,
                   help="bisect the grid (default; assumes a value that reaches is followed by values that reach) "
                        "or try each value in ascending order until one reaches (the smallest that does)")
    p.add_argument("--d", type=int, default=64, help="fixed d when searching the MLP width (default 64)")
    p.add_argument("--mlp-width", type=int, default=64, help="fixed MLP width when searching d (default 64)")
    p.add_argument("--seeds", type=int, default=1, help="independent worlds + inits per setting (default 1)")
    p.add_argument("--attributes", type=int, nargs="+", default=None, metavar="A",
                   help="attribute-pool sizes: every relation maps the subjects into a pool of A attributes "
                        "(default: none, each relation a bijection)")
    p.add_argument("--reuse-evaluations", nargs="+", default=None, metavar="DIR",
                   help="capacity run folders with the same training, model and target: their evaluations are "
                        "taken where this run has none (e.g. an ascending scan over a bisection's runs)")
    _model_args(p)
    _optim_args(p, steps=4000, patience=1500)
    common_args(p)
    executor_args(p)

    p = fsub.add_parser("multihop", help="direct vs chain-of-thought answering of k-hop queries, same model size")
    _size_args(p, subjects=32, d=16, mlp_width=32)
    p.add_argument("--hops", type=int, nargs="+", default=[1, 2, 3])
    _model_args(p, attention="learned")
    _optim_args(p, steps=3000, patience=0, lr=3e-2, schedule="warmup-cosine")
    common_args(p)
    executor_args(p)
    return {"facts": _run}


def _train_cfg(a, target: float | None):
    from ..facts.train import TrainConfig

    return TrainConfig(lr=a.lr, steps=a.steps, batch_size=a.batch_size or None, target_accuracy=target,
                       eval_every=a.eval_every, weight_decay=a.weight_decay, schedule=a.schedule, patience=a.patience,
                       loss=a.loss, target_logit=a.target_logit, l2=a.l2)


def _spec(a, embeddings: str = "trainable"):
    from ..facts.experiments import ModelSpec

    return ModelSpec(attention=a.attention, embeddings=embeddings, tied=a.tied, layer_norm=a.layer_norm,
                     entity_init=a.entity_init, entity_init_scale=a.entity_init_scale, outputs=a.outputs)


def capacity_config(a):
    """The :class:`~mechfact.facts.experiments.FactsCapacityConfig` of parsed ``facts capacity`` arguments."""
    from ..facts import experiments as ex

    return ex.FactsCapacityConfig(subjects=a.subjects, relations=a.relations, embeddings=a.embeddings,
                                  search=a.search, scan=a.scan, d=a.d, mlp_width=a.mlp_width, seeds=a.seeds,
                                  model=_spec(a), train=_train_cfg(a, 0.99), attributes=a.attributes,
                                  **({"grid": a.grid} if a.grid else {}))


def _run(a) -> None:
    from ..facts import experiments as ex

    dev, seed = a.device_obj, a.seed
    if a.facts_cmd == "train":
        cfg = ex.FactsTrainConfig(subjects=a.subjects, relations=a.relations, d=a.d, mlp_width=a.mlp_width, hops=a.hops,
                                  cot=a.cot, attributes=a.attributes, model=_spec(a, a.embeddings),
                                  train=_train_cfg(a, a.target_accuracy), world_seed=a.world_seed,
                                  init_seed=a.init_seed)
        res = ex.run_train(cfg, a.out, device=dev, seed=seed, progress=not a.quiet)
        print(f"accuracy {res['accuracy']:.4f} after {res['steps']} steps ({res['stopped']})")
    elif a.facts_cmd == "construct":
        cfg = ex.ConstructConfig(subjects=a.subjects, relations=a.relations, d=a.d, hops=a.hops, cot=a.cot,
                                 world_seed=a.world_seed)
        res = ex.run_construct(cfg, a.out, device=dev, seed=seed)
        print(f"construction d={res['d']} (block size {res['block_size']}): accuracy {res['accuracy']:.4f}")
    elif a.facts_cmd == "capacity":
        cfg = capacity_config(a)
        with make_executor_from(a, "facts capacity") as executor:
            res = ex.run_facts_capacity(cfg, a.out, device=dev, seed=seed, executor=executor,
                                        reuse=a.reuse_evaluations)
        for t in res["thresholds"]:
            pool = f" A={t['attributes']}" if t.get("attributes", t["subjects"]) != t["subjects"] else ""
            print(f"{t['embeddings']:>12}{pool} N={t['subjects']} R={t['relations']} seed={t['seed']}: "
                  f"{t['searched']}* = {t['threshold']}")
    elif a.facts_cmd == "multihop":
        cfg = ex.MultihopConfig(subjects=a.subjects, relations=a.relations, hops=a.hops, d=a.d,
                                mlp_width=a.mlp_width, model=_spec(a), train=_train_cfg(a, 0.99))
        with make_executor_from(a, "facts multihop") as executor:
            res = ex.run_multihop(cfg, a.out, device=dev, seed=seed, executor=executor)
        for p in res["points"]:
            print(f"k={p['hops']} {p['mode']:>6}: accuracy {p['accuracy']:.4f}")
    print(f"results written to {a.out}")
