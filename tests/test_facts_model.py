import json

import pytest
import torch

from mechfact import hooks
from mechfact.facts.model import FactModel, FactModelConfig, build_fact_model
from mechfact.facts.train import loss_fn
from mechfact.facts.world import FactWorld


pytestmark = pytest.mark.usefixtures("one_thread")


N, R, D, M = 12, 3, 16, 24
HOOKS = [hooks.embed(), hooks.resid(0, "pre"), hooks.attn_pattern(0), hooks.attn_out(0), hooks.resid(0, "mid"),
         hooks.mlp_pre(0), hooks.mlp_post(0), hooks.mlp_out(0), hooks.resid(0, "post")]


def make(**kw) -> FactModel:
    return FactModel(FactModelConfig(N, R, d=D, mlp_width=M, **kw))


def tokens(batch: int = 5, world: FactWorld | None = None) -> torch.Tensor:
    return (world or FactWorld(N, R, seed=0)).k_hop(2, n=batch, seed=0).tokens  # (batch, 3)


def test_hook_helpers():
    assert hooks.embed() == "hook_embed"
    assert hooks.resid(2, "mid") == "blocks.2.hook_resid_mid"
    assert hooks.resid(0) == "blocks.0.hook_resid_post"
    assert hooks.attn_pattern(1) == "blocks.1.attn.hook_pattern"
    assert (hooks.mlp_pre(0), hooks.mlp_post(0)) == ("blocks.0.mlp.hook_pre", "blocks.0.mlp.hook_post")
    with pytest.raises(ValueError, match="where='out'"):
        hooks.resid(0, "out")
    with pytest.raises(ValueError, match="layer=-1"):
        hooks.mlp_post(-1)


@pytest.mark.parametrize("attention", ["uniform", "learned"])
def test_run_with_cache_shapes(attention):
    model = make(attention=attention)
    assert set(HOOKS) <= set(model.hook_dict)
    toks = tokens()
    logits, cache = model.run_with_cache(toks)
    assert logits.shape == (5, 3, N)  # every position, entity vocabulary
    assert torch.equal(logits, model(toks))
    shapes = {n: (5, 3, D) for n in HOOKS}
    shapes[hooks.attn_pattern(0)] = (5, 1, 3, 3)
    shapes[hooks.mlp_pre(0)] = shapes[hooks.mlp_post(0)] = (5, 3, M)
    for name in HOOKS:
        assert tuple(cache[name].shape) == shapes[name], name
    pattern = cache[hooks.attn_pattern(0)][:, 0]
    assert torch.allclose(pattern.sum(-1), torch.ones(5, 3))
    assert (pattern.triu(1) == 0).all()  # causal
    if attention == "uniform":
        assert torch.allclose(pattern[0, 2], torch.full((3,), 1 / 3))
    resid = cache[hooks.resid(0, "mid")]
    assert torch.allclose(resid, cache[hooks.resid(0, "pre")] + cache[hooks.attn_out(0)])


def test_positional_embeddings_hook():
    model = make(n_ctx=4, attention="learned")
    _, cache = model.run_with_cache(tokens())
    assert cache[hooks.pos_embed()].shape == (5, 3, D)
    with pytest.raises(ValueError, match="n_ctx=4"):
        model(torch.zeros(1, 5, dtype=torch.long))


def test_mlp_ablation_changes_logits_and_hooks_reset():
    model = make()
    toks = tokens()
    clean = model(toks)
    ablated = model.run_with_hooks(toks, fwd_hooks=[(hooks.mlp_post(0), lambda act, hook: torch.zeros_like(act))])
    assert not torch.allclose(clean, ablated)
    # with the MLP ablated (b_out = 0) the logits are the attention path only
    _, cache = model.run_with_cache(toks)
    assert torch.allclose(ablated, cache[hooks.resid(0, "mid")] @ model.W_U, atol=1e-5)
    assert torch.equal(model(toks), clean)  # hooks removed afterwards


