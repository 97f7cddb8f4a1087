"""Pretrained-LLM benchmarks (run on demand, not in CI).

Prints figures measured side by side in one run, same model, same batches,
same thread count:
  1. hidden-state extraction (``mechfact.probes.queries.collect``: bridge
     ``run_with_cache`` restricted to every layer's resid_post, read at the
     subject's last token, greedy next token, no disk cache) against a bare
     Hugging Face forward of the same padded batches: time ratio (target <= 1.10),
     tokens/s of both; interleaved repeats, medians. The bare forward runs a
     SEPARATE plain HF model loaded from the same checkpoint (the bridge replaces
     the modules of its own HF model in place, so ``bridge.original_model`` is
     not a bare forward);
  2. peak memory: process peak RSS (CPU; it includes the baseline's copy of the
     weights) or CUDA peak allocation, and the size of the extracted states;
  3. the LRE of one relation (``mechfact.lre``: Jacobians batched over output
     coordinates, prefix KV cache reused) end to end: wall time (target < 60 s
     on 2 cores for the default model; wall and process CPU seconds, since a
     shared machine inflates wall time), with its faithfulness and causality.

    python benchmarks/llm_bench.py --threads 2 [--model default] [--device auto] [--skip-lre]

``--model``: ``default`` (the embedded SmolLM2), a local Hugging Face folder or a
hub name (the baseline is loaded with ``AutoModelForCausalLM`` from the same place).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported: idle OpenMP threads sleep

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from mechfact import hooks  # noqa: E402
from mechfact.device import resolve_device  # noqa: E402
from mechfact.llm.models.loading import DEFAULT_MODEL, embedded_model_dir, load_model  # noqa: E402
from mechfact.llm.prompts import probe_set  # noqa: E402
from mechfact.llm.relations import load_relations  # noqa: E402
from mechfact.probes.queries import Site, collect, pad_batch  # noqa: E402


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def bare_model(spec: str, dtype: torch.dtype, device: torch.device):
    """A plain Hugging Face model of the same checkpoint as ``load_model(spec)``, never touched by a bridge."""
    from transformers import AutoModelForCausalLM

    if spec == DEFAULT_MODEL:
        src = embedded_model_dir()
    elif Path(spec).expanduser().is_file():
        raise SystemExit(f"--model {spec}: a .gguf file has no plain HF baseline here; convert it to a folder first")
    else:
        src = Path(spec).expanduser() if Path(spec).expanduser().is_dir() else spec
    return AutoModelForCausalLM.from_pretrained(src, dtype=dtype).to(device).eval()


def bench_extraction(lm, hf, ps, batch_size: int, reps: int) -> dict:
    """mechfact's collect (every layer, no disk cache) vs a bare HF forward (``hf``) of the same padded batches."""
    sites = [Site(hooks.resid(layer, "post"), "subject") for layer in range(lm.n_layers)]
    lengths = ps.lengths.tolist()
    order = sorted(range(len(ps)), key=lambda i: lengths[i])  # the batches collect forms
    batches = [pad_batch([ps.tokens[i, :lengths[i]].tolist() for i in order[j:j + batch_size]], ps.pad_id,
                         "right")[0].to(lm.device)
               for j in range(0, len(ps), batch_size)]
    dev = lm.device

    def ours():
        collect(lm, ps, sites, batch_size=batch_size, cache=False)

    def bare():
        for toks in batches:
            hf(input_ids=toks).logits[:, -1].argmax(-1).cpu()

    t_ours, t_bare = [], []
    with torch.no_grad():
        ours(), bare()  # warm-up
        for _ in range(reps):
            for fn, acc in ((bare, t_bare), (ours, t_ours)):  # interleaved: both see the same machine load
                _sync(dev)
                t = time.perf_counter()
                fn()
                _sync(dev)
                acc.append(time.perf_counter() - t)
    n_tok = sum(int(t.numel()) for t in batches)
    a, b = statistics.median(t_ours), statistics.median(t_bare)
    return {"extraction_s": round(a, 3), "bare_hf_forward_s": round(b, 3), "ratio": round(a / b, 3),
            "tokens": n_tok, "extraction_tok_per_s": round(n_tok / a, 1), "bare_tok_per_s": round(n_tok / b, 1),
            "reps": reps, "all_ratios": [round(x / y, 3) for x, y in zip(t_ours, t_bare)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--relation", default="city_country")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--skip-lre", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dev = resolve_device(a.device)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    lm = load_model(a.model, device=dev)
    rel = load_relations(names=[a.relation])[0]
    ps = probe_set(lm, rel, k_shot=3, seed=0)
    out = {"model": lm.name, "device": str(dev), "threads": a.threads, "relation": rel.name,
           "prompts": len(ps), "batch_size": a.batch_size}
    out["extraction"] = bench_extraction(lm, bare_model(a.model, lm.dtype, dev), ps, a.batch_size, a.reps)
    out["states_MB"] = round(lm.n_layers * len(ps) * lm.d_model * 4 / 2**20, 2)
    if not a.skip_lre:
        from mechfact.llm.lre import lre

        t, c = time.perf_counter(), time.process_time()
        res = lre(lm, rel, seed=0, cache_states=False)  # layer n_layers // 2
        out["lre"] = {"layer": res.layer, "n_train": res.n_train, "n_test": res.n_test,
                      "wall_s": round(time.perf_counter() - t, 1), "cpu_s": round(time.process_time() - c, 1),
                      "faithfulness": res.faithfulness, "causality": res.causality}
    out["load_average_1min"] = round(os.getloadavg()[0], 2)  # other processes on the machine during the run
    out["peak_rss_MB"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    if dev.type == "cuda":
        out["cuda_peak_MB"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
