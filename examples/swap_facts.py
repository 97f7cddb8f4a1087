"""Swap in new facts zero-shot: write new subject embeddings, keep the network frozen.

    python examples/swap_facts.py

Geometric memorisation says a subject's embedding is c + sum_r v_{pi_r(s)} M_r:
a superposition of its attribute vectors (the unembedding columns v_e). Fit the
maps M_r by regression on the model's own embeddings, draw NEW random
bijections pi'_r, BUILD embeddings for them from the maps, and the frozen
attention + MLP answer the new facts with no training. Then retrain only the
embeddings (everything else frozen) and compare with relearning the original
facts the same way. A few seconds on a laptop CPU.
"""

import torch

import mechfact

torch.set_num_threads(1)
world = mechfact.FactWorld(256, 4, seed=0)
model, _ = mechfact.construct(world, d=4 * 24 + 4)  # or: mechfact.facts.runio.load_fact_run("runs/my_model")
retrain = mechfact.TrainConfig(lr=3e-2, steps=30, eval_every=10, target_accuracy=None)
res = mechfact.freeze_and_swap(model, world, new_seed=1, retrain=retrain)
print(f"original facts accuracy      {res.original_accuracy:.3f}")
print(f"new facts, zero-shot         {res.zero_shot_accuracy:.3f}   (embeddings built for another world: "
      f"{res.zero_shot_control_accuracy:.3f}, chance {res.chance:.4f})")
print(f"new facts, retrained         {res.retrained_accuracy:.3f}   after {res.retrain['steps']} steps, only embeddings")
print(f"original facts, relearned    {res.control_relearn_accuracy:.3f}   (control, same budget)")
