"""Exploration: pool world, superposition on one-hot attribute indicators (a free vector per (relation, attribute)).
usage: pool_onehot.py REGIME N A [d=, m=, steps=, init= (scale of the initial entity embeddings),
load= (a saved state dict instead of training)]. The first version's ``opt=sgd`` (and its ``lr=``) is gone:
the one FactModel trainer (mechfact.facts.train) has Adam only."""
import dataclasses, json, sys, time
import numpy as np
import torch
torch.set_num_threads(1); torch.set_flush_denormal(True)
from mechfact.facts import REGIMES, FactWorld, evaluate, train
from mechfact.probes.queries import ProbeSet, accuracy
from mechfact.probes.superposition import fit_superposition
from mechfact.probes.swap import attribute_vectors, embedding_hook, subject_embeddings
reg_name, N, A = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]); R = 4
kw = dict(a.split("=") for a in sys.argv[4:])
reg = REGIMES[reg_name]
if "steps" in kw: reg = dataclasses.replace(reg, train=dataclasses.replace(reg.train, steps=int(kw["steps"])))
if "d" in kw: reg = dataclasses.replace(reg, d=int(kw["d"]))
if "m" in kw: reg = dataclasses.replace(reg, mlp_width=int(kw["m"]))
t = time.time()
w0 = FactWorld(N, R, seed=0, attributes=A if A < N else None)
model = reg.build(N, R, seed=0)
if "init" in kw:
    with torch.no_grad(): model.W_E_ent.mul_(float(kw["init"]))
if "load" in kw:
    model.load_state_dict(torch.load(kw["load"]))
else:
    train(model, w0, reg.train)
model.eval()
acc = evaluate(model, w0)["accuracy"]
X = subject_embeddings(model, N)
rng = np.random.default_rng(0); idx = rng.permutation(N); tr, te = idx[: int(.8 * N)], idx[int(.8 * N):]
w1, w2 = FactWorld(N, R, seed=1, attributes=A), FactWorld(N, R, seed=2, attributes=A)
ps1, ps0 = ProbeSet.from_world(w1), ProbeSet.from_world(w0)
out = {"regime": reg_name, "N": N, "A": A, "kw": kw, "train_acc": acc}
for name, V in (("W_U", attribute_vectors(model, N)), ("onehot", torch.eye(N)[:, :A])):
    f = fit_superposition(X, V, w0.perms, tr)
    pred = f.build(V, w0.perms)
    r2 = lambda s: float(1 - ((X[s] - pred[s]) ** 2).sum() / ((X[s] - X[s].mean(0)) ** 2).sum())
    out[name] = {"r2_train": round(r2(tr), 3), "r2_heldout": round(r2(te), 3),
                 "zero_shot": accuracy(model, ps1, [embedding_hook(f.build(V, w1.perms), ps1)]),
                 "zs_ctrl": accuracy(model, ps1, [embedding_hook(f.build(V, w2.perms), ps1)]),
                 "recon": accuracy(model, ps0, [embedding_hook(f.build(V, w0.perms), ps0)])}
out["s"] = round(time.time() - t)
print(json.dumps(out), flush=True)
