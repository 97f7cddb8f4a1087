import math

import pytest
import torch

from mechfact.facts.evaluate import evaluate
from mechfact.facts.model import FactModel, FactModelConfig
from mechfact.facts.train import TrainConfig, train
from mechfact.facts.world import IGNORE, FactWorld


pytestmark = pytest.mark.usefixtures("one_thread")


def _fit(seed: int = 0):
    world = FactWorld(32, 2, seed=0)
    model = FactModel(FactModelConfig(32, 2, d=32, mlp_width=64, embeddings="trainable", seed=seed))
    res = train(model, world, TrainConfig(steps=500, target_accuracy=0.99, eval_every=10, seed=seed))
    return model, res


def test_tiny_world_is_memorised_and_deterministic():
    model, res = _fit()
    assert res["accuracy"] >= 0.99 and min(res["per_relation"]) >= 0.99
    assert res["steps"] < 500 and res["history"][-1]["accuracy"] >= 0.99
    again, res2 = _fit()
    assert res2["steps"] == res["steps"]
    for (k, v), v2 in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(v, v2), k


def test_minibatch_and_config_errors():
    world = FactWorld(8, 2, seed=0)
    model = FactModel(FactModelConfig(8, 2, d=8, mlp_width=16))
    res = train(model, world, TrainConfig(steps=3, batch_size=4, target_accuracy=None, eval_every=2))
    assert res["steps"] == 3 and [h["step"] for h in res["history"]] == [2, 3] and math.isfinite(res["loss"])
    for bad, match in (({"lr": 0}, "--lr 0: must be > 0"), ({"batch_size": 0}, "--batch-size 0"),
                       ({"target_accuracy": 1.5}, "--target-accuracy 1.5"), ({"loss": "hinge"}, "--loss hinge"),
                       ({"l2": -1.0}, "--l2 -1.0"), ({"target_logit": 0.0}, "--target-logit 0.0"),
                       ({"lr": float("nan")}, "--lr nan: must be a finite number"),
                       ({"l2": float("inf")}, "--l2 inf: must be a finite number")):
        with pytest.raises(ValueError, match=match):
            TrainConfig(**bad)
    with pytest.raises(ValueError, match="unknown TrainConfig keys"):
        TrainConfig.from_dict({"learning_rate": 1.0})


class _Oracle(torch.nn.Module):
    """Emits one-hot logits for given targets (IGNORE -> entity 0)."""

    def __init__(self, world, targets):
        super().__init__()
        self.cfg = FactModelConfig(world.n_entities, world.n_relations)
        self.targets = targets
        self.device = torch.device("cpu")

    def forward(self, tokens):
        return torch.nn.functional.one_hot(self.targets.clamp(min=0), self.cfg.n_entities).float()


def test_evaluate_scores_whole_chains():
    world = FactWorld(6, 2, seed=0)
    q = world.k_hop(3, cot=True)
    assert evaluate(_Oracle(world, q.targets), world, q)["accuracy"] == 1.0
    wrong = q.targets.clone()
    wrong[0, 4] = (wrong[0, 4] + 1) % 6  # one intermediate step wrong -> that chain fails
    res = evaluate(_Oracle(world, wrong), world, q, batch_size=len(q))
    assert res["accuracy"] == pytest.approx(1 - 1 / len(q))
    assert res["token_accuracy"] == pytest.approx(1 - 1 / (3 * len(q)))
    last = q.relations[0, -1].item()
    assert res["per_relation"][last] < 1.0 and res["per_relation"][1 - last] == 1.0
    assert (q.targets[:, :3] == IGNORE).all()


@pytest.mark.parametrize("chunk", [1 << 20, 7 * 5])  # one chunk / ragged chunks of 7 rows at N = 5
def test_linear_cross_entropy_matches_dense(monkeypatch, chunk):
    from mechfact.facts import losses

    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", chunk)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(30, 4, generator=g, requires_grad=True)
    base = torch.randn(5, 4, generator=g, requires_grad=True)
    W = base.T  # a non-contiguous view, as for tied embeddings
    t = torch.randint(5, (30,), generator=g)
    loss = losses.linear_cross_entropy(h, W, t)
    gh, gb = torch.autograd.grad(3.0 * loss, (h, base))
    ref = torch.nn.functional.cross_entropy(h @ W, t)
    rh, rb = torch.autograd.grad(3.0 * ref, (h, base))
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert torch.allclose(gh, rh, atol=1e-6) and torch.allclose(gb, rb, atol=1e-6)
    with pytest.raises(ValueError, match=r"targets \(29,\) must be \(30,\)"):
        losses.linear_cross_entropy(h, W, t[:29])


