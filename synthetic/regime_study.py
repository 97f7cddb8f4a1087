"""Which training regime makes gradient descent find the geometric solution? (docs/results_probes.md)

    python -m synthetic.regime_study --out runs/probes_regimes [--regimes plain geometric ...] [--n 512] [--device cpu]

For each named regime of :mod:`mechfact.facts.regimes` and each N: train a
one-layer fact model (R = 4) on all N R facts (``REGIMES[name].fit``), save it
as a fact run directory (``<out>/<regime>_N<N>/model`` + ``world.json``: a valid
``--model`` for ``mechfact probe ...``), then run every probe once
(:func:`~mechfact.targets.probe_all`: superposition test, readouts,
selector ablation + relation swaps, freeze-and-swap with its controls) and write
``result.json`` (probe results + training history) and ``summary.json`` (the
headline numbers). Rerunning skips finished runs. ``--table`` prints the
markdown table of the results doc from the summaries. One CPU thread; a regime
at N = 512 takes 3-8 minutes on a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from mechfact import hooks
from mechfact.device import resolve_device
from mechfact.facts import REGIMES, FactWorld, TrainConfig, build_single_hop, evaluate, min_block_size
from mechfact.facts.runio import save_fact_run
from mechfact.probes.experiments import summary
from mechfact.targets import SwapConfig, probe_all
from mechfact.probes.queries import Site
from mechfact.runs import RunDir, read_json

R = 4
SWAP = SwapConfig(new_seed=1, retrain=TrainConfig(lr=1e-2, steps=300, eval_every=25, target_accuracy=None))
READOUT_SITES = [Site(hooks.embed(), "subject"), Site(hooks.resid(0, "mid"), "last"),
                 Site(hooks.resid(0, "post"), "last")]

CHOICES = ["construction", *REGIMES]


def run_dir(out: Path, regime: str, n: int, attributes: int | None, l2: float | None = None) -> Path:
    return out / (f"{regime}_N{n}" + ("" if attributes is None else f"_A{attributes}")
                  + ("" if l2 is None else f"_l2{l2:g}"))


def run_one(regime: str, n: int, out: Path, seed: int = 0, attributes: int | None = None,
            l2: float | None = None, device: str | torch.device = "cpu") -> dict:
    """Train (or, for ``construction``, build with the smallest block size reaching 100%) and probe.

    ``attributes``: a shared attribute pool of that size instead of bijections (FactWorld).
    ``l2``: replaces the regime's coupled L2 strength (the squared-loss regimes need it ~1/N).
    """
    path = run_dir(out, regime, n, attributes, l2)
    if (path / "summary.json").is_file():
        return read_json(path / "summary.json")
    device = resolve_device(str(device))
    world = FactWorld(n, R, seed=seed, attributes=attributes)
    t0 = time.time()
    if regime == "construction":
        if attributes is not None:
            raise ValueError("--attributes: the construction row is built for bijection worlds only")
        b, _ = min_block_size(n, R, target=1.0, seed=seed, start=8)
        cfg, reg = {"block_size": b}, None
    else:
        reg = REGIMES[regime]
        if l2 is not None:
            reg = dataclasses.replace(reg, train=dataclasses.replace(reg.train, l2=l2))
        cfg = reg.to_dict()
    run = RunDir(path, cfg, kind="probes.regimes", seed=seed, device=str(device), regime=regime, n_entities=n,
                 n_relations=R, attributes=attributes, swap=SWAP.to_dict())
    if reg is None:
        model = build_single_hop(world, cfg["block_size"], seed=seed).to(device)
        hist = [{"step": 0, "loss": float("nan"), "accuracy": evaluate(model, world)["accuracy"]}]
    else:
        model, res = reg.fit(world, seed=seed, device=device)
        hist = res["history"]
    train_s = time.time() - t0
    save_fact_run(path, model, world)
    res = probe_all(model, world, seed=seed, swap=SWAP, readout_sites=READOUT_SITES)
    acc = evaluate(model, world)
    summ = {"regime": regime if l2 is None else f"{regime} (l2 {l2:g})", "n_entities": n, "attributes": attributes,
            "train_accuracy": acc["accuracy"],
            "steps": hist[-1]["step"],
            "final_loss": hist[-1]["loss"], **summary(res)}
    run.finish({**res, "history": hist, "train": acc}, train_seconds=round(train_s, 1))
    (path / "summary.json").write_text(json.dumps(summ, indent=2))  # last: marks the run finished
    return summ


def table(rows: list[dict]) -> str:
    f = lambda x: f"{x:.2f}"  # noqa: E731
    head = ("| regime | N | train acc | R^2 train / held-out (control) | relation-subspace overlap | readout embed "
            "min / mean (control max) | ablation: on r / others / random (mean) | relation swap moved | zero-shot "
            "(control) | retrained / relearn-original |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for s in rows:
        m = lambda k: sum(s[k]) / len(s[k])  # noqa: E731
        lines.append(
            f"| {s['regime']} | {s['n_entities']}{'' if not s.get('attributes') else ', A ' + str(s['attributes'])} | "
            f"{f(s['train_accuracy'])} | {f(s['r2_train'])} / "
            f"{f(s['r2_heldout'])} ({f(s['control_r2_heldout'])}) | {f(s['block_overlap_offdiag'])} | "
            f"{f(s['readout_embed_min'])} / {f(s['readout_embed_mean'])} ({f(s['readout_embed_control_max'])}) | "
            f"{f(m('ablation_on_relation'))} / {f(m('ablation_on_others'))} / {f(m('ablation_random_on_relation'))} | "
            f"{f(m('relation_swap_moved'))} | {f(s['zero_shot_accuracy'])} ({f(s['zero_shot_control_accuracy'])}) | "
            f"{f(s['retrained_accuracy'])} / {f(s['control_relearn_accuracy'])} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/probes_regimes")
    ap.add_argument("--regimes", nargs="+", default=CHOICES, choices=CHOICES)
    ap.add_argument("--n", type=int, nargs="+", default=[512])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attributes", type=int, default=None,
                    help="shared attribute pool of this size instead of bijections (default: bijections)")
    ap.add_argument("--l2", type=float, default=None,
                    help="replace the regimes' coupled L2 strength (default: each regime's own)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda[:i] or auto (default cpu)")
    ap.add_argument("--table", action="store_true", help="only print the table of finished runs")
    a = ap.parse_args(argv)
    device = resolve_device(a.device)  # a bad --device fails before any training
    torch.set_num_threads(1)
    out = Path(a.out)
    rows = []
    for n in a.n:
        for reg in a.regimes:
            if a.table:
                p = run_dir(out, reg, n, a.attributes, a.l2) / "summary.json"
                if p.is_file():
                    rows.append(read_json(p))
                continue
            rows.append(run_one(reg, n, out, a.seed, a.attributes, a.l2, device))
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