def test_pattern_can_be_patched_in_place():
    model = make()
    toks = tokens()

    def only_first(pattern, hook):
        pattern[:] = 0
        pattern[..., 0] = 1  # every position reads the subject only
        return pattern

    patched = model.run_with_hooks(toks, fwd_hooks=[(hooks.attn_pattern(0), only_first)])
    assert torch.allclose(patched[:, 0], model(toks)[:, 0])  # position 0 already attends to itself only
    assert not torch.allclose(patched[:, 2], model(toks)[:, 2])


def test_causal():
    model = make(attention="learned")
    a = torch.tensor([[0, N, N + 1]])
    b = torch.tensor([[0, N, N + 2]])
    assert torch.allclose(model(a)[:, :2], model(b)[:, :2])


def _one_step(model: FactModel) -> None:
    q = FactWorld(N, R, seed=0).single_hop()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    loss_fn(model, q.tokens, q.targets).backward()
    opt.step()


@pytest.mark.parametrize("regime, ent_fixed, unembed_fixed", [
    ("trainable", False, False), ("frozen", True, True), ("frozen-input", True, False)])
def test_frozen_regimes(regime, ent_fixed, unembed_fixed):
    model = make(embeddings=regime)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _one_step(model)
    assert torch.equal(model.W_E_ent, before["W_E_ent"]) == ent_fixed
    assert torch.equal(model.W_U, before["W_U_ent"]) == unembed_fixed
    assert not torch.equal(model.W_E_rel, before["W_E_rel"])  # relations always learn
    assert not torch.equal(model.blocks[0].mlp.W_in, before["blocks.0.mlp.W_in"])
    params = dict(model.named_parameters())
    assert ("W_E_ent" in params) != ent_fixed and ("W_U_ent" in params) != unembed_fixed


def test_frozen_init_is_n0_i_over_d():
    model = FactModel(FactModelConfig(2000, 1, d=64, embeddings="frozen"))
    assert model.W_E_ent.pow(2).sum(1).mean().item() == pytest.approx(1.0, abs=0.05)
    assert model.W_U.pow(2).sum(0).mean().item() == pytest.approx(1.0, abs=0.05)


def test_tied():
    model = make(tied=True)
    assert torch.equal(model.W_U, model.W_E_ent.T) and "W_U_ent" not in model.state_dict()
    frozen = make(tied=True, embeddings="frozen")
    _one_step(frozen)
    assert torch.equal(frozen.W_U, frozen.W_E_ent.T)


def test_seeded_init():
    a, b, c = make(seed=1), make(seed=1), make(seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.W_E_ent, c.W_E_ent)


def test_config_round_trip_and_errors():
    cfg = FactModelConfig(N, R, d=D, mlp_width=M, attention="learned", embeddings="frozen-input", n_ctx=8, seed=3)
    assert FactModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match="unknown FactModelConfig keys"):
        FactModelConfig.from_dict({**cfg.to_dict(), "width": 3})
    with pytest.raises(ValueError, match="attention='softmax'"):
        FactModelConfig(N, R, attention="softmax")
    with pytest.raises(ValueError, match="embeddings='fixed'"):
        FactModelConfig(N, R, embeddings="fixed")
    with pytest.raises(ValueError, match="contradictory"):
        FactModelConfig(N, R, tied=True, embeddings="frozen-input")
    with pytest.raises(ValueError, match="d=0"):
        FactModelConfig(N, R, d=0)


def test_bad_tokens():
    model = make()
    with pytest.raises(ValueError, match="allowed 0..15"):
        model(torch.tensor([[0, 16]]))
    with pytest.raises(ValueError, match="expected \\(batch, pos\\)"):
        model(torch.tensor([0, 1]))


@pytest.mark.parametrize("regime", ["trainable", "frozen", "frozen-input"])
def test_save_load_round_trip(tmp_path, regime):
    model = make(embeddings=regime, attention="learned", seed=4)
    _one_step(model)
    model.save(tmp_path / "ckpt")
    assert {p.name for p in (tmp_path / "ckpt").iterdir()} == {"config.json", "model.safetensors"}
    loaded = FactModel.load(tmp_path / "ckpt")
    assert loaded.cfg == model.cfg
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    toks = tokens()
    assert torch.equal(loaded(toks), model(toks))


