"""The hand-written prose of ``docs/results_facts.md`` that describes shipped runs (:mod:`synthetic.results_facts`
writes the page; its tables come from the runs). Kept apart so the generator stays short."""

SETUP = r"""Setup common to all runs: a `FactWorld` of N entities and R relations, each
relation a seeded random bijection; the one-layer `FactModel` (embeddings ->
one attention head -> ReLU MLP of width m -> unembedding over the N entities,
no LayerNorm); full-batch Adam on cross-entropy at the answer position; a
setting "reaches" when the exact-match accuracy over ALL N R facts is >= 99%.
The threshold d* (or m*) is the smallest grid value that reaches, found by
bisection over the grid or, with `--scan ascending`, by trying each value in
ascending order (reaching is not monotone in the width at a fixed budget);
every evaluation is stored in `result.json["evaluations"]`.

The commands (each writes a run directory; `--help` lists every option):

```bash
# one model: fig_train.png (accuracy and loss against steps), world.json, model/ (config.json +
# model.safetensors, which every `mechfact probe` command accepts); checkpoint.pt every 500 steps, so a
# rerun with the same --out resumes. result.json: accuracy, per_relation, steps, stopped, history
mechfact facts train --subjects 256 --relations 4 --d 16 --mlp-width 64 --attention uniform \
    --embeddings trainable --hops 1 --lr 3e-2 --schedule warmup-cosine --out runs/train
# the explicit construction, no training (without --d: the smallest block size reaching 99%;
# --hops K --cot for the chain-of-thought construction)
mechfact facts construct --subjects 1024 --relations 4 --out runs/construct
# thresholds: the smallest d (at a fixed MLP width) or MLP width (at a fixed d) reaching 99%, per
# (N, R, regime, seed); settings that never reach are kept with threshold: null
mechfact facts capacity --subjects 256 1024 --relations 2 4 8 --embeddings trainable --search d \
    --lr 3e-2 --schedule warmup-cosine --steps 2000 --out runs/dstar
mechfact facts capacity --subjects 64 128 --relations 1 2 4 --embeddings trainable frozen frozen-input \
    --search mlp-width --d 16 --out runs/width
# multi-hop, direct vs chain of thought at the same d, width and budget
mechfact facts multihop --subjects 32 --relations 4 --hops 1 2 3 --d 16 --mlp-width 32 --out runs/multihop
```

Embedding regimes (`--embeddings`): `trainable`; `frozen` (entity embeddings
AND unembedding fixed at random: the MLP must store the facts); `frozen-input`
(only the input side fixed; the unembedding can then store the facts itself).
k-hop queries `[s, r1, ..., rk]` are answered directly or with chain of thought
(the model emits each intermediate entity; `--cot`). `FactModel` is a
transformer-lens `HookedRootModule` (`hook_embed`, `blocks.0.attn.hook_pattern`,
`blocks.0.mlp.hook_post`, ...), so `run_with_cache` / `run_with_hooks` work as
on a pretrained model.
"""

MULTIHOP_HEAD = """## 5. Multi-hop: direct answering vs chain of thought

`mechfact facts multihop` trains one model per mode on all N R^k k-hop chains
of a bijection world: direct answering (the query `[s, r1, ..., rk]` answered
at once) against chain of thought (the model emits each intermediate entity),
at the same d, MLP width and step budget (Adam 3e-2 with a 5% warm-up and
cosine decay: with a constant lr 1e-2 a CoT run can stall far below 99%
exact-chain accuracy in a bad minimum of the learned attention, which the
schedule or LayerNorm avoids). Direct answering must store the N R^k chains,
chain of thought only the N R single-hop facts plus a procedure (attend to the
current entity and the next relation). `tests/test_facts_experiments.py`
checks k = 3 at N = 32 (CoT >= 0.9, direct < 0.6).

"""

MULTIHOP_INTRO = """`python -m synthetic.facts_study --out runs/facts --part multihop_seed0
multihop_seed1 multihop_seed2` (N = 32, R = 4, k = 1..3, d = 16, MLP width 32,
three seeds) and `--part multihop_N64_d8 multihop_N64_d16 multihop_N64_d32`
(N = 64, R = 4, k = 1..4: up to 16,384 direct chains; MLP width 64, one seed),
learned attention with learned positions, the same optimiser and budget for
both modes,
exported with `--export-multihop docs/runs/multihop`; the table is what
`python -m synthetic.facts_study --out docs/runs/multihop --multihop-table`
prints (exact-chain accuracy over all N R^k chains):
"""

