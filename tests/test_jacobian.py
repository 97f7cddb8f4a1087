"""mechfact.llm.jacobian: the forward-mode Jacobian equals the batched-copies one and finite differences.

Tiny random Llama / Qwen2 / Qwen3 / Phi-3 models (tests/llm_tiny.py), plus two built here: a Phi-3 whose rotary
embedding turns half of each head, and a Gemma-3 (sandwich norms with ``1 + w`` gains, q/k norms, a query
scale other than head_dim, sliding windows shorter than the prompt). Their weights are scaled up and every
norm gain and bias randomised, so attention patterns and MLPs are far from linear and every gain enters the
Jacobian. Both ways the attention scores take tangents are forced in turn. The finite-difference check runs
the models in float64 and compares every entry of J, so a mistake shared by both methods would show there.
The embedded SmolLM2 (and Gemma-3-270M when installed) are compared in the slow tier.
"""

import logging
import types

import pytest
import torch

from llm_tiny import FAMILIES, build_gemma3, build_model, build_tokenizer, write_relations

ALL = (*FAMILIES, "phi3_partial_rotary", "gemma3")
TOL = 1e-5  # max |J_new - J_copies|, relative to max(1, max |J|)


def build_phi3_partial(folder):
    """A tiny random Phi-3 whose rotary embedding turns half of each head's features."""
    from transformers import AutoModelForCausalLM, Phi3Config

    folder.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(folder)
    cfg = Phi3Config(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, partial_rotary_factor=0.5,
                     max_position_embeddings=256, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(6)
    AutoModelForCausalLM.from_config(cfg).eval().save_pretrained(folder)
    return folder


def load_tiny(folder, dtype=torch.float32):
    """The model of ``folder`` in memory, weights x8 (embeddings aside) and every 1-d parameter (norm gains,
    biases) moved by N(0, 0.3) -- the same for every dtype -- booted through mechfact.load_model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mechfact.llm.models.loading import load_model

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in sorted(hf.named_parameters()):
            if p.ndim == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=g).to(dtype))
            elif "embed" not in name and "lm_head" not in name:
                p.mul_(8)
    return load_model(hf, tokenizer=AutoTokenizer.from_pretrained(folder))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("jac_tiny")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    folders = {f: build_model(f, root / f) for f in FAMILIES}
    folders["gemma3"] = build_gemma3(root / "gemma3")
    folders["phi3_partial_rotary"] = build_phi3_partial(root / "phi3_partial_rotary")
    models = {f: load_tiny(folder) for f, folder in folders.items()}
    torch.set_num_threads(n)
    return {"models": models, "folders": folders, "relations": write_relations(root / "relations")}


def _prompt(lm, relations, i=0, k=2):
    """A k-shot prompt whose template puts several tokens after the subject ("{} has the colour")."""
    from mechfact.llm.prompts import build_prompts
    from mechfact.llm.relations import load_relations

    rel = load_relations(relations, ["tiny_colour"])[0]
    return build_prompts(rel, lm.tokenizer, lm.bos_id, k=k, template=1, seed=0)[i]


def _close(J, J0):
    diff = float((J - J0).abs().max())
    assert diff <= TOL * max(1.0, float(J0.abs().max())), (diff, float(J0.abs().max()))


@pytest.fixture(params=[None, "direct", "scores"])
def attention_path(request, monkeypatch):
    """Each way the attention scores take tangents (None: whichever the cost model picks)."""
    from mechfact.llm import jacobian as jac

    monkeypatch.setattr(jac, "ATTENTION_PATH", request.param)
    return request.param


@pytest.mark.parametrize("family", ALL)
def test_matches_batched_copies(tiny, family, attention_path, one_thread):
    from mechfact.llm.jacobian import fast_path_problem, jacobian, jacobian_copies

    lm = tiny["models"][family]
    p = _prompt(lm, tiny["relations"])
    assert len(p.tokens) > 8 and len(p.tokens) - p.subject_last >= 3  # a prefix, a suffix of several tokens
    for layer in range(lm.n_layers - 1):
        J, s, o = jacobian(lm, p.tokens, p.subject_last, layer)
        J0, s0, o0 = jacobian_copies(lm, p.tokens, p.subject_last, layer)
        assert J.dtype == s.dtype == o.dtype == torch.float32 and J.shape == (lm.d_model, lm.d_model)
        assert J.device.type == s.device.type == o.device.type == "cpu"
        _close(J, J0)
        assert float(J0.abs().max()) > 1e-2  # the subject reaches the last token (J far above TOL)
        torch.testing.assert_close(s, s0, atol=1e-6, rtol=0)
        torch.testing.assert_close(o, o0, atol=1e-5, rtol=1e-6)
    assert fast_path_problem(lm) is None  # the forward-mode path ran (no fallback)
    J7 = jacobian(lm, p.tokens, p.subject_last, 1, chunk=7)[0]  # directions in chunks of 7: same numbers
    _close(J7, jacobian_copies(lm, p.tokens, p.subject_last, 1)[0])


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_positions_at_the_ends(tiny, family, one_thread):
    from mechfact.llm.jacobian import jacobian, jacobian_copies

    lm = tiny["models"][family]
    toks = _prompt(lm, tiny["relations"], i=1).tokens
    n = len(toks)
    for pos in (0, 1, n - 1):  # the first token (the prefix is empty), the last (one suffix token)
        J = jacobian(lm, toks, pos, 1)[0]
        _close(J, jacobian_copies(lm, toks, pos, 1)[0])
    last = lm.n_layers - 1  # s and o in the same block: d o / d s is the identity at the last token, else 0
    J, s, o = jacobian(lm, toks, n - 1, last)
    assert torch.equal(J, torch.eye(lm.d_model)) and torch.equal(s, o)
    J, s, o = jacobian(lm, toks, n - 3, last)
    assert torch.equal(J, torch.zeros(lm.d_model, lm.d_model)) and not torch.equal(s, o)


@pytest.mark.parametrize("family", ALL)
def test_every_entry_matches_finite_differences(tiny, family, attention_path, one_thread, monkeypatch):
    """float64 model: central differences along every basis direction against every entry of J.

    The bridge and Hugging Face take the attention softmax, and Hugging Face's RMS norms, in float32 for every
    dtype; that rounding noise would swamp the differences, so here both keep float64 in float64 (the same
    functions, without the round trip through float32)."""
    from mechfact import hooks
    from mechfact.llm.jacobian import fast_path_problem, jacobian

    softmax = torch.nn.functional.softmax

    def softmax64(x, dim=None, _stacklevel=3, dtype=None):
        return softmax(x, dim=dim, dtype=None if x.dtype == torch.float64 else dtype)

    def rms_norm64(self, x):
        eps = getattr(self, "variance_epsilon", getattr(self, "eps", None))
        gain = (1.0 + self.weight) if type(self).__name__.startswith("Gemma") else self.weight
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain

    monkeypatch.setattr(torch.nn.functional, "softmax", softmax64)
    lm = load_tiny(tiny["folders"][family], torch.float64)
    norms = [m for m in lm.bridge.original_model.modules() if type(m).__name__.endswith("RMSNorm")]
    assert len(norms) >= 2 * lm.n_layers
    for m in norms:
        m.forward = types.MethodType(rms_norm64, m)
    p = _prompt(lm, tiny["relations"], i=2)
    layer, pos = 1, p.subject_last
    toks = torch.tensor([p.tokens])
    J, s, o = jacobian(lm, p.tokens, pos, layer)
    assert fast_path_problem(lm) is None

    def f(states):  # (m, d) states at (layer, pos) -> (m, d) last block's outputs at the last token
        got = {}

        def put(act, hook):
            act = act.expand(len(states), -1, -1).clone()
            act[:, pos] = states
            return act

        def take(act, hook):
            got["o"] = act[:, -1]
            return act

        with torch.no_grad():
            lm.bridge.run_with_hooks(toks, fwd_hooks=[(hooks.resid(layer, "post"), put),
                                                      (hooks.resid(lm.n_layers - 1, "post"), take)])
        return got["o"]

    s64 = s.double()

    def central(h):  # column j: (o(s + h e_j) - o(s - h e_j)) / 2h
        basis = torch.eye(lm.d_model, dtype=torch.float64) * h
        return ((f(s64 + basis) - f(s64 - basis)) / (2 * h)).T

    h = 1e-2 * float(s64.abs().max())
    fd = (4 * central(h / 2) - central(h)) / 3  # Richardson: error O(h^4)
    err = float((J.double() - fd).abs().max())
    assert err <= 1e-6 * float(fd.abs().max()), (err, float(fd.abs().max()))  # measured 4e-8: J is float32
    assert float(fd.abs().max()) > 1e-2


def test_falls_back_when_a_block_is_not_reproduced(tiny, one_thread, monkeypatch, caplog):
    """A linearisation that does not reproduce the bridge's block (here: a wrong attention scale) is caught by
    the per-block check; the Jacobian then comes from the batched copies, with one warning."""
    from mechfact.llm import jacobian as jac

    lm = load_tiny(tiny["folders"]["llama"])  # a fresh bridge: the fallback is remembered per bridge
    good = jac._block

    def wrong(blk):
        b = good(blk)
        b.scaling *= 1.5
        return b

    monkeypatch.setattr(jac, "_block", wrong)
    p = _prompt(lm, tiny["relations"])
    with caplog.at_level(logging.WARNING, logger="mechfact.llm.jacobian"):
        J = jac.jacobian(lm, p.tokens, p.subject_last, 0)[0]
        jac.jacobian(lm, p.tokens, p.subject_last, 1)
    _close(J, jac.jacobian_copies(lm, p.tokens, p.subject_last, 0)[0])
    assert "differs from the bridge's" in jac.fast_path_problem(lm)
    assert sum("batched copies" in r.getMessage() for r in caplog.records) == 1


def test_weights_edited_between_calls(tiny, one_thread):
    """Nothing is cached across calls that the weights decide: edited norm gains and projections count."""
    from mechfact.llm.jacobian import jacobian, jacobian_copies

    lm = load_tiny(tiny["folders"]["qwen3"])
    p = _prompt(lm, tiny["relations"])
    J_before = jacobian(lm, p.tokens, p.subject_last, 0)[0]
    with torch.no_grad():
        for name, q in lm.bridge.original_model.named_parameters():
            if "layers.1." in name and ("norm" in name or "mlp" in name or "o_proj" in name):
                q.mul_(1.5)
    J = jacobian(lm, p.tokens, p.subject_last, 0)[0]
    assert float((J - J_before).abs().max()) > 100 * TOL
    _close(J, jacobian_copies(lm, p.tokens, p.subject_last, 0)[0])


def test_rejects_bad_arguments(tiny):
    from mechfact.llm.jacobian import jacobian

    lm = tiny["models"]["llama"]
    toks = _prompt(lm, tiny["relations"]).tokens
    for kw, what in ((dict(pos=len(toks)), "pos="), (dict(layer=lm.n_layers), "layer="), (dict(chunk=0), "chunk=")):
        args = dict(pos=2, layer=1, chunk=None) | kw
        with pytest.raises(ValueError, match=what):
            jacobian(lm, toks, args["pos"], args["layer"], args["chunk"])


def _real_prompt(lm):
    from mechfact.llm.prompts import build_prompts
    from mechfact.llm.relations import load_relations

    rel = load_relations(names=["city_country"])[0]
    return build_prompts(rel, lm.tokenizer, lm.bos_id, examples=[0, 1, 2, 3, 4], samples=[6])[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["default", "gemma3-270m"])
def test_packaged_model_matches_batched_copies(name, one_thread):
    import mechfact
    from mechfact.llm.models import registry
    from mechfact.llm.jacobian import fast_path_problem, jacobian, jacobian_copies

    if name != "default":
        try:
            registry._part_files(registry.MODELS[name])
        except ValueError:
            pytest.skip(f"{name} not installed: {registry.MODELS[name].install}")
    lm = mechfact.load_model(name)
    p = _real_prompt(lm)
    layer = lm.n_layers // 2
    J, s, o = jacobian(lm, p.tokens, p.subject_last, layer)
    assert fast_path_problem(lm) is None
    J0, s0, o0 = jacobian_copies(lm, p.tokens, p.subject_last, layer)
    # float32 at the state's own scale (Gemma's states reach ~7,000, where one ulp is ~5e-4): the two paths sum in
    # another order, so their elements differ by rounding (relative 3e-7 to 8e-7 of the vector's norm measured),
    # while a state from another position or layer differs at order one
    _close(J, J0)
    _close(s, s0)
    _close(o, o0)
    assert float((s - s0).norm() / s0.norm()) < 1e-5 and float((o - o0).norm() / o0.norm()) < 1e-5
