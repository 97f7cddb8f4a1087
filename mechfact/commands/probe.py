"""``mechfact probe readout|superposition|intervene|swap|scores|lre|NAME --model MODEL --out DIR``.

``NAME``: every analysis registered in :mod:`mechfact.analyses` (trace, knockout, attribute-rate, extraction,
attribution, transfer, selectivity), its flags generated from its declaration. ``lre`` is ``mechfact llm lre``
and ``superposition`` on a pretrained model is ``mechfact llm superposition`` (same options, same run folders).

``--model`` is a fact-model run directory (``mechfact facts train|construct``) or a pretrained model (hub name,
local Hugging Face folder, ``.gguf`` file, ``default``). On a pretrained model ``--relations`` is a relation
file or folder and the prompt options of ``mechfact llm`` apply; ``readout`` then runs the layer-wise readout
of ``mechfact llm probe`` (same code, same numbers). ``swap`` needs a fact world.
"""

from __future__ import annotations


import argparse

from ._args import UsageError, common_args, executor_args, finite_float
from .llm import (lre_args, pretrained_model_args, prompt_args, prompt_options, readout_args,
                  superposition_args)

PROBES = ("readout", "superposition", "intervene", "swap", "scores", "lre")
# the options of superposition that only a pretrained model takes, with their defaults (set in register)
_LLM_SUPERPOSITION: dict[str, object] = {}