@pytest.mark.parametrize("chunk", [1 << 20, 7 * 5])
def test_linear_cross_entropy_forms_only_the_gradients_needed(monkeypatch, chunk):
    """The gradients are formed in the forward pass: only for inputs that require them, none under no_grad,
    and each equal to the dense form's."""
    from mechfact.facts import losses

    monkeypatch.setattr(losses, "CHUNK_ELEMENTS", chunk)
    g = torch.Generator().manual_seed(1)
    h0, W0 = torch.randn(30, 4, generator=g), torch.randn(4, 5, generator=g)
    t = torch.randint(5, (30,), generator=g)
    ref = torch.nn.functional.cross_entropy(h0 @ W0, t)
    with torch.no_grad():
        assert losses.linear_cross_entropy(h0, W0, t).item() == pytest.approx(ref.item(), rel=1e-6)
    for need_h, need_W in ((True, False), (False, True)):
        h, W = h0.clone().requires_grad_(need_h), W0.clone().requires_grad_(need_W)
        loss = losses.linear_cross_entropy(h, W, t)
        (grad,) = torch.autograd.grad(loss, h if need_h else W)
        hr, Wr = h0.clone().requires_grad_(need_h), W0.clone().requires_grad_(need_W)
        (grad_ref,) = torch.autograd.grad(torch.nn.functional.cross_entropy(hr @ Wr, t), hr if need_h else Wr)
        assert torch.allclose(grad, grad_ref, atol=1e-6)


def test_linear_squared_error_matches_dense():
    from mechfact.facts import losses

    g = torch.Generator().manual_seed(0)
    h = torch.randn(30, 4, generator=g, requires_grad=True)
    base = torch.randn(5, 4, generator=g, requires_grad=True)
    W = base.T
    t = torch.randint(5, (30,), generator=g)
    loss = losses.linear_squared_error(h, W, t, target_logit=2.5)
    gh, gb = torch.autograd.grad(loss, (h, base))
    ref = ((h @ W - 2.5 * torch.nn.functional.one_hot(t, 5)) ** 2).sum(-1).mean()
    rh, rb = torch.autograd.grad(ref, (h, base))
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    assert torch.allclose(gh, rh, atol=1e-5) and torch.allclose(gb, rb, atol=1e-5)
    with pytest.raises(ValueError, match=r"targets \(29,\) must be \(30,\)"):
        losses.linear_squared_error(h, W, t[:29])


@pytest.mark.slow  # seconds of training: the slow tier keeps the fast one under 5 minutes
def test_squared_loss_with_l2_converges_to_a_fixed_point():
    """loss="mse" + coupled l2 has a finite minimiser: the logits approach their targets (not ever-growing
    margins as under cross-entropy) and the parameters stop moving."""
    world = FactWorld(32, 2, seed=0)
    model = FactModel(FactModelConfig(32, 2, d=32, mlp_width=64, entity_init="zero"))
    assert model.W_E_ent.abs().sum() == 0
    cfg = TrainConfig(steps=1500, lr=1e-2, target_accuracy=None, eval_every=100, loss="mse", l2=1e-4,
                      schedule="cosine")
    res = train(model, world, cfg, progress=False)
    assert res["accuracy"] == 1.0
    q = world.single_hop()
    with torch.no_grad():
        logits = model(q.tokens)[:, -1]
    target = logits.gather(1, q.answers[:, None])[:, 0]
    assert target.min().item() == pytest.approx(1.0, abs=0.02)  # the target logit, not a growing margin
    others = logits.masked_fill(torch.nn.functional.one_hot(q.answers, 32).bool(), 0.0)
    assert others.abs().max().item() < 0.05
    ce = FactModel(FactModelConfig(32, 2, d=32, mlp_width=64, entity_init="zero"))
    train(ce, world, TrainConfig(steps=1500, lr=1e-2, target_accuracy=None, eval_every=100, schedule="cosine"),
          progress=False)
    with torch.no_grad():
        assert ce(q.tokens)[:, -1].gather(1, q.answers[:, None]).mean().item() > 10.0  # CE margins keep growing
    with pytest.raises(ValueError, match="entity_init='zero' needs trainable, untied"):
        FactModelConfig(8, 2, tied=True, entity_init="zero")
    with pytest.raises(ValueError, match="entity_init='small'"):
        FactModelConfig(8, 2, entity_init="small")


def test_training_flushes_denormals():
    """Confident softmaxes underflow to denormals, ~10x slower on CPU; train() switches flushing on."""
    torch.set_flush_denormal(False)
    assert (torch.tensor([1e-39]) * 1.0).item() > 0.0  # a denormal float32 survives
    _fit()
    assert (torch.tensor([1e-39]) * 1.0).item() == 0.0  # ... and is flushed to zero after train()


def test_freeze_keeps_tensors_and_restores_gradient_flags(one_thread):
    """The one trainer's regime options: frozen tensors stay put, every requires_grad flag is as before."""
    world = FactWorld(24, 2, seed=0)
    model = FactModel(FactModelConfig(24, 2, d=16, mlp_width=32, seed=0))
    U0 = model.W_U_ent.detach().clone()
    E0 = model.W_E_ent.detach().clone()
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    res = train(model, world, TrainConfig(lr=3e-2, steps=150, eval_every=50, target_accuracy=None,
                                          freeze=["W_U_ent"]))
    assert torch.equal(model.W_U_ent, U0) and not torch.equal(model.W_E_ent, E0)
    assert model.W_U_ent.grad is None
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert [h["step"] for h in res["history"]] == [50, 100, 150]
    assert res["accuracy"] == evaluate(model, world)["accuracy"] >= 0.9


