"""Part 2 (paper B, training side): one-layer transformers on synthetic facts, the explicit construction, the
threshold d* against R ln N, and the MLP width needed with frozen embeddings."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from . import claims, layout
from .layout import Part
from .sizes import Sizes, sizes_for

logger = logging.getLogger(__name__)


def facts_part(out: Path, *, device: torch.device, seed: int = 0, fast: bool = False,
               sizes: Sizes | None = None) -> Part:
    from ..facts import experiments as fx
    from ..facts.train import TrainConfig as FactsTrain

    sz = sizes or sizes_for(fast)
    n, r = sz.facts_n, sz.facts_r
    logger.info("facts: train a one-layer transformer")
    tr = fx.run_train(fx.FactsTrainConfig(subjects=n, relations=r, d=16, mlp_width=64,
                                          train=FactsTrain(lr=3e-2, schedule="warmup-cosine", steps=1000,
                                                           target_accuracy=0.99, eval_every=25)),
                      out / "facts_train", device=device, seed=seed, progress=True)
    logger.info("facts: the explicit construction")
    co = fx.run_construct(fx.ConstructConfig(subjects=n, relations=r), out / "facts_construct", device=device, seed=seed)
    logger.info("facts: memorisation threshold d* against R ln N")
    cap = fx.run_facts_capacity(
        fx.FactsCapacityConfig(subjects=list(sz.capacity_subjects), relations=list(sz.capacity_relations),
                               grid=[1, 2, 3, 4, 6, 8, 12, 16], mlp_width=64,
                               train=FactsTrain(lr=3e-2, schedule="warmup-cosine", steps=sz.capacity_steps,
                                                eval_every=25)),
        out / "facts_capacity", device=device, seed=seed)
    logger.info("facts: MLP width needed with frozen vs trainable embeddings")
    frozen = fx.run_facts_capacity(
        fx.FactsCapacityConfig(subjects=[64], relations=[2, 4], embeddings=["trainable", "frozen"], search="mlp-width",
                               d=16, grid=[2, 4, 8, 16, 32, 64, 128],
                               train=FactsTrain(lr=3e-2, schedule="warmup-cosine", steps=800, eval_every=25)),
        out / "facts_frozen", device=device, seed=seed)
    sec = layout.facts_section(out, tr, co, cap, frozen, n, r)
    return Part([sec], [claims.claim_dstar(cap["summary"], fast=sz.fast, section=sec.anchor),
                        claims.claim_frozen(frozen["summary"], sec.anchor),
                        claims.claim_construction(co, n, r, sec.anchor),
                        claims.claim_multihop_not_run()])