def _relation_ids(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--relations {text}: expected comma-separated integers (relation ids of a fact model; "
                         "a relation file or folder goes with a pretrained --model)") from None


def register(subparsers) -> dict:
    pr = subparsers.add_parser("probe", help="mechanistic probes on a fact run dir or a pretrained model")
    psub = pr.add_subparsers(dest="probe_kind", required=True, parser_class=type(pr))

    def model_arg(p, pretrained: bool = True):
        p.add_argument("--model", required=True,
                       help="run directory of `mechfact facts train|construct`"
                            + (", or a pretrained model: hub name, local HF folder, .gguf file, default"
                               if pretrained else " (needs a fact world)"))
        if pretrained:
            p.add_argument("--relations", default=None,
                           help="fact model: comma-separated relation ids (default all); pretrained model: a "
                                "relation JSON file or folder (default: the shipped dataset)")

    p = psub.add_parser("readout", help="linear readouts per relation and hook site (fact model) or per layer (LLM)")
    model_arg(p)
    p.add_argument("--sites", nargs="+", default=None,
                   help="fact model: HOOK@POSITION (default: embed@subject, resid_mid, mlp_post, resid_post @last)")
    p.add_argument("--kind", default="auto", choices=("auto", "vector", "classifier"), help="fact model (default auto)")
    p.add_argument("--heldout", type=finite_float, default=0.25, help="share of subjects held out (default 0.25)")
    p.add_argument("--alpha", type=finite_float, default=None,
                   help="ridge strength of vector readouts (default 1 for fact models, 10 for LLMs)")
    prompt_args(p)
    readout_args(p)
    common_args(p)

    p = psub.add_parser("superposition", help="regress subject embeddings (fact model) or states (pretrained model, "
                                             "per layer, with controls) on their attribute vectors")
    model_arg(p)
    superposition_args(p)  # --heldout for both; the rest for a pretrained model
    _LLM_SUPERPOSITION.update({x.dest: x.default for x in p._actions
                               if x.dest not in ("help", "model", "relations", "heldout")})
    common_args(p)

    p = psub.add_parser("lre", help="linear relational embeddings (pretrained model): faithfulness and causality, "
                                    "as `mechfact llm lre`")
    pretrained_model_args(p)
    lre_args(p)
    common_args(p)
    executor_args(p)

    p = psub.add_parser("intervene", help="selector-unit ablation, relation selectivity, relation-token swaps")
    model_arg(p)
    p.add_argument("--site", default=None, help="hook of the units (default blocks.LAYER.mlp.hook_post)")
    p.add_argument("--layer", type=int, default=None, help="block of the default site (default 0; LLM: middle)")
    p.add_argument("--units", type=int, default=None, help="units per relation (default: all that prefer it)")
    p.add_argument("--ablation", default="zero", choices=("zero", "mean"))
    p.add_argument("--relation-ids", default=None, help="pretrained model: relation ids to ablate (default all)")
    prompt_args(p)
    common_args(p)

    p = psub.add_parser("swap", help="freeze-and-swap: new bijections, zero-shot and retrained embeddings")
    model_arg(p, pretrained=False)
    p.add_argument("--new-seed", type=int, default=1, help="seed of the new bijections (default 1)")
    p.add_argument("--steps", type=int, default=300, help="retraining steps (default 300)")
    p.add_argument("--lr", type=finite_float, default=1e-2, help="retraining Adam lr (default 1e-2)")
    common_args(p)

    p = psub.add_parser("scores", help="target vs competitor logits (EVT line) and spectra of effective maps")
    model_arg(p)
    p.add_argument("--layer", type=int, default=None, help="MLP block analysed (default 0; LLM: middle)")
    prompt_args(p)
    common_args(p)

    from ..analyses import ANALYSES  # one parser per registered analysis, its flags from its declaration

    for name, an in ANALYSES.items():
        p = psub.add_parser(name, help=an.help)
        model_arg(p)
        for o in an.options:
            if o.kind == "bool":
                p.add_argument(o.flag, dest=f"opt_{o.name}", action=argparse.BooleanOptionalAction,
                               default=o.default, help=f"{o.help} (default {o.default})")
            else:
                shown = ",".join(map(str, o.default)) if isinstance(o.default, tuple) else o.default
                p.add_argument(o.flag, dest=f"opt_{o.name}", type=str, default=None, metavar=o.kind.upper(),
                               help=o.help + ("" if "default" in o.help else
                                              f" (default {'auto' if shown is None else shown})")
                                    + (f"; one of {', '.join(o.choices)}" if o.choices else ""))
        common_args(p)
    return {"probe": _run}


def _run_registered(a) -> None:
    """``mechfact probe NAME`` for a registered analysis (:mod:`mechfact.analyses`)."""
    from ..analyses import ANALYSES, _source, run
    from ..targets import load_target

    an = ANALYSES[a.probe_kind]
    opts = {}
    for o in an.options:
        v = getattr(a, f"opt_{o.name}")
        if o.kind == "bool":
            opts[o.name] = bool(v)
        elif v is not None:
            try:
                opts[o.name] = o.parse(v)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
    model, world, _ = load_target(a.model, device=a.device_obj)
    relations = getattr(a, "relations", None) if world is None else None
    if world is not None and getattr(a, "relations", None) is not None:
        raise UsageError(f"--relations {a.relations}: a fact model runs on its own world; --relations is for a "
                         "pretrained --model")
    run(a.probe_kind, model, _source(model, world, relations), out=a.out, seed=a.seed, device=str(a.device_obj),
        progress=not a.quiet, model_spec=str(a.model), relations=relations, **opts)
    print(f"results written to {a.out}")


def _run(a) -> None:
    from ..analyses import ANALYSES

    if a.probe_kind in ANALYSES:
        return _run_registered(a)
    from ..facts.train import TrainConfig
    from ..llm.readout import run_llm_probe
    from ..targets import check_target
    from . import probe_runs as ex
    from .llm import run_lre, run_superposition

    kw = {"device": a.device_obj, "seed": a.seed}
    if a.probe_kind == "lre":
        run_lre(a)
        print(f"results written to {a.out}")
        return
    fact = check_target(a.model) == "fact"
    relations = getattr(a, "relations", None)
    if not fact and a.probe_kind == "swap":
        raise UsageError(f"probe {a.probe_kind} needs a synthetic fact model (world.json); --model {a.model} is "
                         "a pretrained model")
    if not fact and a.probe_kind == "superposition":
        run_superposition(a)
        print(f"results written to {a.out}")
        return
    if fact and a.probe_kind == "superposition":
        changed = [k for k, v in _LLM_SUPERPOSITION.items() if getattr(a, k) != v]
        if changed or relations is not None:
            flags = ["--" + k.replace("_", "-") for k in changed] + (["--relations"] if relations else [])
            raise UsageError(f"probe superposition: {', '.join(flags)} apply to a pretrained --model; a fact model "
                             "takes --heldout only")
    prompts = {} if fact else {"relations": relations, **prompt_options(a)}
    prompts.pop("batch_size", None), prompts.pop("cache_states", None)
    if a.probe_kind == "readout":
        if fact:
            cfg = ex.ReadoutConfig(relations=_relation_ids(relations), kind=a.kind, heldout_fraction=a.heldout,
                                   alpha=1.0 if a.alpha is None else a.alpha,
                                   **({"sites": a.sites} if a.sites else {}))
            ex.run_readout(a.model, cfg, a.out, **kw)
        else:
            from .llm import probe_config

            cfg = probe_config(a, a.model, relations)
            cfg = type(cfg).from_dict({**cfg.to_dict(), "heldout_fraction": a.heldout,
                                       **({} if a.alpha is None else {"alpha": a.alpha})})
            run_llm_probe(cfg, a.out, progress=not a.quiet, kind="probe.readout", **kw)
    elif a.probe_kind == "superposition":
        ex.run_superposition(a.model, ex.SuperpositionConfig(heldout_fraction=a.heldout), a.out, **kw)
    elif a.probe_kind == "intervene":
        ids = _relation_ids(relations) if fact else _relation_ids(a.relation_ids)
        cfg = ex.InterveneConfig(relations=ids, site=a.site, n_units=a.units, kind=a.ablation, layer=a.layer)
        ex.run_intervene(a.model, cfg, a.out, **kw, **prompts)
    elif a.probe_kind == "swap":
        retrain = TrainConfig(lr=a.lr, steps=a.steps, eval_every=max(1, a.steps // 12), target_accuracy=None)
        ex.run_swap(a.model, ex.SwapConfig(new_seed=a.new_seed, retrain=retrain), a.out, **kw)
    else:
        ex.run_scores(a.model, ex.LogitScoresConfig(layer=a.layer), a.out, **kw, **prompts)
    print(f"results written to {a.out}")