def test_load_errors(tmp_path):
    path = make().save(tmp_path / "ckpt")
    weights = path / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match="corrupted weights"):
        FactModel.load(path)
    weights.write_bytes(good)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "d": D + 1}))
    with pytest.raises(ValueError, match="does not match the config"):
        FactModel.load(path)
    (path / "config.json").write_text(json.dumps({**cfg, "attention": "learned"}))
    with pytest.raises(ValueError, match="missing .*W_Q"):
        FactModel.load(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupted config"):
        FactModel.load(path)
    with pytest.raises(ValueError, match="missing config.json"):
        FactModel.load(tmp_path / "nowhere")


@pytest.mark.parametrize("tied", [False, True])
def test_attribute_outputs_are_the_first_columns_of_the_entity_model(tied):
    """outputs='attributes' scores the pool 0..A-1 only: the same initial weights as the full model, whose logits
    restricted to the first A columns they reproduce exactly; ~N / A fewer unembedding weights."""
    from mechfact.facts.model import build_fact_model
    from mechfact.facts.world import FactWorld

    world = FactWorld(256, 4, seed=0, attributes=16)
    full = build_fact_model(world, d=16, mlp_width=32, tied=tied, seed=2, outputs="entities")
    pool = build_fact_model(world, d=16, mlp_width=32, tied=tied, seed=2, outputs="attributes")
    assert pool.cfg.outputs == 16 and tuple(pool.W_U.shape) == (16, 16) and full.cfg.outputs == 256
    q = world.single_hop()
    with torch.no_grad():
        a, b = full(q.tokens), pool(q.tokens)
    assert torch.equal(a[..., :16], b)
    assert full.cfg.n_weights()[0] - pool.cfg.n_weights()[0] == (0 if tied else 16 * (256 - 16))
    bij = FactWorld(64, 2, seed=0)  # a bijection world has no smaller pool: all entities are answers
    assert build_fact_model(bij, d=8, mlp_width=8, outputs="attributes").cfg.outputs == 64


def test_attribute_outputs_train_and_refuse_a_larger_pool():
    from mechfact.facts.evaluate import evaluate
    from mechfact.facts.model import FactModelConfig, build_fact_model
    from mechfact.facts.train import TrainConfig, train
    from mechfact.facts.world import FactWorld

    world = FactWorld(128, 2, seed=0, attributes=8)
    model = build_fact_model(world, d=16, mlp_width=64, seed=0, outputs="attributes")
    train(model, world, TrainConfig(lr=3e-2, steps=600, eval_every=100))
    assert evaluate(model, world)["accuracy"] >= 0.99
    with pytest.raises(ValueError, match=r"model scores 8 outputs \(entities 0\.\.7\) but the world's answers range "
                                         r"over 128"):
        evaluate(model, FactWorld(128, 2, seed=0))
    with pytest.raises(ValueError, match=r"n_outputs=1: allowed 0 \(all 128 entities\) or 2\.\.128"):
        FactModelConfig(128, 2, n_outputs=1)
    with pytest.raises(ValueError, match=r"outputs='pool': allowed values are auto, entities, attributes"):
        build_fact_model(world, outputs="pool")


def test_auto_outputs_score_the_pool_for_single_hop_pool_worlds_only():
    """The default (auto): the attribute pool for single-hop queries of a pool world; the N entities for
    bijection worlds and for multi-hop queries (whose intermediate answers become subjects)."""
    from mechfact.facts.experiments import ModelSpec
    from mechfact.facts.model import build_fact_model, scores_attributes
    from mechfact.facts.spec import training_cost
    from mechfact.facts.world import FactWorld

    pool, bij = FactWorld(256, 4, seed=0, attributes=16), FactWorld(64, 2, seed=0)
    assert build_fact_model(pool, d=8, mlp_width=8).cfg.outputs == 16
    assert build_fact_model(pool, d=8, mlp_width=8, hops=2, attention="learned").cfg.outputs == 256
    assert build_fact_model(pool, d=8, mlp_width=8, outputs="entities").cfg.outputs == 256
    assert build_fact_model(bij, d=8, mlp_width=8).cfg.outputs == 64
    assert [scores_attributes(o, 256, 16, h) for o in ("auto", "entities", "attributes") for h in (1, 2)] == \
        [True, False, False, False, True, True]
    assert not scores_attributes("auto", 64, None) and not scores_attributes("attributes", 64, 64)
    # the memory estimate follows the same rule: d (N - A) fewer unembedding weights, each with its gradient and
    # two Adam moments (float32; the chunked loss never holds the logits)
    big = training_cost(4096, 16, 64, 64, ModelSpec(outputs="entities"), attributes=64)[0]
    small = training_cost(4096, 16, 64, 64, ModelSpec(), attributes=64)[0]
    assert big - small == 4 * 4 * 64 * (4096 - 64)


def test_entity_init_scale_scales_the_normal_draw_only():
    """entity_init_scale multiplies the entity input embeddings' init (same draw); the other tensors are
    untouched; a scale <= 0 or not finite is refused with the value and what is allowed."""
    from mechfact.facts.model import FactModel, FactModelConfig

    a, b = FactModel(FactModelConfig(32, 2, d=8)), FactModel(FactModelConfig(32, 2, d=8, entity_init_scale=0.1))
    assert torch.allclose(b.W_E_ent, 0.1 * a.W_E_ent, rtol=1e-6, atol=0)
    assert not torch.allclose(b.W_E_ent, a.W_E_ent)
    assert torch.equal(a.W_E_rel, b.W_E_rel) and torch.equal(a.W_U_ent, b.W_U_ent)
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match=rf"entity_init_scale={bad!r}: must be a finite number > 0"):
            FactModelConfig(32, 2, entity_init_scale=bad)


