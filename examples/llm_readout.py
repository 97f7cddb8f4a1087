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

import numpy as np  # noqa: E402
import torch  # noqa: E402

from mechfact.llm.loading import load_model  # noqa: E402
from mechfact.llm.lre import LreConfig, evaluate_relation  # noqa: E402
from mechfact.llm.probe import relation_states  # noqa: E402
from mechfact.llm.relations import load_relations  # noqa: E402
from mechfact.probes.readout import linear_readout, split_indices  # noqa: E402

torch.set_num_threads(1)
lm = load_model()  # the embedded default model
rel = load_relations(names=["city_country"])[0]
layers = [0, 4, 8, 12, 16, 20, 24, 29]
rs = relation_states(lm, rel, layers=layers, site="resid_post", position="subject_last", k_shot=3, template=0,
                     seed=0, progress=False)
print(f"{rel.name}: {len(rel)} facts, {rs.known.sum()} known by {lm.name} (greedy next token = object)")
print("example prompt:\n" + rs.prompts[0].text)

classes = {o: i for i, o in enumerate(rel.object_set)}
y = np.array([classes[o] for o in rel.objects])
train, test = split_indices(len(y), heldout_fraction=0.25, seed=0)  # held-out cities
print(f"\n{'layer':>5} {'readout':>8} {'control':>8} {'chance':>7}")
for j, layer in enumerate(layers):
    s = linear_readout(rs.states[j], y, train, test, kind="classifier")
    print(f"{layer:>5} {s.accuracy:>8.2f} {s.control_accuracy:>8.2f} {s.chance:>7.2f}")

row = evaluate_relation(lm, rel, LreConfig(n_train=3, max_test=20), layer=15, seed=0, progress=False)
print(f"\nLRE at layer 15 from {row['n_train']} Jacobians: faithfulness {row['faithfulness']:.2f}, "
      f"causality {row['causality']:.2f} on {row['n_test']} held-out known facts")
