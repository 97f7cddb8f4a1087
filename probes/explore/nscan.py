"""Exploration (issue 4): does zero-shot freeze-and-swap rise with N/d?  usage: nscan.py REGIME N [N ...]"""
import json, sys, time
import torch
from mechfact.facts import FactWorld, evaluate
from mechfact.probes.experiments import superposition_of
from mechfact.probes.fit import FitConfig, train_fact_model
from mechfact.probes.regimes import REGIMES, Regime
from mechfact.probes.swap import freeze_and_swap
torch.set_num_threads(1); torch.set_flush_denormal(True)
extra = {
  "l2-m256": Regime(64, 256, FitConfig(lr=1e-2, steps=4000, l2=1e-3, eval_every=500)),
  "l2-fixedU": Regime(64, 64, FitConfig(lr=1e-2, steps=4000, l2=1e-3, eval_every=500), ("W_U_ent",)),
  "l2-d32": Regime(32, 64, FitConfig(lr=1e-2, steps=4000, l2=1e-3, eval_every=500)),
}
reg_name = sys.argv[1]; reg = {**REGIMES, **extra}[reg_name]
R = int(dict(a.split("=") for a in sys.argv[2:] if "=" in a).get("R", 4))
for N in [int(a) for a in sys.argv[2:] if "=" not in a]:
    t = time.time()
    world = FactWorld(N, R, seed=0)
    model = reg.build(N, R, seed=0)
    hist = train_fact_model(model, world, reg.fit, freeze=reg.freeze, l2_only=reg.l2_only)
    acc = evaluate(model, world)["accuracy"]
    sp = superposition_of(model, world)
    sw = freeze_and_swap(model, world, sfit=sp.fit, retrain=FitConfig(lr=1e-2, steps=300, eval_every=50))
    print(json.dumps({"regime": reg_name, "N": N, "R": R, "train_acc": acc, "r2_train": sp.r2_train, "r2_heldout": sp.r2_heldout,
        "ctrl": sp.control_r2_heldout, "coadapt": sp.attribute_coadaptation_r2, "zero_shot": sw.zero_shot_accuracy,
        "zs_ctrl": sw.zero_shot_control_accuracy, "recon": sw.reconstructed_accuracy, "retrained": sw.retrained_accuracy,
        "relearn": sw.control_relearn_accuracy, "s": round(time.time() - t)}), flush=True)
