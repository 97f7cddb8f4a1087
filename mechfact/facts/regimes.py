"""Named training regimes of the one-layer fact model, for the probes' "both sides" comparison.

A regime is the model shape plus how it is trained: a
:class:`~mechfact.facts.train.TrainConfig` for :func:`~mechfact.facts.train.train`,
the one FactModel trainer (its ``freeze`` names tensors kept at their random
initialisation, ``l2_only`` where the coupled L2 applies). The numbers behind
each choice are in docs/results_probes.md (``python -m synthetic.regime_study``
reproduces them).

* ``plain``          -- the first independent attempt's setting: d = 64, m = 64,
  Adam lr 1e-2, no regularisation, stopped at 100% train accuracy.
* ``plain-wide``     -- the same at d = 128, m = 256 (above the construction's
  d = R b + R = 128 for N = 512, b = 31).
* ``plain-xwide``    -- the same at d = 256, m = 512 (the best zero-shot transfer found, on
  attribute-pool worlds: ``--attributes``).
* ``l2``             -- d = 64, m = 64, coupled L2 (1e-3) on every trained
  tensor, 4000 full-batch steps (far past 100%): the regime in which the
  embeddings become superpositions (held-out R^2 0.94).
* ``l2-wide``        -- the same at d = 128, m = 256.
* ``emb-l2-wide``    -- L2 on the entity tables only (embedding, unembedding).
* ``tied-l2-wide``   -- ``l2-wide`` with the unembedding tied to the embedding.
* ``l2-wide-fixedU`` -- ``l2-wide`` with the unembedding kept at its random init.
* ``geometric``      -- d = 128, m = 256, squared-error loss on the logits (target 1 on the
  answer, 0 elsewhere) plus coupled L2 1e-3, subject embeddings initialised at 0,
  3000 full-batch steps: in attribute-pool worlds (``--attributes``) the embeddings
  become superpositions (held-out R^2 0.96) and the frozen network takes new facts
  zero-shot (0.99 at N = 256, A = 16); it fails in bijection worlds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from .model import FactModel, FactModelConfig
from .train import TrainConfig, train
from .world import FactWorld


@dataclass
class Regime:
    d: int = 64
    mlp_width: int = 64
    train: TrainConfig = field(default_factory=TrainConfig)
    model: dict = field(default_factory=dict)  # extra FactModelConfig fields (attention, tied, entity_init, ...)

    def build(self, n_entities: int, n_relations: int, seed: int = 0) -> FactModel:
        """A fresh model of this regime's shape, initialised from ``seed``."""
        return FactModel(FactModelConfig(n_entities, n_relations, d=self.d, mlp_width=self.mlp_width, seed=seed,
                                         **self.model))

    def fit(self, world: FactWorld, *, seed: int = 0, device: str | torch.device = "cpu",
            progress: bool = False) -> tuple[FactModel, dict]:
        """``(model, train result)``: a model built with init seed ``seed`` and trained on every fact of ``world``."""
        model = self.build(world.n_entities, world.n_relations, seed=seed)
        res = train(model, world, self.train, device=device, progress=progress)
        return model.eval(), res

    def to_dict(self) -> dict:
        return asdict(self)


def _plain(d: int, m: int) -> Regime:
    return Regime(d, m, TrainConfig(lr=1e-2, steps=3000, target_accuracy=1.0, eval_every=25))


def _l2(d: int, m: int, **train) -> Regime:
    return Regime(d, m, TrainConfig(lr=1e-2, steps=4000, l2=1e-3, target_accuracy=None, eval_every=500, **train))


REGIMES: dict[str, Regime] = {
    "plain": _plain(64, 64),
    "plain-wide": _plain(128, 256),
    "plain-xwide": _plain(256, 512),
    "l2": _l2(64, 64),
    "l2-wide": _l2(128, 256),
    "emb-l2-wide": _l2(128, 256, l2_only=["W_E_ent", "W_U_ent"]),
    "emb-l2-wide-fixedU": _l2(128, 256, freeze=["W_U_ent"], l2_only=["W_E_ent"]),
    "tied-l2-wide": Regime(128, 256, _l2(128, 256).train, model={"tied": True}),
    "geometric": Regime(128, 256, TrainConfig(lr=1e-2, steps=3000, l2=1e-3, loss="mse", target_accuracy=None,
                                              eval_every=500), model={"entity_init": "zero"}),
    "l2-wide-fixedU": _l2(128, 256, freeze=["W_U_ent"]),
}