@pytest.mark.parametrize("attention", ["uniform", "learned"])
@pytest.mark.parametrize("layer_norm", [False, True])
def test_supervised_resid_runs_the_block_at_the_last_position_only_with_the_full_forwards_numbers(attention,
                                                                                                  layer_norm):
    """Single-hop and direct multi-hop queries are supervised at their last position only: the block runs there
    alone, with the values and gradients of the full forward (up to float rounding); chain-of-thought queries
    (several supervised positions) and any model with a hook attached take the full forward, where the hook
    sees every position."""
    from mechfact.facts.world import IGNORE

    w = FactWorld(32, 3, seed=0)
    for hops, cot in ((1, False), (3, False), (2, True)):
        model = build_fact_model(w, d=16, mlp_width=32, seed=1, attention=attention, layer_norm=layer_norm,
                                 hops=hops, cot=cot)
        q = w.single_hop() if hops == 1 else w.k_hop(hops, cot=cot)
        sup = q.targets != IGNORE
        params = [p for p in model.parameters() if p.requires_grad]
        for rows in (slice(None), slice(0, 3)):  # every query (the per-token tables pay off), three (they do not)
            full = model.final_resid(q.tokens[rows])[sup[rows]]
            gf = torch.autograd.grad(full.square().sum(), params, allow_unused=True)
            fast = model.supervised_resid(q.tokens[rows], sup[rows])
            gs = torch.autograd.grad(fast.square().sum(), params, allow_unused=True)
            assert fast.shape == full.shape == (int(sup[rows].sum()), 16)
            assert torch.allclose(fast, full, atol=1e-5)
            for p, a, b in zip(params, gs, gf):
                assert (a is None) == (b is None) or not (a if b is None else b).any(), p.shape
                if a is not None and b is not None:
                    assert torch.allclose(a, b, atol=1e-4), p.shape
    model = build_fact_model(w, d=16, mlp_width=32, seed=1, attention=attention, layer_norm=layer_norm)
    q = w.single_hop()
    sup = q.targets != IGNORE
    seen = []
    model.blocks[0].mlp.hook_post.add_hook(lambda t, hook: seen.append(tuple(t.shape)) or t * 0)
    ablated = model.supervised_resid(q.tokens, sup)
    assert seen == [(len(q), 2, 32)]  # the full forward ran, at every position
    model.reset_hooks()
    assert not torch.allclose(ablated, model.supervised_resid(q.tokens, sup))  # the ablation took effect
