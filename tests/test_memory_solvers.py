import numpy as np
import pytest
import torch

from mechfact.memory import solvers, theory
from mechfact.memory.problems import MemoryProblem, accuracy, p_for_alpha


def test_hebb_is_sum_of_outer_products():
    pr = MemoryProblem("original", 6, 20, 0)
    W = solvers.hebb(pr)
    E, U = pr.inputs(), pr.outputs()
    ref = sum(torch.outer(U[m], E[m]) for m in range(20))
    assert torch.allclose(W, ref, atol=1e-5)


def test_hebb_rank_truncation():
    pr = MemoryProblem("original", 12, 60, 0)
    W = solvers.hebb(pr, kappa=0.25)
    s = torch.linalg.svdvals(W.double())
    assert (s > 1e-5 * s[0]).sum().item() == 3


def test_trained_reaches_perfect_recall_where_hebb_fails():
    d = 24
    pr = MemoryProblem("original", d, p_for_alpha(0.5, d), 0)  # alpha = 1/2: far above Hebb's 1/8
    out = solvers.train([pr])
    assert out.accuracy[0] == 1.0
    assert accuracy(pr, solvers.hebb(pr)) < 0.95


def test_batched_training_handles_different_p_and_kinds():
    prs = [MemoryProblem("decoupled", 10, p, s) for s, p in [(0, 15), (1, 25)]]
    out = solvers.train(prs)
    assert len(out.W) == 2 and all(a == 1.0 for a in out.accuracy)
    with pytest.raises(ValueError, match="one kind and one d"):
        solvers.train([MemoryProblem("original", 10, 20, 0), MemoryProblem("decoupled", 10, 20, 0)])


def test_training_is_deterministic():
    prs = [MemoryProblem("original", 12, 30, s) for s in range(2)]
    a, b = solvers.train(prs), solvers.train(prs)
    assert all(torch.equal(x, y) for x, y in zip(a.W, b.W))


def test_rank_constrained_training_has_rank_m():
    pr = MemoryProblem("original", 16, 30, 0)
    out = solvers.train([pr], kappa=0.5)
    s = torch.linalg.svdvals(out.W[0].double())
    assert (s > 1e-6 * s[0]).sum().item() == 8


def test_separable_certificates():
    d = 8
    easy = MemoryProblem("original", d, 10, 0)
    res = solvers.separable(easy)
    assert res.separable and accuracy(easy, res.W) == 1.0  # the returned W is the certificate
    hard = MemoryProblem("original", d, p_for_alpha(2.5, d), 0)  # far above any capacity
    res = solvers.separable(hard)
    assert not res.separable and res.t_star <= 1e-7


@pytest.mark.parametrize("kind", ["original", "decoupled"])
def test_separable_never_below_trained(kind):
    d = 10
    outcomes = []
    for p in (25, 45, 60):
        pr = MemoryProblem(kind, d, p, 1)
        tr = solvers.train([pr], cfg=solvers.MemoryTrainConfig(steps=2000, patience=500))
        sep = solvers.separable(pr, tr.W[0])
        outcomes.append((tr.accuracy[0] == 1.0, sep.separable))
        if tr.accuracy[0] == 1.0:
            assert sep.separable
        if sep.separable and sep.W is not None:
            assert accuracy(pr, sep.W) == 1.0
    assert outcomes[0] == (True, True)  # an easy load: both succeed
    assert outcomes[-1][1] is False  # alpha ~ 2.5: not separable at all


def test_kappa_checked():
    with pytest.raises(ValueError, match=r"kappa=1.5: must lie in \(0, 1\]"):
        solvers.rank_of(8, 1.5)


def test_theory_numbers():
    # E[max of n Gaussians] is below sqrt(2 ln n) at finite n (classic values)
    assert theory.expected_max_gaussian(2) == pytest.approx(1 / np.sqrt(np.pi), rel=1e-6)
    assert theory.expected_max_gaussian(100) == pytest.approx(2.5076, abs=1e-3)
    assert theory.expected_max_gaussian(1000) < theory.evt_sqrt(1000)
    assert theory.quarter_circle_cdf(np.array([2.0]))[0] == pytest.approx(1.0)
    for k in (0.25, 0.5, 0.75):
        assert theory.alpha_c_rank_dof(k) < theory.alpha_c_rank_energy(k) < 0.5
    assert theory.alpha_c_rank_energy(1.0) == 0.5 == theory.alpha_c_rank_dof(1.0)


@pytest.mark.parametrize("kind", ["original", "decoupled"])
def test_active_set_training_reaches_perfect_recall_with_exact_check(kind):
    prs = [MemoryProblem(kind, 16, p, s) for s, p in [(0, 40), (1, 30)]]
    out = solvers.train(prs, cfg=solvers.MemoryTrainConfig(active_set=8, refresh=5, steps=1500))
    assert out.accuracy == [1.0, 1.0]  # re-checked on all competitors in float64
    assert all(st % 5 == 0 for st in out.steps)  # success is only declared at exact checks
