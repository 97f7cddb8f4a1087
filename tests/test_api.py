"""The public surface: every exported name resolves and is documented; no side effects on the caller's objects."""

import subprocess
import sys

import pytest
import torch

import mechfact


def test_every_public_name_resolves_with_a_docstring():
    assert "load_model" in mechfact.__all__ and "layer_readout" in mechfact.__all__
    for name in mechfact.__all__:
        obj = getattr(mechfact, name)
        if name != "__version__":
            assert (obj.__doc__ or "").strip(), f"mechfact.{name} has no docstring"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mechfact.nope  # noqa: B018


def test_import_is_light():
    out = subprocess.run([sys.executable, "-c", "import sys, mechfact; print('torch' in sys.modules)"],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def _tiny_in_memory():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    core.train_from_iterator([f"The capital of c{i} is k{i}" for i in range(40)],
                             trainers.BpeTrainer(vocab_size=200, special_tokens=["<s>", "</s>", "<pad>"],
                                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                 show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         bos_token_id=0, eos_token_id=1, pad_token_id=2)).eval()
    return model, tok


def test_in_memory_model_is_wrapped_without_copies_or_changes(one_thread):
    """The bridge replaces modules in place; mechfact boots a structural copy that SHARES the caller's tensors."""
    model, tok = _tiny_in_memory()
    types = [type(m) for m in model.modules()]
    kwargs = dict(tok.init_kwargs)
    x = torch.tensor([[0, 5, 9, 14, 3]])
    with torch.no_grad():
        before = model(x).logits
    lm = mechfact.load_model(model, tokenizer=tok)
    assert [type(m) for m in model.modules()] == types  # the caller's module tree is untouched
    assert dict(tok.init_kwargs) == kwargs
    assert all(a is b for a, b in zip(lm.parameters(), model.parameters()))  # no weight was copied
    with torch.no_grad():
        assert torch.equal(model(x).logits, before)
        assert torch.allclose(lm(x), before, atol=1e-5)
    with torch.no_grad():  # shared tensors: an edit of the caller's weights is seen by the wrapper
        model.lm_head.weight.mul_(2.0)
        assert torch.allclose(lm(x), model(x).logits, atol=1e-5)
    for bad, needle in (({"device": "cuda"} if torch.cuda.is_available() else {"dtype": "bfloat16"}, "does not copy"),):
        with pytest.raises(ValueError, match=needle):
            mechfact.load_model(model, tokenizer=tok, **bad)
    with pytest.raises(ValueError, match="needs its tokenizer"):
        mechfact.load_model(model)


def test_load_model_takes_a_bridge_and_an_nnsight_model_and_names_what_it_accepts(one_thread):
    """A booted TransformerBridge is wrapped as it is; an nnsight ``LanguageModel`` (its ``_model`` Hugging Face
    module and ``tokenizer``: nnsight is not a dependency, so a stand-in with its module path and attributes) is
    booted from its module without copies; anything else is refused in one line naming what is accepted."""
    from transformer_lens.model_bridge import TransformerBridge

    model, tok = _tiny_in_memory()
    x = torch.tensor([[0, 5, 9, 14, 3]])
    with torch.no_grad():
        want = model(x).logits
    lm = mechfact.load_model(model, tokenizer=tok)
    assert isinstance(lm.bridge, TransformerBridge)
    again = mechfact.load_model(lm.bridge)  # a bridge: wrapped as it is
    assert again.bridge is lm.bridge and again.n_layers == 2
    with torch.no_grad():
        assert torch.allclose(again(x), want, atol=1e-5)

    stand_in = type("LanguageModel", (), {"__module__": "nnsight.modeling.language"})()
    stand_in._model, stand_in.tokenizer = model, tok
    nn_lm = mechfact.load_model(stand_in)
    assert all(a is b for a, b in zip(nn_lm.parameters(), model.parameters()))
    with torch.no_grad():
        assert torch.allclose(nn_lm(x), want, atol=1e-5)
    with pytest.raises(ValueError, match=r"got a builtins\.dict; accepted: a packaged short name .* nnsight"):
        mechfact.load_model({"model": "x"})


def test_lre_and_training_leave_gradient_flags_as_they_were(one_thread):
    model, tok = _tiny_in_memory()
    lm = mechfact.load_model(model, tokenizer=tok)
    model.lm_head.weight.requires_grad_(False)  # the caller's own choice survives too
    flags = [p.requires_grad for p in model.parameters()]
    rel = mechfact.Relation("cap", ["The capital of {} is"], [(f"c{i}", f"k{i}") for i in range(8)])
    res = mechfact.lre(lm, rel, layer=0, n_train=2, facts="all", k_shot=1, rank=4, chunk=8)
    assert res.faithfulness is not None and res.operator.J.shape == (32, 32)
    assert [p.requires_grad for p in model.parameters()] == flags

    world = mechfact.FactWorld(16, 2, seed=0)
    fm = mechfact.build_fact_model(world, d=8, mlp_width=16, seed=0)
    fm.W_E_rel.requires_grad_(False)
    flags = {n: p.requires_grad for n, p in fm.named_parameters()}
    mechfact.train(fm, world, mechfact.TrainConfig(steps=5, freeze=["W_U_ent"], target_accuracy=None))
    mechfact.freeze_and_swap(fm, world, retrain=mechfact.TrainConfig(steps=3, target_accuracy=None))
    assert {n: p.requires_grad for n, p in fm.named_parameters()} == flags


@pytest.mark.slow  # seconds: the slow tier keeps the fast one under 5 minutes
def test_plotting_leaves_the_matplotlib_backend_alone(tmp_path):
    code = f"""
import matplotlib
matplotlib.use("svg")
from mechfact.facts.plots import plot_train
plot_train({{"history": [{{"step": 1, "loss": 1.0, "accuracy": 0.5}}], "subjects": 4, "relations": 1, "d": 2,
            "mlp_width": 2, "embeddings": "trainable", "accuracy": 0.5}}, {str(tmp_path / "f.png")!r})
import matplotlib.pyplot as plt
print(matplotlib.get_backend(), len(plt.get_fignums()))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["svg", "0"], out.stderr
    assert (tmp_path / "f.png").stat().st_size > 1000


def test_load_model_without_arguments_is_the_embedded_model(monkeypatch):
    """None, "default" and the short name name one packaged model (resolved before any path lookup)."""
    from mechfact.llm.models import loading
    from mechfact.llm.models import registry

    seen = []
    monkeypatch.setattr(registry, "model_dir", lambda m: seen.append(m.name) or (_ for _ in ()).throw(ValueError("x")))
    for spec in (None, "default", "smollm2-135m-instruct"):
        with pytest.raises(ValueError, match="x"):
            loading.load_model(spec)
    assert seen == ["smollm2-135m-instruct"] * 3


RESULT_CLASSES = [
    ("mechfact.facts.evaluate", "EvalResult"), ("mechfact.facts.train", "TrainResult"),
    ("mechfact.facts.construct", "ConstructResult"), ("mechfact.memory.train", "TrainOutput"),
    ("mechfact.memory.separable", "SeparableOutput"), ("mechfact.probes.experiments", "ProbeAllResult"),
    ("mechfact.probes.experiments", "InterventionResult"), ("mechfact.probes.patching", "AblationResult"),
    ("mechfact.probes.readout", "ReadoutResult"), ("mechfact.probes.superposition", "SuperpositionResult"),
    ("mechfact.probes.swap", "SwapResult"), ("mechfact.probes.weights", "ScoresResult"),
    ("mechfact.probes.tracing", "TraceResult"), ("mechfact.probes.knockout", "KnockoutResult"),
    ("mechfact.probes.extraction", "AttributeRateResult"), ("mechfact.probes.extraction", "ExtractionResult"),
    ("mechfact.probes.attribution", "AttributionResult"), ("mechfact.probes.state_transfer", "TransferResult"),
    ("mechfact.llm.lre", "LreResult"), ("mechfact.llm.readout", "LayerReadoutResult"),
    ("mechfact.llm.superposition", "LlmSuperpositionResult"),
]


@pytest.mark.parametrize("module,name", RESULT_CLASSES, ids=[n for _, n in RESULT_CLASSES])
def test_every_result_is_a_frozen_dataclass_with_records_and_to_dict(module, name):
    import dataclasses
    import importlib

    cls = getattr(importlib.import_module(module), name)
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, f"{name} is not a frozen dataclass"
    assert callable(getattr(cls, "to_dict", None)), f"{name} has no to_dict()"
    assert hasattr(cls, "records") or "records" in {f.name for f in dataclasses.fields(cls)}, f"{name}: no records"


def test_trainer_results_keep_the_dict_reading_and_have_records(one_thread):
    import json
    import dataclasses

    from mechfact.runs import _jsonable

    world = mechfact.FactWorld(64, 2, seed=0)
    res = mechfact.train(mechfact.build_fact_model(world, d=8, mlp_width=16, seed=0), world,
                         mechfact.TrainConfig(steps=20, eval_every=10))
    assert res["steps"] == res.steps == 20 and "history" in res and len(res["history"]) == 2
    assert set({**res}) == {"accuracy", "per_relation", "token_accuracy", "n_queries", "loss", "steps", "stopped",
                            "history"}
    assert [r["relation"] for r in res.records] == [0, 1]
    assert [r["accuracy"] for r in res.records] == res.per_relation
    assert json.loads(json.dumps(_jsonable(res)))["steps"] == 20
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.steps = 3
    with pytest.raises(KeyError, match="'stepz'.*steps"):
        res["stepz"]
    model, info = mechfact.construct(world, d=2 * 8 + 2)
    assert info["block_size"] == 8 and info.d == model.cfg.d == 18 and info["n_queries"] == world.n_facts


def test_llm_readout_records_use_the_fact_readouts_keys(one_thread):
    """``layer_readout(...).records`` and ``readout(...).records`` name the same numbers alike; result.json rows
    (``per_layer``) keep their stored keys."""
    from mechfact.llm.readout import LayerReadoutResult

    world = mechfact.FactWorld(64, 2, seed=0)
    model, _ = mechfact.construct(world, d=2 * 8 + 2)
    fact_row = mechfact.readout(model, world, [mechfact.Site(mechfact.hooks.embed(), "subject")]).records[0]
    stored = {"relation": "r", "layer": 3, "readout_kind": "classifier", "facts": "all", "readout_accuracy": 0.8,
              "readout_accuracy_ci": [0.6, 0.9], "readout_accuracy_n": 20, "control_accuracy": 0.3, "chance": 0.25}
    res = LayerReadoutResult(model="m", n_layers=4, relations=[], per_layer=[stored])
    row = res.records[0]
    assert row["accuracy"] == 0.8 and row["accuracy_ci"] == [0.6, 0.9] and row["accuracy_n"] == 20
    assert row["kind"] == "classifier" and "readout_accuracy" not in row and "readout_kind" not in row
    shared = {"relation", "kind", "accuracy", "accuracy_ci", "control_accuracy", "chance"}
    assert shared <= set(row) and shared <= set(fact_row), (set(row), set(fact_row))
    assert res.to_dict()["per_layer"][0]["readout_accuracy"] == 0.8


def test_as_queries_is_the_one_way_from_a_source_to_the_queries(construction, tiny):
    """A FactWorld gives its single-hop queries, relations of a pretrained model its k-shot prompts (as
    `probe_set`), a ProbeSet itself; a source the model cannot prompt is refused, naming both."""
    import torch

    import mechfact
    from mechfact.probes.queries import ProbeSet

    model, world = construction
    ps = mechfact.as_queries(model, world)
    ref = ProbeSet.from_world(world)
    assert torch.equal(ps.tokens, ref.tokens) and torch.equal(ps.object_tokens, ref.object_tokens)
    assert mechfact.as_queries(model, ps) is ps
    lm = tiny["models"]["llama"]
    got = mechfact.as_queries(lm, tiny["relations"], k_shot=1, max_samples=6)
    want = mechfact.probe_set(lm, tiny["relations"], k_shot=1, max_samples=6)
    assert torch.equal(got.tokens, want.tokens) and got.relation_names == want.relation_names
    assert len(got) == len(want) > 0
    with pytest.raises(ValueError, match="needs a pretrained model with a tokenizer; a FactModel takes"):
        mechfact.as_queries(model, tiny["relations"])
