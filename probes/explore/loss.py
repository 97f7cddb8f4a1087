"""Exploration: does a loss with a finite minimiser (squared error on the logits, ``loss=mse``) make
trained subject embeddings additive in their attributes, and the frozen network zero-shot transferable?
usage: loss.py REGIME N A [key=value ...]   (A = N: bijections; keys: loss, target, d, m, steps, lr, l2,
tacc (target accuracy or 'none'), l2only (comma-separated parameter names), zinit (1: subject embeddings initialised at 0), seed (world and init))"""
import dataclasses, json, sys, time
import numpy as np
import torch
torch.set_num_threads(1); torch.set_flush_denormal(True)
from mechfact.facts import REGIMES, FactWorld, evaluate, train
from mechfact.probes.queries import ProbeSet, accuracy
from mechfact.probes.superposition import fit_superposition
from mechfact.probes.swap import attribute_vectors, embedding_hook, subject_embeddings
from mechfact.targets import retrain_embeddings

reg_name, N, A = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]); R = 4
kw = dict(a.split("=") for a in sys.argv[4:])
att = A if A < N else None
t = time.time()
ws = int(kw.get("seed", 0))  # world AND init seed; the new worlds are ws + 1 and ws + 2
w0 = FactWorld(N, R, seed=ws, attributes=att)
reg = REGIMES[reg_name]
cfg = reg.train
for k, f, conv in (("steps", "steps", int), ("l2", "l2", float), ("lr", "lr", float), ("loss", "loss", str),
                   ("target", "target_logit", float)):
    if k in kw:
        cfg = dataclasses.replace(cfg, **{f: conv(kw[k])})
if "tacc" in kw:
    cfg = dataclasses.replace(cfg, target_accuracy=None if kw["tacc"] == "none" else float(kw["tacc"]))
if "l2only" in kw:
    cfg = dataclasses.replace(cfg, l2_only=kw["l2only"].split(","))
reg = dataclasses.replace(reg, train=cfg, d=int(kw.get("d", reg.d)), mlp_width=int(kw.get("m", reg.mlp_width)))
model = reg.build(N, R, seed=ws)
if kw.get("zinit") == "1":
    with torch.no_grad():
        model.W_E_ent.zero_()
res = train(model, w0, reg.train)
model.eval()
acc = evaluate(model, w0)["accuracy"]
X, V = subject_embeddings(model, N), attribute_vectors(model, N)
rng = np.random.default_rng(0); idx = rng.permutation(N); tr, te = idx[: int(.8 * N)], idx[int(.8 * N):]
sfit = fit_superposition(X, V, w0.perms, tr)
def r2(s):
    pred = sfit.build(V, w0.perms)[s]
    return float(1 - ((X[s] - pred) ** 2).sum() / ((X[s] - X[s].mean(0)) ** 2).sum())
w1, w2 = FactWorld(N, R, seed=ws + 1, attributes=att), FactWorld(N, R, seed=ws + 2, attributes=att)
ps1, ps0 = ProbeSet.from_world(w1), ProbeSet.from_world(w0)
zs = accuracy(model, ps1, [embedding_hook(sfit.build(V, w1.perms), ps1)])
ctrl = accuracy(model, ps1, [embedding_hook(sfit.build(V, w2.perms), ps1)])
recon = accuracy(model, ps0, [embedding_hook(sfit.build(V, w0.perms), ps0)])
init = torch.randn(N, X.shape[1], generator=torch.Generator().manual_seed(0)) * float(X.pow(2).mean().sqrt())
rt = retrain_embeddings(model, w1, init)[-1]["accuracy"]  # Adam lr 1e-2, 300 full-batch steps, all else frozen
rl = retrain_embeddings(model, w0, init)[-1]["accuracy"]
print(json.dumps({"regime": reg_name, "N": N, "A": A, "kw": kw, "train_acc": acc, "steps": res["steps"],
                  "loss": res["loss"], "r2_train": r2(tr), "r2_heldout": r2(te), "zero_shot": zs,
                  "zs_ctrl": ctrl, "recon": recon, "retrained": rt, "relearn": rl, "s": round(time.time() - t)}),
      flush=True)
