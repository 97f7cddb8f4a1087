"""Linear readouts and the superposition test on a fact model.

    python examples/readout_superposition.py

For each relation and hook site, a ridge readout maps the subject's
representation to the object's unembedding vector, decoded by the nearest
object, scored on HELD-OUT subjects (every object is unique, so a classifier
could never name a held-out subject's object). A shuffled-label control sits
beside every score. The superposition test regresses each subject embedding on
its R attribute vectors. A few seconds on a laptop CPU.
"""

import torch

from mechfact.facts import FactWorld, build_single_hop
from mechfact.probes.experiments import superposition_of
from mechfact.probes.queries import from_world
from mechfact.probes.readout import readout

torch.set_num_threads(1)
world = FactWorld(256, 4, seed=0)
model = build_single_hop(world, block_size=24)
res = readout(model, from_world(world), ["hook_embed@subject", "blocks.0.hook_resid_post@last"])
for row in res.per_relation:
    print(f"readout relation {row['relation']} {row['site']:32s} accuracy {row['accuracy']:.3f}  "
          f"control {row['control_accuracy']:.3f}  chance {row['chance']:.4f}")
sp = superposition_of(model, world)
print(f"superposition R^2 train {sp.r2_train:.3f}  held-out {sp.r2_heldout:.3f}  control {sp.control_r2_heldout:.3f}")
