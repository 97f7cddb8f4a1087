"""The SAME readout and intervention functions on tiny random Llama / Qwen2 / Qwen3 / Phi-3 through TransformerBridge.

No downloads: each model is built from a small config with random weights and a
word-level tokenizer, saved to a temp folder and booted like a pretrained one.
"""

import pytest
import torch

from mechfact import hooks
from mechfact.probes.patching import ablate_relation_units, relation_swap, run_with_interventions
from mechfact.probes.queries import ProbeSet, Site, collect
from mechfact.probes.readout import readout

V = 66  # w0..w63, <unk>=64, <s>=65


def _tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(64)} | {"<unk>": 64, "<s>": 65}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")),
                                   unk_token="<unk>", bos_token="<s>", pad_token="<unk>")


def _config(arch: str):
    import transformers as tf

    kw = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=32, pad_token_id=64, bos_token_id=65, eos_token_id=64)
    if arch == "qwen3":
        kw["head_dim"] = 8
    return {"llama": tf.LlamaConfig, "qwen2": tf.Qwen2Config, "qwen3": tf.Qwen3Config, "phi3": tf.Phi3Config}[arch](**kw)


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "phi3"])
def bridge(request, tmp_path_factory):
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp(request.param)
    AutoModelForCausalLM.from_config(_config(request.param)).save_pretrained(folder)
    _tokenizer().save_pretrained(folder)
    return TransformerBridge.boot_transformers(str(folder), device="cpu").eval()


def _queries(n_subj: int = 16, R: int = 3) -> ProbeSet:
    """Prompts ``<s> subj rel w63``: subject at 1, relation at 2, answer read at 3; objects repeat (10 of them)."""
    g = torch.Generator().manual_seed(0)
    s = torch.arange(n_subj).repeat_interleave(R)
    r = torch.arange(R).repeat(n_subj)
    obj = torch.randint(10, (len(s),), generator=g) + 50
    tokens = torch.stack([torch.full_like(s, 65), s, 40 + r, torch.full_like(s, 63)], 1)
    n = len(s)
    return ProbeSet(tokens, s, r, obj, obj, torch.ones(n, dtype=torch.long), torch.full((n,), 3),
                    relation_pos=torch.full((n,), 2), relation_token_ids=40 + torch.arange(R))


def test_readout_runs_unchanged(bridge, one_thread):
    ps = _queries()
    res = readout(bridge, ps, ["blocks.1.mlp.hook_post@last"])
    assert res.kind == "classifier" and len(res.per_relation) == 3
    for row in res.per_relation:
        assert 0 <= row["accuracy"] <= 1 and 0 <= row["control_accuracy"] <= 1 and row["n_test"] > 0
    f = collect(bridge, ps, [Site(hooks.mlp_post(1), "last")])
    assert f[Site(hooks.mlp_post(1), "last")].shape == (len(ps), 48)


def test_interventions_run_unchanged(bridge, one_thread):
    ps = _queries()
    # patching the relation token's embedding from [s, r'] reproduces the model's output on [s, r'] exactly
    sw = relation_swap(bridge, ps, 0, 2)
    a, b = ps.for_relation(0), ps.for_relation(2)
    from mechfact.probes.patching import Intervention

    patched = run_with_interventions(bridge, a, [Intervention(hooks.embed(), "patch", None, "relation")], source=b)
    assert torch.allclose(patched, run_with_interventions(bridge, b, []), atol=1e-4)
    assert 0 <= sw.moved_to_new <= 1
    ab = ablate_relation_units(bridge, ps, [1], site=hooks.mlp_post(1), n_units=4)
    row = ab.per_relation[0]
    assert row["n_ablated"] == 4 and len(row["random_units"]) == 4 and 0 <= row["accuracy_on_others"] <= 1
    with pytest.raises(ValueError, match="unknown hook site.*blocks.0.mlp.hook_post"):
        ablate_relation_units(bridge, ps, [1], site="blocks.0.mlp.hook_bogus")
