"""Part 3 (paper B, mechanism side): every probe on one-layer models, the construction and two training regimes,
on an attribute-pool world and a bijection world."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import torch

from ..runs import write_json_atomic
from . import claims, layout
from .layout import Part
from .sizes import POOL, Sizes, probe_models, sizes_for

logger = logging.getLogger(__name__)


def _per_relation_readout(res: dict) -> list[float]:
    from .. import hooks

    rows = [r for r in res["readout"]["per_relation"] if r["site"].startswith(hooks.embed())]
    return [r["accuracy"] for r in sorted(rows, key=lambda r: r["relation"])]


def probe_model(spec: dict, *, seed: int = 0, device="cpu") -> dict:
    """Build or train one model of the probe section and run every probe on it; a flat dict of numbers."""
    from ..facts import FactWorld, build_single_hop, evaluate
    from ..facts.regimes import REGIMES
    from ..facts.train import TrainConfig
    from ..probes.experiments import summary
    from ..targets import SwapConfig, probe_all

    t = time.time()
    pool = spec["world"] == "pool"
    world = FactWorld(POOL["n"], POOL["relations"], seed=seed, attributes=POOL["attributes"] if pool else None)
    if spec["model"] == "construction":
        model = build_single_hop(world, 24, seed=seed).to(device)
        info = {"d": model.cfg.d, "mlp_width": model.cfg.mlp_width, "steps": 0}
    else:
        regime = REGIMES[spec["model"]]
        if spec.get("steps"):
            regime = dataclasses.replace(regime, train=dataclasses.replace(regime.train, steps=spec["steps"]))
        model, res = regime.fit(world, seed=seed, device=device)
        info = {"d": regime.d, "mlp_width": regime.mlp_width, "steps": res.get("steps"), "loss": regime.train.loss,
                "l2": regime.train.l2}
    model.eval()
    res = probe_all(model, world, seed=seed, swap=SwapConfig(retrain=TrainConfig(lr=3e-2, steps=30, eval_every=10,
                                                                                  target_accuracy=None)))
    return {**spec, **info, "n_entities": world.n_entities, "n_relations": world.n_relations,
            "n_attributes": world.n_attributes, "chance": 1.0 / world.n_attributes,
            "train_accuracy": evaluate(model, world)["accuracy"], **summary(res),
            "readout_embed_per_relation": _per_relation_readout(res),
            "readout_chance": res["readout"]["per_relation"][0].get("chance"), "wall_time_s": round(time.time() - t, 1)}


def probe_part(out: Path, *, device: torch.device, seed: int = 0, fast: bool = False,
               sizes: Sizes | None = None) -> Part:
    from ..probes.plots import plot_probe_ablation, plot_probe_regimes

    sz = sizes or sizes_for(fast)
    logger.info("probes: two regimes on an attribute-pool world, and a bijection world")
    models = []
    for spec in probe_models(sz):
        logger.info("probes: %s", spec["label"])
        models.append(probe_model(spec, seed=seed, device=device))
    write_json_atomic(out / "probes_quick.json", models)
    figs = out / "figures"
    figs.mkdir(exist_ok=True)
    plot_probe_regimes(models, figs / "probe_regimes.png")
    plot_probe_ablation(models, figs / "probe_ablation.png")
    sec = layout.probe_section(models, figs, pool_world=POOL, seed=seed)
    return Part([sec], claims.probe_claims(models, sec.anchor))
