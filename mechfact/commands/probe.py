"""``mechfact probe readout|superposition|intervene|swap|scores --model RUN_DIR --out DIR``.

Import-light: the probes are imported inside the handler.
"""

from __future__ import annotations

import argparse

PROBES = ("readout", "superposition", "intervene", "swap", "scores")


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None


def register(subparsers) -> dict:
    from mechfact.cli import UsageError, common_args  # noqa: F401  (UsageError used by the handler)

    pr = subparsers.add_parser("probe", help="mechanistic probes on a fact run dir or a pretrained model")
    psub = pr.add_subparsers(dest="probe_kind", required=True, parser_class=type(pr))

    def model_arg(p):
        p.add_argument("--model", required=True,
                       help="run directory of `mechfact facts train|construct` (or a pretrained model name)")

    p = psub.add_parser("readout", help="linear readouts per relation and hook site on held-out subjects")
    model_arg(p)
    p.add_argument("--sites", nargs="+", default=None,
                   help="HOOK@subject|last (default: embed@subject, resid_mid, mlp_post, resid_post @last)")
    p.add_argument("--relations", type=_int_list, default=None, help="comma-separated relation ids (default all)")
    p.add_argument("--kind", default="auto", choices=("auto", "vector", "classifier"))
    p.add_argument("--heldout", type=float, default=0.25, help="share of subjects held out (default 0.25)")
    p.add_argument("--alpha", type=float, default=1.0, help="ridge strength of vector readouts (default 1)")
    common_args(p)

    p = psub.add_parser("superposition", help="regress subject embeddings on their attribute vectors")
    model_arg(p)
    p.add_argument("--heldout", type=float, default=0.2, help="share of subjects held out (default 0.2)")
    common_args(p)

    p = psub.add_parser("intervene", help="selector-unit ablation, relation selectivity, relation-token swaps")
    model_arg(p)
    p.add_argument("--relations", type=_int_list, default=None, help="relations to ablate (default all)")
    p.add_argument("--site", default="blocks.0.mlp.hook_post", help="hook of the units (default blocks.0.mlp.hook_post)")
    p.add_argument("--units", type=int, default=None, help="units per relation (default: all that prefer it)")
    p.add_argument("--ablation", default="zero", choices=("zero", "mean"))
    common_args(p)

    p = psub.add_parser("swap", help="freeze-and-swap: new bijections, zero-shot and retrained embeddings")
    model_arg(p)
    p.add_argument("--new-seed", type=int, default=1, help="seed of the new bijections (default 1)")
    p.add_argument("--steps", type=int, default=300, help="retraining steps (default 300)")
    p.add_argument("--lr", type=float, default=1e-2, help="retraining Adam lr (default 1e-2)")
    common_args(p)

    p = psub.add_parser("scores", help="target vs competitor logits (EVT line) and spectra of effective maps")
    model_arg(p)
    common_args(p)
    return {"probe": _run}


def _run(a) -> None:
    from mechfact.cli import UsageError
    from mechfact.probes import experiments as ex
    from mechfact.probes.fit import FitConfig

    kw = {"device": a.device_obj, "seed": a.seed}
    if a.probe_kind == "readout":
        if not 0 < a.heldout < 1:
            raise UsageError(f"--heldout {a.heldout}: must lie in (0, 1)")
        cfg = ex.ReadoutConfig(relations=a.relations, kind=a.kind, heldout_fraction=a.heldout, alpha=a.alpha)
        if a.sites:
            from mechfact.probes.queries import Site

            cfg.sites = [str(Site.parse(s)) for s in a.sites]
        ex.run_readout(a.model, cfg, a.out, **kw)
    elif a.probe_kind == "superposition":
        if not 0 < a.heldout < 1:
            raise UsageError(f"--heldout {a.heldout}: must lie in (0, 1)")
        ex.run_superposition(a.model, ex.SuperpositionConfig(heldout_fraction=a.heldout), a.out, **kw)
    elif a.probe_kind == "intervene":
        if a.units is not None and a.units < 1:
            raise UsageError(f"--units {a.units}: must be at least 1")
        ex.run_intervene(a.model, ex.InterveneConfig(relations=a.relations, site=a.site, n_units=a.units,
                                                     kind=a.ablation), a.out, **kw)
    elif a.probe_kind == "swap":
        if a.steps < 0 or a.lr <= 0:
            raise UsageError(f"--steps {a.steps} / --lr {a.lr}: need steps >= 0 and lr > 0")
        ex.run_swap(a.model, ex.SwapConfig(new_seed=a.new_seed, retrain=FitConfig(lr=a.lr, steps=a.steps,
                                                                                 eval_every=max(1, a.steps // 12))),
                    a.out, **kw)
    else:
        ex.run_scores(a.model, ex.ScoresConfig(), a.out, **kw)
    print(f"results written to {a.out}")
