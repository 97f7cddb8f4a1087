"""Pretrained-LLM benchmarks (run on demand, not in CI).

Prints figures measured side by side in one run, same model, same batches,
same thread count:
  1. hidden-state extraction (``extract_states``: bridge ``run_with_cache`` with
     ``names_filter`` on every layer's resid_post, one position gathered per
     prompt, greedy next token) against a
     bare Hugging Face forward of the same padded batches: time ratio
     (target <= 1.10), tokens/s of both; interleaved repeats, medians;
  2. peak memory: process peak RSS (CPU) or CUDA peak allocation, and the size
     of the extracted states;
  3. the LRE of one relation (Jacobians batched over output coordinates,
     prefix KV cache reused) end to end: wall time (target < 60 s on 2 cores
     for the default model; wall and process CPU seconds, since a shared
     machine inflates wall time), with its faithfulness and causality.

    python benchmarks/llm_bench.py --threads 2 [--model default] [--device auto] [--skip-lre]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

import torch

from mechfact.device import resolve_device
from mechfact.llm.extract import extract_states, pad_batch
from mechfact.llm.loading import load_model
from mechfact.llm.prompts import build_prompts
from mechfact.llm.relations import load_relations


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def bench_extraction(lm, prompts, batch_size: int, reps: int) -> dict:
    """mechfact's extract_states (every layer, no disk cache) vs a bare HF forward of the same padded batches."""
    seqs = [p.tokens for p in prompts]
    pos = [p.subject_last for p in prompts]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))  # the batches extract_states forms
    batches = [pad_batch([seqs[i] for i in order[j:j + batch_size]], lm.pad_id, "right")[0].to(lm.device)
               for j in range(0, len(seqs), batch_size)]
    hf = lm.bridge.original_model
    dev = lm.device

    def ours():
        extract_states(lm, seqs, pos, batch_size=batch_size, use_cache=False, progress=False)

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
    prompts = build_prompts(rel, lm.tokenizer, lm.bos_id, k=3, seed=0)
    out = {"model": lm.name, "device": str(dev), "threads": a.threads, "relation": rel.name,
           "prompts": len(prompts), "batch_size": a.batch_size}
    out["extraction"] = bench_extraction(lm, prompts, a.batch_size, a.reps)
    out["states_MB"] = round(lm.n_layers * len(prompts) * lm.d_model * 4 / 2**20, 2)
    if not a.skip_lre:
        from mechfact.llm.lre import LreConfig, default_layer, evaluate_relation

        cfg = LreConfig(relation_names=[rel.name], cache_states=False)
        layer = default_layer(lm.n_layers)
        t, c = time.perf_counter(), time.process_time()
        row = evaluate_relation(lm, rel, cfg, layer, seed=0, progress=False)
        out["lre"] = {"layer": layer, "n_train": row["n_train"], "n_test": row["n_test"],
                      "wall_s": round(time.perf_counter() - t, 1), "cpu_s": round(time.process_time() - c, 1),
                      "faithfulness": row["faithfulness"], "causality": row["causality"]}
    out["load_average_1min"] = round(os.getloadavg()[0], 2)  # other processes on the machine during the run
    out["peak_rss_MB"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    if dev.type == "cuda":
        out["cuda_peak_MB"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
