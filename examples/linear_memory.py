"""Store p facts in a d x d linear memory: Hebb vs gradient descent vs the exact LP.

    python examples/linear_memory.py            # about 20 s on a laptop CPU

Shows the three solvers on one instance just above Hebb's reach, then where
the trained memory puts its target scores (in units of each input's competitor
std) compared with the extreme value of the competitors.
"""

import torch

from mechfact.memory import analysis, solvers
from mechfact.memory.problems import MemoryProblem, p_for_alpha

torch.set_num_threads(2)
d = 24
p = p_for_alpha(0.6, d)  # load alpha = p ln p / d^2 = 0.6: above 1/2, below the finite-size capacity
problem = MemoryProblem("original", d=d, p=p, seed=0)
print(f"d={d}, p={p}, alpha={problem.alpha:.3f}")

W_hebb = solvers.hebb(problem)
W_trained = solvers.train([problem]).W[0]
exact = solvers.separable(problem, W_trained)
print(f"Hebb accuracy     {analysis.accuracy(problem, W_hebb):.3f}")
print(f"trained accuracy  {analysis.accuracy(problem, W_trained):.3f}")
print(f"exact LP: perfect recall achievable = {exact.separable}")

for name, W in (("hebb", W_hebb), ("trained", W_trained)):
    s, _ = analysis.score_summary(problem, W)
    print(f"{name:8s} target z = {s['z_target_mean']:.2f} +/- {s['z_target_std']:.2f}, "
          f"max competitor z = {s['z_max_competitor_mean']:.2f}, min margin = {s['z_margin_min']:.2f} "
          f"(sqrt(2 ln p) = {s['evt_sqrt_2lnp']:.2f}, E max of p Gaussians = {s['expected_max_gaussian']:.2f})")
