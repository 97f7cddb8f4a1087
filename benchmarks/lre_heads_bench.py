"""The LRE authors' protocol with shared prompt heads (run on demand, not in CI).

In a trial of the authors' protocol every test prompt carries the same in-context examples, so the prompts
differ only from their subject on. Prints, measured side by side in one run (same model, same prompts, same
thread count, interleaved repeats, medians):
  1. the states a trial needs (subject state at the middle layer, last-layer state at the last token, greedy
     next token) of every prompt: each prompt run whole (``collect``, what a researcher would write) against
     ``mechfact.llm.lre.shared_prefix.states_shared`` (the shared head once, the tails batched over its cache):
     time ratio, largest state difference, whether every next token agrees;
  2. the causality edits (one prompt, its subject state replaced by 12 vectors: 6 ranks x 2 edits, as a trial
     runs them): the prompt's prefix up to the subject's last token computed per edit (``edited_logits``
     alone) against the shared head's cache with the tail run from the subject's first token (``prefix=``,
     ``start=``): time ratio and largest logit difference.

    python benchmarks/lre_heads_bench.py --threads 1 [--model default] [--relation-file FILE] [--n 60]

``--relation-file``: one relation file of the LRE authors' format (github evandez/relations, ``data/``);
default: the shipped relation with the most facts.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported: idle OpenMP threads sleep

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from mechfact import hooks  # noqa: E402
from mechfact.llm.models.loading import DEFAULT_MODEL, load_model  # noqa: E402
from mechfact.llm.lre.operator import edited_logits  # noqa: E402
from mechfact.llm.prompts import build_prompts  # noqa: E402
from mechfact.llm.relations import load_relation_file, load_relations  # noqa: E402
from mechfact.llm.lre.shared_prefix import Heads, head_of, states_shared  # noqa: E402
from mechfact.probes.queries import ProbeSet, Site, collect  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--relation-file", default=None)
    ap.add_argument("--n", type=int, default=60, help="prompts (the relation's first n facts; 5 of them training)")
    ap.add_argument("--edits", type=int, default=8, help="prompts edited in part 2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args(argv)
    if args.n < 6 + args.edits:
        raise SystemExit(f"--n {args.n}: need at least 6 + --edits ({6 + args.edits}) prompts")
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, device="cpu")
    rel = load_relation_file(args.relation_file) if args.relation_file else max(load_relations(), key=len)
    n = min(args.n, len(rel))
    train = list(range(5))
    prompts = build_prompts(rel, lm.tokenizer, lm.bos_id, examples=train, samples=list(range(n)))
    layer = lm.n_layers // 2
    sites = [Site(hooks.resid(layer, "post"), "subject"), Site(hooks.resid(lm.n_layers - 1, "post"), "last")]
    ps = ProbeSet.from_prompts(prompts, pad_id=lm.pad_id)
    t_whole, t_shared, t_pre, t_head = [], [], [], []
    diff = ldiff = 0.0
    agree = True
    g = torch.Generator().manual_seed(0)
    edited = prompts[6:6 + args.edits]
    for _ in range(args.reps):
        t = time.perf_counter()
        a = collect(lm, ps, sites, batch_size=args.batch_size)
        t_whole.append(time.perf_counter() - t)
        t = time.perf_counter()
        heads = Heads(lm)
        b = states_shared(lm, prompts, sites, args.batch_size, heads)
        t_shared.append(time.perf_counter() - t)
        diff = max(diff, max(float((a[s] - b[s]).abs().max()) for s in sites))
        agree = agree and bool((a.next_token == b.next_token).all())
        S = a[sites[0]]
        new = [S[6 + k] + S[6 + k].norm() * 0.1 * torch.randn(12, lm.d_model, generator=g) for k in range(len(edited))]
        t = time.perf_counter()
        ref = [edited_logits(lm, p.tokens, p.subject_last, layer, v) for p, v in zip(edited, new)]
        t_pre.append(time.perf_counter() - t)
        t = time.perf_counter()
        got = [edited_logits(lm, p.tokens, p.subject_last, layer, v, prefix=heads.cache(head_of(p)),
                             start=p.subject_first) for p, v in zip(edited, new)]
        t_head.append(time.perf_counter() - t)
        ldiff = max(ldiff, max(float((x - y).abs().max()) for x, y in zip(ref, got)))
    med = statistics.median
    out = {"model": lm.name, "relation": rel.name, "threads": args.threads, "n_prompts": n,
           "mean_prompt_tokens": round(sum(len(p.tokens) for p in prompts) / n, 1),
           "mean_tail_tokens": round(sum(len(p.tokens) - p.subject_first for p in prompts) / n, 1),
           "states_whole_s": round(med(t_whole), 3), "states_shared_s": round(med(t_shared), 3),
           "states_ratio": round(med(t_whole) / med(t_shared), 2), "states_max_abs_diff": diff,
           "next_tokens_agree": agree, "edits": len(edited), "edits_prefix_each_s": round(med(t_pre), 3),
           "edits_head_cached_s": round(med(t_head), 3), "edits_ratio": round(med(t_pre) / med(t_head), 2),
           "edit_logits_max_abs_diff": ldiff}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
