"""On a machine with CUDA (``pytest -m gpu``, run by scripts/gpu_check.sh): every part runs on the GPU and gives
the CPU's numbers within float tolerance. Skipped where there is no CUDA."""

from __future__ import annotations

import json

import pytest
import torch

from mechfact.cli import main

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA on this machine")]


def _result(out):
    return json.loads((out / "result.json").read_text())


def test_memory_sweep_on_cuda_matches_cpu(tmp_path):
    argv = ["memory", "sweep", "--d", "16", "24", "--points", "3", "--seeds", "2", "--steps", "400", "--quiet"]
    assert main([*argv, "--device", "cpu", "--out", str(tmp_path / "cpu")]) == 0
    assert main([*argv, "--device", "cuda", "--out", str(tmp_path / "cuda")]) == 0
    a, b = _result(tmp_path / "cpu")["points"], _result(tmp_path / "cuda")["points"]
    assert [(p["d"], p["p"], p["seed"]) for p in a] == [(p["d"], p["p"], p["seed"]) for p in b]
    # accuracies are fractions of p recalls: at most one recall may flip on a near-tie
    assert all(abs(x["accuracy"] - y["accuracy"]) <= 1.0 / x["p"] + 1e-9 for x, y in zip(a, b))


def test_fact_model_trains_on_cuda(tmp_path):
    argv = ["facts", "train", "--subjects", "32", "--relations", "2", "--d", "16", "--mlp-width", "32",
            "--steps", "400", "--quiet"]
    assert main([*argv, "--device", "cpu", "--out", str(tmp_path / "cpu")]) == 0
    assert main([*argv, "--device", "cuda", "--out", str(tmp_path / "cuda")]) == 0
    a, b = _result(tmp_path / "cpu"), _result(tmp_path / "cuda")
    assert abs(a["accuracy"] - b["accuracy"]) <= 0.05, (a["accuracy"], b["accuracy"])


def test_llm_states_on_cuda_match_cpu():
    from mechfact.llm.models.loading import load_model

    cpu, gpu = load_model("default", device="cpu"), load_model("default", device="cuda")
    toks = cpu.tokenizer(["The capital of France is"], return_tensors="pt").input_ids
    a = cpu(toks)
    b = gpu(toks.to("cuda")).cpu()
    assert a.argmax(-1).equal(b.argmax(-1))
    assert torch.allclose(a, b, atol=1e-2, rtol=1e-3), (a - b).abs().max()


def test_ray_task_sees_the_gpu(tmp_path):
    """--executor ray on CUDA: each task reserves a GPU and the sweep gives the local CUDA result."""
    pytest.importorskip("ray")
    argv = ["memory", "sweep", "--d", "16", "--points", "3", "--seeds", "2", "--steps", "300", "--quiet",
            "--device", "cuda"]
    assert main([*argv, "--out", str(tmp_path / "local")]) == 0
    assert main([*argv, "--executor", "ray", "--workers", "1", "--out", str(tmp_path / "ray")]) == 0
    a, b = _result(tmp_path / "local")["points"], _result(tmp_path / "ray")["points"]
    assert [p["accuracy"] for p in a] == [p["accuracy"] for p in b]
