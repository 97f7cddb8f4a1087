"""The whole LLM pipeline on three real families, offline (slow tier; `.ci/run` installs all three).

Each packaged model (mechfact.llm.models.registry) is loaded by short name: the GGUF is SHA-256-checked, converted once
(about a minute and 3-6 GB the first time), then knows a capital, reads an attribute from the subject state far
above its controls at some layer, and gives an LRE with the authors' protocol. Measured values in each test.
"""

import pytest
import torch

from mechfact.llm.models import registry

MEASURED = {  # (France -> " Paris" rank, best continent readout - its control, LRE best-beta faithfulness), 1 thread
    "smollm2-135m-instruct": (1, 0.75, 0.875),
    "gemma3-270m": (3, 0.55, 1.0),
    "qwen2.5-coder-0.5b-instruct": (1, 0.65, 0.875),
}


def _installed(name: str) -> bool:
    try:
        registry._part_files(registry.MODELS[name])
        return True
    except ValueError:
        return False


@pytest.fixture(scope="module", params=list(MEASURED))
def lm(request):
    if not _installed(request.param):
        pytest.skip(f"{request.param} not installed: {registry.MODELS[request.param].install}")
    import mechfact

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield mechfact.load_model(request.param)
    torch.set_num_threads(n)


@pytest.mark.slow
def test_family_knows_reads_and_is_linear(lm):
    import mechfact

    name = next(k for k, m in registry.MODELS.items() if m.display == lm.name)
    ids = ([lm.bos_id] if lm.prepend_bos else []) + lm.tokenizer("The capital of France is",
                                                                  add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        top = lm(torch.tensor([ids]))[0, -1].topk(5).indices.tolist()
    assert [lm.tokenizer.decode(t) for t in top].index(" Paris") + 1 <= 3, [lm.tokenizer.decode(t) for t in top]

    n = lm.n_layers
    cont = mechfact.load_relations(names=["country_continent"])[0].subset(40)
    res = mechfact.layer_readout(lm, cont, layers=[n // 4, n // 2, (3 * n) // 4], n_splits=2, cache_states=False)
    gap = max(r["accuracy"] - r["control_accuracy"] for r in res.records)
    assert gap >= 0.3, res.records  # measured: MEASURED[name][1]

    cap = mechfact.load_relations(names=["country_capital"])[0].subset(30)
    op = mechfact.lre(lm, cap, layer=n // 2, n_train=5, n_trials=1, max_test=8, ranks=[64], cache_states=False)
    assert op.n_known >= 10 and op.faithfulness_train_beta >= 0.5, (name, op.to_dict())  # measured: MEASURED[name][2]
