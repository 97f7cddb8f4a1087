import math

import pytest
import torch

from mechfact.memory.problems import COMP_BLOCK, MemoryProblem, load, p_for_alpha, scores


def test_load_and_inverse():
    assert load(100, 10) == pytest.approx(100 * math.log(100) / 100)
    for d in (8, 32, 64):
        for a in (0.1, 0.5, 1.0):
            p = p_for_alpha(a, d)
            assert load(p, d) >= a > load(p - 1, d)


@pytest.mark.parametrize("kind", ["original", "decoupled"])
def test_nested_and_deterministic(kind):
    small, big = MemoryProblem(kind, 8, 70, 3), MemoryProblem(kind, 8, 150, 3)
    assert torch.equal(small.inputs(), big.inputs()[:70])
    assert torch.equal(small.outputs(), big.outputs()[:70])
    assert torch.equal(small.inputs(), MemoryProblem(kind, 8, 70, 3).inputs())
    assert not torch.equal(small.inputs(), MemoryProblem(kind, 8, 70, 4).inputs())
    if kind == "decoupled":
        assert torch.equal(small.competitors(0, 70), big.competitors(0, 70)[:, :69])


def test_embeddings_are_n0_i_over_d():
    pr = MemoryProblem("original", 64, 4000, 0)
    E = pr.inputs()
    assert E.pow(2).sum(1).mean().item() == pytest.approx(1.0, abs=0.02)  # unit norm on average
    assert E.mean().abs().item() < 0.01


def test_decoupled_competitors_regenerate_by_slice():
    pr = MemoryProblem("decoupled", 6, 300, 1)  # 299 competitors: spans two competitor blocks
    assert pr.p - 1 > COMP_BLOCK
    full = pr.competitors(0, 300)
    assert full.shape == (300, 299, 6)
    assert torch.equal(full[100:170], pr.competitors(100, 170))
    # private candidate sets: different inputs see different competitors
    assert not torch.allclose(full[0], full[1])


def test_scores_match_brute_force_original():
    pr = MemoryProblem("original", 5, 40, 0)
    W = torch.randn(5, 5)
    E, U = pr.inputs().double(), pr.outputs().double()
    S = E @ W.double().T @ U.T  # S[mu, rho] = u_rho^T W e_mu
    sc = scores(pr, W)
    off = S.clone()
    off.fill_diagonal_(-float("inf"))
    assert torch.allclose(sc.target, S.diagonal())
    assert torch.allclose(sc.comp_max, off.max(1).values)
    expected = (S.argmax(1) == torch.arange(40)).double().mean().item()
    assert sc.accuracy == pytest.approx(expected)


def test_scores_match_brute_force_decoupled():
    pr = MemoryProblem("decoupled", 5, 30, 2)
    W = torch.randn(5, 5)
    V = pr.inputs().double() @ W.double().T
    C = pr.competitors(0, 30).double()
    comp = torch.einsum("pkd,pd->pk", C, V)
    sc = scores(pr, W)
    assert torch.allclose(sc.comp_max, comp.max(1).values)
    assert torch.allclose(sc.target, (pr.outputs().double() * V).sum(1))


def test_bad_problem_arguments():
    with pytest.raises(ValueError, match="allowed values are original, decoupled"):
        MemoryProblem("shared", 4, 10, 0)
    with pytest.raises(ValueError, match="d=0"):
        MemoryProblem("original", 0, 10, 0)


@pytest.mark.slow  # seconds of training: the slow tier keeps the fast one under 5 minutes
def test_decoupled_scores_never_hold_dense_candidates():
    """p = 4000, d = 32: dense candidates would take 2 GB; chunked scoring stays far below.

    Peak memory is the child's VmHWM (per address space, reset by exec); ru_maxrss would carry over the
    high-water mark of the forking pytest process, which is large once pretrained-model tests have run.
    """
    import subprocess
    import sys

    code = (
        "import torch\n"
        "torch.set_num_threads(1)\n"
        "from mechfact.memory.problems import MemoryProblem, scores\n"
        "from mechfact.memory.solvers import hebb\n"
        "pr = MemoryProblem('decoupled', 32, 4000, 0)\n"
        "acc = scores(pr, hebb(pr)).accuracy\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
        "print(int(hwm) / 1e6, pr.dense_bytes() / 1e9, acc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    peak_gb, dense_gb, acc = map(float, out.stdout.split())
    assert dense_gb > 2.0
    assert peak_gb < 0.9  # interpreter + torch + O(block) buffers
    assert 0.0 <= acc <= 1.0


def test_competitors_into_a_padded_batch_and_reused_for_scores():
    """competitors(out=...) writes the same values as competitors() straight into a slice of a padded batch;
    scores(competitors=...) reading them gives the regenerated result to the bit (training's float64 re-check)."""
    pr = MemoryProblem("decoupled", 6, 300, 1)  # two competitor blocks, five input blocks
    ref = pr.competitors(0, 300)
    batch = torch.zeros(2, 310, 309, 6)
    out = pr.competitors(0, 300, out=batch[1, :300, :299])
    assert out.data_ptr() == batch[1, :300, :299].data_ptr()
    assert torch.equal(batch[1, :300, :299], ref)
    assert batch[1, 300:].abs().sum() == 0 and batch[1, :, 299:].abs().sum() == 0 and batch[0].abs().sum() == 0
    assert torch.equal(pr.competitors(70, 130, out=torch.empty(60, 299, 6)), ref[70:130])
    with pytest.raises(ValueError, match="need a float32 tensor of shape"):
        pr.competitors(0, 300, out=torch.empty(300, 298, 6))
    W = torch.randn(6, 6)
    a, ca = scores(pr, W, keep_competitors=True)
    b, cb = scores(pr, W, keep_competitors=True, competitors=batch[1, :300, :299])
    assert torch.equal(ca, cb)
    for f in ("target", "comp_mean", "comp_std", "comp_max"):
        assert torch.equal(getattr(a, f), getattr(b, f))
    with pytest.raises(ValueError, match="need shape"):
        scores(pr, W, competitors=ref[:, :10])
