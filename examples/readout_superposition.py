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

import mechfact
from mechfact import hooks

torch.set_num_threads(1)
world = mechfact.FactWorld(256, 4, seed=0)
model, _ = mechfact.construct(world, d=4 * 24 + 4)  # block size 24
res = mechfact.readout(model, world, [mechfact.Site(hooks.embed(), "subject"), mechfact.Site(hooks.resid(0), "last")])
for row in res.per_relation:
    print(f"readout relation {row['relation']} {row['site']:32s} accuracy {row['accuracy']:.3f}  "
          f"control {row['control_accuracy']:.3f}  chance {row['chance']:.4f}")
sp = mechfact.superposition(model, world)
print(f"superposition R^2 train {sp.r2_train:.3f}  held-out {sp.r2_heldout:.3f}  control {sp.control_r2_heldout:.3f}")