def test_l2_shrinks_only_the_named_tensors(one_thread):
    world = FactWorld(24, 2, seed=0)
    norms = {}
    for name, cfg in (("none", {}), ("all", {"l2": 0.1}), ("emb", {"l2": 0.1, "l2_only": ["W_E_ent"]})):
        model = FactModel(FactModelConfig(24, 2, d=16, mlp_width=32, seed=0))
        train(model, world, TrainConfig(lr=3e-2, steps=100, eval_every=100, target_accuracy=None, **cfg))
        norms[name] = (float(model.W_E_ent.detach().norm()), float(model.blocks[0].mlp.W_in.detach().norm()))
    assert norms["all"][0] < 0.7 * norms["none"][0] and norms["all"][1] < 0.9 * norms["none"][1]
    assert norms["emb"][0] < 0.7 * norms["none"][0]
    assert norms["emb"][1] > 0.95 * norms["none"][1]  # the MLP is not penalised


def test_freeze_names_are_checked():
    world = FactWorld(8, 1, seed=0)
    with pytest.raises(ValueError, match="unknown parameters.*W_U_ent"):
        train(FactModel(FactModelConfig(8, 1, d=4, mlp_width=4)), world, TrainConfig(steps=1, freeze=["W_U"]))
    with pytest.raises(ValueError, match="--l2-only"):
        TrainConfig(freeze=["W_U_ent"], l2_only=["W_U_ent"])


def test_squared_loss_gradient_is_bitwise_reproducible_with_two_threads():
    """The geometric regime (loss="mse") gave other numbers on every run with 2 threads: the backward of
    ``W.T[targets]`` (index_put with accumulation over repeated targets) is not deterministic on CPU. Measured
    before the fix at this size: 6 different gradients in 6 repeats."""
    import hashlib

    from mechfact.facts.losses import linear_squared_error

    g = torch.Generator().manual_seed(0)
    h0, W0 = torch.randn(1024, 128, generator=g), torch.randn(128, 256, generator=g)
    t = torch.randint(0, 256, (1024,), generator=g)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = set()
        for _ in range(6):
            h, W = h0.clone().requires_grad_(), W0.clone().requires_grad_()
            linear_squared_error(h, W, t).backward()
            seen.add(hashlib.sha256(h.grad.numpy().tobytes() + W.grad.numpy().tobytes()).hexdigest())
    finally:
        torch.set_num_threads(threads)
    assert len(seen) == 1
    # and it is the squared error of the dense logits
    h, W = h0.clone().requires_grad_(), W0.clone().requires_grad_()
    dense = ((h @ W - torch.nn.functional.one_hot(t, 256).float()) ** 2).sum(-1).mean()
    torch.testing.assert_close(linear_squared_error(h0, W0, t), dense.detach(), rtol=1e-5, atol=1e-3)


def test_a_checkpoint_of_other_work_is_refused_and_a_diverged_training_leaves_none(tmp_path):
    """train_resumable: a checkpoint saved under another tag (another config in a reused folder) is refused with
    the file's name instead of resuming the wrong model; a training that diverges deletes its checkpoint."""
    from mechfact.facts import FactWorld, build_fact_model
    from mechfact.facts.train import train_resumable

    world = FactWorld(16, 2, 0)
    cfg = TrainConfig(steps=40, target_accuracy=None, eval_every=10)
    path = tmp_path / "ckpt.pt"
    train_resumable(build_fact_model(world, 8, 16), world, cfg, path, checkpoint_every=10, tag="a")
    assert path.is_file()
    with pytest.raises(ValueError, match="ckpt.pt: a checkpoint of other work"):
        train_resumable(build_fact_model(world, 8, 16), world, cfg, path, tag="b")
    res, _ = train_resumable(build_fact_model(world, 8, 16), world, cfg, path, tag="a")  # finished: no step more
    assert res.steps == 40
    path.unlink()

    def stop(state):
        if state["step"] == 20:
            raise KeyboardInterrupt

    long = TrainConfig(steps=400, target_accuracy=None, eval_every=10)
    with pytest.raises(KeyboardInterrupt):
        train_resumable(build_fact_model(world, 8, 16), world, long, path, checkpoint_every=10, after_checkpoint=stop)
    assert torch.load(path, weights_only=True)["step"] == 20  # a stopped training keeps its checkpoint
    with pytest.raises(ValueError, match="diverged"):  # resumed at a learning rate that blows it up
        train_resumable(build_fact_model(world, 8, 16), world, TrainConfig(**{**long.to_dict(), "lr": 1e10}), path)
    assert not path.exists()
