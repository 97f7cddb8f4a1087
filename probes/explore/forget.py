"""Exploration: active forgetting -- reset the subject embeddings every K steps so the body
must decode whatever embeddings GD writes. usage: forget.py N d m K cycles l2 [wu=fixed]
(its own Adam loop around mechfact.facts.train.loss_fn: the resets need the optimiser state of W_E_ent dropped)"""
import json, sys, time
import torch
torch.set_num_threads(1); torch.set_flush_denormal(True)
from mechfact.facts import FactModel, FactModelConfig, FactWorld, evaluate
from mechfact.facts.train import loss_fn
from mechfact.probes.experiments import superposition
from mechfact.targets import freeze_and_swap
N, d, m, K, cycles = map(int, sys.argv[1:6]); l2 = float(sys.argv[6]); opts = sys.argv[7:]
R = 4
t = time.time()
world = FactWorld(N, R, seed=0); q = world.single_hop()
model = FactModel(FactModelConfig(N, R, d=d, mlp_width=m, seed=0))
if "wu=fixed" in opts:
    model.W_U_ent.requires_grad_(False)
g = torch.Generator().manual_seed(123)
params = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.Adam(params, lr=1e-2)
log = []
def step():
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model, q.tokens, q.targets)
    if l2: loss = loss + 0.5 * l2 * sum((p * p).sum() for p in params)
    loss.backward(); opt.step()
for c in range(cycles):
    with torch.no_grad():
        model.W_E_ent.copy_(torch.randn(N, d, generator=g) * d**-0.5)
    opt.state.pop(model.W_E_ent, None)
    last = c == cycles - 1
    for s in range(K if not last else 4 * K):
        step()
    acc = evaluate(model, world)["accuracy"]; log.append(acc)
    print("cycle", c, round(acc, 4), flush=True)
# final: keep training (no reset) until 100% or 2000 steps
s = 0
while acc < 1.0 and s < 2000:
    for _ in range(50): step()
    s += 50; acc = evaluate(model, world)["accuracy"]
sp = superposition(model, world)
sw = freeze_and_swap(model, world, sfit=sp.fit)  # retrained: Adam lr 1e-2, 300 full-batch steps
print(json.dumps({"N": N, "d": d, "m": m, "K": K, "cycles": cycles, "l2": l2, "opts": opts, "cycle_acc": log, "extra_steps": s,
    "train_acc": acc, "r2_train": sp.r2_train, "r2_heldout": sp.r2_heldout, "ctrl": sp.control_r2_heldout,
    "coadapt": sp.attribute_coadaptation_r2, "zero_shot": sw.zero_shot_accuracy, "zs_ctrl": sw.zero_shot_control_accuracy,
    "recon": sw.reconstructed_accuracy, "retrained": sw.retrained_accuracy, "relearn": sw.control_relearn_accuracy,
    "s": round(time.time() - t)}), flush=True)
