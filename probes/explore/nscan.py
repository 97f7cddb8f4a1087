"""Exploration: does zero-shot freeze-and-swap rise with N/d?  usage: nscan.py REGIME N [N ...] [R=4]"""
import json, sys, time
import torch
from mechfact.facts import REGIMES, FactWorld, Regime, TrainConfig, evaluate
from mechfact.probes.experiments import superposition
from mechfact.targets import freeze_and_swap
torch.set_num_threads(1); torch.set_flush_denormal(True)
L2 = dict(lr=1e-2, steps=4000, l2=1e-3, eval_every=500, target_accuracy=None)
extra = {
  "l2-m256": Regime(64, 256, TrainConfig(**L2)),
  "l2-fixedU": Regime(64, 64, TrainConfig(**L2, freeze=["W_U_ent"])),
  "l2-d32": Regime(32, 64, TrainConfig(**L2)),
}
reg_name = sys.argv[1]; reg = {**REGIMES, **extra}[reg_name]
R = int(dict(a.split("=") for a in sys.argv[2:] if "=" in a).get("R", 4))
for N in [int(a) for a in sys.argv[2:] if "=" not in a]:
    t = time.time()
    world = FactWorld(N, R, seed=0)
    model, _ = reg.fit(world, seed=0)
    acc = evaluate(model, world)["accuracy"]
    sp = superposition(model, world)
    sw = freeze_and_swap(model, world, sfit=sp.fit)  # retrained: Adam lr 1e-2, 300 full-batch steps
    print(json.dumps({"regime": reg_name, "N": N, "R": R, "train_acc": acc, "r2_train": sp.r2_train, "r2_heldout": sp.r2_heldout,
        "ctrl": sp.control_r2_heldout, "coadapt": sp.attribute_coadaptation_r2, "zero_shot": sw.zero_shot_accuracy,
        "zs_ctrl": sw.zero_shot_control_accuracy, "recon": sw.reconstructed_accuracy, "retrained": sw.retrained_accuracy,
        "relearn": sw.control_relearn_accuracy, "s": round(time.time() - t)}), flush=True)