MULTIHOP_NARRATIVE = """At N = 64 direct accuracy falls with k at every width and rises with d at k = 3 and 4
(k = 2 saturates from d = 16), while chain of thought answers every chain at
every k and d, stopping at 99% within 200-1150 steps (direct runs use the
whole 3000-step budget from k = 3 on). The construction beside it puts the gap in widths: a direct lookup
of k-hop answers holds R^k composite relations (d = 64 x 4^(k-1) here, 4096
at k = 4), chain of thought the single-hop table at every k: exponential
against constant in k (the CoT answer takes k steps, linear in k). The
trained models sit far below both constructions (d = 8 stores every
single-hop fact where the construction uses 64).

At N = 1024 (`multihop_N1024_d16` to `_d128`, 262,144 direct chains at
k = 4) the same full-batch schedule (Adam 3e-2, warm-up and cosine, 3000
steps) ran k = 1 and 2 (k = 1 and k = 2 direct on a GPU, `--device cuda`,
k = 2 chain of thought on one CPU thread; every point's `device`), one seed
each. Every width stores the 4,096 single-hop facts (0.999-1.000, stopped at
99% within 50-150 steps); k = 2 direct stays at 0.19-0.25 after the whole
budget at every d from 16 to 128, where at N = 64 it passed 0.99 from
d = 16: the construction's 448 is above every width run. Chain of thought
fails here too: 0.066, 0.217, 0.065 and 0.005 (d = 16, 32, 64, 128), its
loss held at ln 4 = 1.386 from step ~450 to the end at d = 64 (the loss of a
model that spreads each answer evenly over R candidates, consistent with one
that knows the R answers r(x) but not which relation applies; token accuracy
0.25).

**Minibatches leave that plateau.** The `multihop_N1024_b256_d*` parts train
the same models on batches of 256 chains (drawn with replacement) at a
constant Adam 3e-3 for 6000 steps (`--batch-size 256 --lr 3e-3 --schedule
constant --steps 6000 --eval-every 100`; a step sees 64x fewer chains than
a full batch at k = 2, so k = 3 and 4 run on one CPU thread). From d = 64 chain of thought answers
99.2-100% of the chains at k = 2 and 3 (within 1300-2400 steps) and at
d = 128 at k = 4 (1.000) in seed 0, while direct answering falls with k to 0.25, 0.06
and 0.01 at d = 64 and 128 in both seeds (0.23, 0.035, 0.008 at d = 32; at k = 2 and 3 near
the share of chains whose relations are all the same, 1/R^(k-1) = 0.25 and
0.063, at k = 4 below its 0.016): the gap the constructions predict, now
measured at N = 1024. Below d = 64 chain of thought does not train on this
schedule either (d = 16: 0.065, 0.034, 0.007 at k = 2, 3, 4; d = 32: 0.13,
0.11, 0.09, token accuracy 0.38-0.64), and at d = 64, k = 4 it ends the 6000
steps at 0.247 (token accuracy 0.81). Given 20,000 steps
(`multihop_N1024_b256_d64_k4`) it sits at 0.25 from step ~4000 to past step
17,000 and then leaves that plateau too: 0.992 at step 19,500. **A second
seed** (`multihop_N1024_b256_d64_seed1`, `_d128_seed1`) shows that leaving
the plateau within 6000 steps is a matter of the draw, not of k: at d = 64
seed 1 answers k = 4 (1.000 in 3900 steps) but stays at 0.25 at k = 2 and 3
(token accuracy 0.62, 0.75), at d = 128 seed 1 answers k = 2 and 3 (0.998,
0.993 in 1200-1300 steps) but stays at 0.25 at k = 4 (token accuracy 0.81).
At d = 64 and 128 every chain-of-thought run that ends below 99% ends at
0.25 = 1/R, and every one that leaves it reaches 99%. So at this N chain of
thought trains from d = 64 at every k, in 8 of the 12 runs at d = 64 and 128 within 6000 steps
and in the one run given 20,000 (19,500 steps), while direct answering does
not at any width run (0.25, 0.06, 0.01 at k = 2, 3, 4 in both seeds); the
direct k = 4 runs use their whole budget (0.004-0.012, also 0.012 after
20,000 steps). The
construction's direct-lookup d is 1792 at k = 3, 14x the widest model run;
at k = 4 it is at least 7168, 56x the widest model run (the table evaluates
constructions up to 65,536 chains; at 262,144 one evaluation of the
256-relation construction, d = 7168 and MLP width 13,824, is about 5 x 10^13
multiply-adds, so the table gives the bound its scan starts from). The parts ran on one CPU thread, two at a
time on a 2-core machine, in 12-27 min each (48.6 min for the 20,000-step one;
the seed-1 parts 25 and 42 min, three jobs on the two cores)
(`python -m synthetic.facts_study --out runs/facts --part
multihop_N1024_b256_d16 multihop_N1024_b256_d32 multihop_N1024_b256_d64
multihop_N1024_b256_d128 multihop_N1024_b256_d64_k4
multihop_N1024_b256_d64_seed1 multihop_N1024_b256_d128_seed1`, exported with
`--export-multihop docs/runs/multihop`); the full-batch N = 1024 parts'
k = 3 and 4 were not run (`--part multihop_N1024_d64 --device cuda
--resume-from docs/runs/multihop` continues one).

## 6. Throughput

Training speed (examples/s, fraction of the matmul peak, the chunked
cross-entropy against the dense form) is measured by
`python benchmarks/facts_bench.py --threads 1`; its table and what makes
training fast on a CPU (chunked cross-entropy that never materialises the
(queries, N) logits; denormal floats flushed to zero, since a confident model's
softmax underflows into them) are in `docs/benchmarks.md`. Every command here
takes `--device cuda`.

"""

POOL = """## 7. Attribute-pool worlds: the paper's own setting

Sections 1-5 use bijection worlds (every relation a permutation of the N
entities). The paper's setting maps the N subjects into a shared pool of A
attributes; there every single-hop answer is one of the A attributes, so the
fact model predicts over the pool (`--outputs auto`: the pool for single-hop
queries of a pool world, the N entities for bijection worlds and for
multi-hop queries, whose intermediate answers become subjects; `--outputs
entities` restores the full vocabulary). Its thresholds d* and m* over R, A
and N, the step-budget ladder, the laws compared on held-out settings, the
mechanism at and above d*, and the cost of every part not run here are on
their own page, [results_pool.md](results_pool.md), written from run files by
`python -m synthetic.results_pool --out docs/runs/pool --doc
docs/results_pool.md`.
"""
