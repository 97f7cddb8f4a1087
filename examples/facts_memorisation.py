"""Store N*R facts in a one-layer transformer: trained embeddings vs frozen ones vs the explicit construction.

    python examples/facts_memorisation.py        # about a minute on a laptop CPU

A world of N=128 entities and R=4 relations (each a random bijection) has 512
facts (s, r) -> pi_r(s). With trainable embeddings a width d=8 model learns
them all; with the entity embeddings AND unembedding frozen at random (the
older associative-memory regime) the same small model cannot; the explicit
construction reaches 99% with d = R (b + 1), b = O(log N), without training.
"""

import torch

import mechfact

torch.set_num_threads(2)
world = mechfact.FactWorld(n_entities=128, n_relations=4, seed=0)
print(f"{world.n_facts} facts: N={world.n_entities} entities, R={world.n_relations} relations")

opt = mechfact.TrainConfig(lr=3e-2, schedule="warmup-cosine", steps=600, target_accuracy=0.99, eval_every=25)
for emb in ("trainable", "frozen"):
    model = mechfact.build_fact_model(world, d=8, mlp_width=16, embeddings=emb, seed=0)
    res = mechfact.train(model, world, opt)
    print(f"{emb:>9} embeddings, d=8, MLP width 16: accuracy {res['accuracy']:.3f} after {res['steps']} steps")

model, info = mechfact.construct(world, target_accuracy=0.99)  # the smallest block size reaching 99%
print(f"construction: block size b={info['block_size']}, d={model.cfg.d}, MLP width {model.cfg.mlp_width}: "
      f"accuracy {info['accuracy']:.3f} (no training)")
