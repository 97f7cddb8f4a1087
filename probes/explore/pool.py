"""Exploration: attributes from a SHARED POOL of A < N entities (random functions, not bijections):
each attribute co-occurs with many others, so the co-occurrence structure a bijection world offers cannot be
exploited. usage: pool.py REGIME N A [steps=, l2=, d=, m=]"""
import dataclasses, json, sys, time
import numpy as np
import torch
torch.set_num_threads(1); torch.set_flush_denormal(True)
from torch.func import jacrev, vmap
from mechfact.facts import REGIMES, FactWorld, evaluate
from mechfact.probes.queries import ProbeSet, accuracy
from mechfact.probes.superposition import fit_superposition
from mechfact.probes.swap import attribute_vectors, embedding_hook, subject_embeddings
from mechfact.targets import retrain_embeddings
reg_name, N, A = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]); R = 4
kw = dict(a.split("=") for a in sys.argv[4:])
def world(seed):
    w = FactWorld(N, R, seed=seed)
    g = torch.Generator().manual_seed(1000 + seed)
    w.perms = torch.randint(A, (R, N), generator=g) if A < N else w.perms
    return w
t = time.time()
w0 = world(0); reg = REGIMES[reg_name]
if "steps" in kw: reg = dataclasses.replace(reg, train=dataclasses.replace(reg.train, steps=int(kw["steps"])))
if "l2" in kw: reg = dataclasses.replace(reg, train=dataclasses.replace(reg.train, l2=float(kw["l2"])))
if "d" in kw: reg = dataclasses.replace(reg, d=int(kw["d"]))
if "m" in kw: reg = dataclasses.replace(reg, mlp_width=int(kw["m"]))
model, res = reg.fit(w0, seed=0)
acc = evaluate(model, w0)["accuracy"]
X, V = subject_embeddings(model, N), attribute_vectors(model, N)
rng = np.random.default_rng(0); idx = rng.permutation(N); tr, te = idx[: int(.8 * N)], idx[int(.8 * N):]
sfit = fit_superposition(X, V, w0.perms, tr)
def r2(s):
    pred = sfit.build(V, w0.perms)[s]
    return float(1 - ((X[s] - pred) ** 2).sum() / ((X[s] - X[s].mean(0)) ** 2).sum())
w1, w2 = world(1), world(2)
ps1, ps0 = ProbeSet.from_world(w1), ProbeSet.from_world(w0)
zs = accuracy(model, ps1, [embedding_hook(sfit.build(V, w1.perms), ps1)])
ctrl = accuracy(model, ps1, [embedding_hook(sfit.build(V, w2.perms), ps1)])
recon = accuracy(model, ps0, [embedding_hook(sfit.build(V, w0.perms), ps0)])
# Jacobian maps (see jacswap.py): x' = c + sum_r alpha_r (J_r^T v_{pi'_r(s)} - mean)
E = model.W_E.detach()
def jmaps():
    out = []
    for r in range(R):
        h = lambda x: model.ln_final(model.blocks[0](torch.stack([x, E[N + r]])[None]))[0, -1]
        out.append(vmap(jacrev(h))(X).mean(0))
    return torch.stack(out)
with torch.no_grad():
    J = jmaps(); U = torch.einsum("ad,rde->rae", V, J); U = U - U.mean(1, keepdim=True)
    c = X[tr].mean(0)
    F_ = lambda P: torch.stack([U[r, P[r]] for r in range(R)], -1)
    alpha = torch.linalg.lstsq(F_(w0.perms)[tr].reshape(-1, R).double(), (X[tr] - c).reshape(-1, 1).double()).solution[:, 0].float()
    jb = lambda P: c + (F_(P) * alpha).sum(-1)
    jr2 = float(1 - ((X[te] - jb(w0.perms)[te]) ** 2).sum() / ((X[te] - X[te].mean(0)) ** 2).sum())
    jzs = accuracy(model, ps1, [embedding_hook(jb(w1.perms), ps1)])
    jrecon = accuracy(model, ps0, [embedding_hook(jb(w0.perms), ps0)])
    jctrl = accuracy(model, ps1, [embedding_hook(jb(w2.perms), ps1)])
init = torch.randn(N, X.shape[1], generator=torch.Generator().manual_seed(0)) * float(X.pow(2).mean().sqrt())
rt = retrain_embeddings(model, w1, init)[-1]["accuracy"]  # Adam lr 1e-2, 300 full-batch steps, all else frozen
rl = retrain_embeddings(model, w0, init)[-1]["accuracy"]
print(json.dumps({"regime": reg_name, "N": N, "A": A, "train_acc": acc, "steps": res["steps"], "r2_train": r2(tr),
    "r2_heldout": r2(te), "zero_shot": zs, "zs_ctrl": ctrl, "recon": recon, "jac_r2_heldout": jr2, "jac_zero_shot": jzs, "jac_recon": jrecon, "jac_ctrl": jctrl, "kw": kw, "retrained": rt, "relearn": rl,
    "s": round(time.time() - t)}), flush=True)
