"""Where does a pretrained model hold "which country is this city in"?

Loads the embedded SmolLM2-135M-Instruct (no download), builds 3-shot prompts
for the city -> country relation, takes the subject's last-token residual
stream at a few layers, and fits the same linear readout mechfact uses on its
synthetic models, scored on held-out cities against chance and a shuffled
control. Then an LRE at one layer: faithfulness and causality. About a
minute on a laptop CPU (the first run also converts the model, ~20 s).

    python examples/llm_readout.py
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import mechfact  # noqa: E402

torch.set_num_threads(1)
lm = mechfact.load_model()  # the embedded default model
rel = mechfact.load_relations(names=["city_country"])[0]
layers = [0, 4, 8, 12, 16, 20, 24, 29]
res = mechfact.layer_readout(lm, rel, layers, k_shot=3, n_splits=1)  # held-out cities, one split
facts = res.relations[0]
print(f"{rel.name}: {facts['n_samples']} facts, {facts['n_known']} known by {lm.name} (greedy next token = object)")

print(f"\n{'layer':>5} {'readout':>8} {'control':>8} {'chance':>7}")
for row in res.records:
    print(f"{row['layer']:>5} {row['accuracy']:>8.2f} {row['control_accuracy']:>8.2f} {row['chance']:>7.2f}")

lre = mechfact.lre(lm, rel, layer=15, n_train=3, max_test=20, n_trials=1, ranks=[64])  # one trial, one edit rank
print(f"\nLRE at layer 15 from {lre.n_train} Jacobians: faithfulness {lre.faithfulness:.2f}, "
      f"causality {lre.causality:.2f} on {lre.n_test} held-out known facts")
