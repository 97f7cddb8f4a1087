"""Causal-tracing benchmark (run on demand, not in CI): full traces of a few known facts, three ways, one thread count.

  (a) ``plain``: what a researcher writes from the tracing authors' code -- one forward pass per (token, layer)
      cell of a batch of 1 clean + ``n_draws`` corrupted copies of the prompt, plain hooks (noise at the
      embedding, the clean state copied into the corrupted rows), every position unembedded, every token traced;
  (b) ``today``: :func:`mechfact.probes.tracing.trace_query` with ``suffix=False`` (cells batched, tokens before the
      subject not run, each restored run starting at the block after the restored state from the corrupted runs'
      cached residual stream, only the answer position unembedded) -- the tracer before the suffix runs;
  (c) ``mechfact``: the same with ``suffix=True`` (the default): restored runs compute only the tokens from the
      restored one on (the tokens before it read from the corrupted runs' keys and values), each cell's rows
      joining the batch at the block where its run first differs.

Prints process CPU seconds per fact and kind, the ratios, the largest absolute difference of the scores (the same
noise draws), and full traces per CPU-second. The plain loop runs on every ``--plain-stride``-th layer (its full
30-layer trace takes minutes per kind), against (c) on the same layers.

And the arithmetic: the multiply-adds of the weight matrices that (c) computes (token-block rows times a block's
weights, and each restored run's answer position times the unembedding, which the probability metric needs whole),
the least an exact trace needs (the same, less the last block's rows at tokens other than the answer, which need
only their keys and values, and less the cells restoring the last block's state, whose scores need no run), and the
single-thread rate of a plain matrix product of the block's shapes measured in the same run. Their quotient bounds
what a float32 tracer that runs each restored row through the blocks it changes can reach on this CPU: today's
path's CPU seconds over (the least FLOP / that rate) is the largest speed-up over it that the arithmetic allows
(attention scores, norms, activations and the clean and corrupted runs not even counted).

    python benchmarks/trace_bench.py [--threads 1] [--model default] [--relations country_capital,country_continent]
                                     [--kinds state,mlp] [--draws 10] [--plain-stride 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported: idle OpenMP threads sleep

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from mechfact import hooks  # noqa: E402
from mechfact.probes import tracing  # noqa: E402
from mechfact.seeding import derive_seed  # noqa: E402


def plain_trace(lm, tokens, subject, kind, window, noise, n_draws, seed, index, layers):
    """The per-cell loop, as the tracing authors' code runs it (their ``trace_with_patch``)."""
    s0, s1 = subject
    L = lm.n_layers
    g = torch.Generator().manual_seed(derive_seed(seed, "probes.tracing.noise", index))
    eps = torch.randn(n_draws, s1 - s0 + 1, lm.d_model, generator=g) * noise
    batch = tokens[None].repeat(n_draws + 1, 1)
    with torch.no_grad():
        y = int(lm(tokens[None])[0, -1].argmax())

    def add_noise(x, hook):
        x[1:, s0:s1 + 1] += eps.to(x.dtype)
        return x

    out = np.zeros((len(tokens), len(layers)))
    for t in range(len(tokens)):
        for k, layer in enumerate(layers):
            if kind == "state":
                names = [hooks.embed() if layer < 0 else hooks.resid(layer, "post")]
            else:
                names = [hooks.mlp_out(l) if kind == "mlp" else hooks.attn_out(l)
                         for l in tracing.window_layers(layer, window, L)]
            fh = [(hooks.embed(), add_noise)]
            for nm in names:
                def put(x, hook, t=t):
                    x[1:, t] = x[0, t]
                    return x
                fh.append((nm, put))
            with torch.no_grad():
                logits = lm.run_with_hooks(batch, fwd_hooks=fh)
            out[t, k] = float(torch.softmax(logits[1:, -1].float(), -1)[:, y].mean())
    return out


def block_weights(lm) -> tuple[int, int, int]:
    """One decoder block's (weights of its matrices, of its key and value projections: multiply-adds per token; the
    MLP's inner width)."""
    from mechfact.probes.trace_suffix import _block_list
    blocks = _block_list(lm)
    if blocks is None:
        raise SystemExit(f"{lm.name}: no decoder block list found; the FLOP count needs the bridge's blocks")
    mats = [(n, p) for n, p in blocks[0].named_parameters() if p.ndim == 2]
    return (sum(p.numel() for _, p in mats),
            sum(p.numel() for n, p in mats if re.search(r"(^|\.)(k_proj|v_proj)\.", n)),
            max(p.shape[0] for n, p in mats if re.search(r"(up|gate)_proj", n)))


def trace_rows(n: int, subject: tuple[int, int], kind: str, window: int, L: int,
               layers: list[int]) -> tuple[int, int, int, int]:
    """Per noise draw, the restored runs of one trace: (token-block rows the suffix runs compute, the last block's
    rows at a token other than the answer among them, cells (each unembeds its answer position), cells that need
    no run). A cell (token t >= the subject's first, layer) runs tokens t..n-1 through every block after the one
    where it first differs: the restored state's block (``state``), or the block before its window's first layer;
    one restoring the last block's state leaves the answer at its corrupted (t before it) or clean state."""
    rows = last = cells = idle = 0
    for t in range(subject[0], n):
        for layer in layers:
            first = layer if kind == "state" else tracing.window_layers(layer, window, L)[0] - 1
            blocks = L - 1 - first
            rows += (n - t) * blocks
            last += (n - t - 1) * (blocks > 0)
            cells += 1
            idle += blocks == 0
    return rows, last, cells, idle


def trace_flop(counts: tuple[int, int, int, int], W: int, W_kv: int, U: int, draws: int,
               least: bool = False) -> float:
    """FLOP of the weight matrices for :func:`trace_rows`' counts: every row through a block's ``W`` weights and each
    cell's answer through the unembedding's ``U``; ``least``: the last block's non-answer rows through their keys
    and values only, and no cell that needs no run."""
    rows, last, cells, idle = counts
    if least:
        return 2.0 * draws * (rows * W - last * (W - W_kv) + (cells - idle) * U)
    return 2.0 * draws * (rows * W + cells * U)


def matmul_rate(d_model: int, d_inner: int, rows: int = 2048, reps: int = 10) -> float:
    """FLOP per CPU-second of a (rows, d_model) x (d_model, d_inner) product and back, on the threads set."""
    x, w1, w2 = torch.randn(rows, d_model), torch.randn(d_model, d_inner), torch.randn(d_inner, d_model)
    for _ in range(2):
        (x @ w1) @ w2
    c0 = time.process_time()
    for _ in range(reps):
        (x @ w1) @ w2
    return 4 * rows * d_model * d_inner * reps / (time.process_time() - c0)


def _timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default="default")
    ap.add_argument("--relations", default="country_capital,country_continent",
                    help="shipped relations, one known fact each (default: a subject late and one early in the prompt)")
    ap.add_argument("--kinds", default="state,mlp")
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--plain-stride", type=int, default=3,
                    help="the plain loop traces every k-th layer (mechfact traced again on the same layers for its "
                         "ratio); today's path and mechfact run every layer")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    import mechfact
    from mechfact.llm.trace import relation_queries

    lm = mechfact.load_model(a.model)
    names = a.relations.split(",")
    rels = [r for r in mechfact.load_relations() if r.name in names]
    queries, _ = relation_queries(lm, rels, max_facts=1, known="spells")
    window = tracing.default_window(lm.n_layers)
    noise = tracing.noise_scale(lm, [q["tokens"] for q in queries], [q["subject"] for q in queries])
    W, W_kv, d_inner = block_weights(lm)
    U = lm.W_U.numel()
    rate = matmul_rate(lm.d_model, d_inner)
    print(f"{lm.name}: {lm.n_layers} layers, {len(queries)} facts, {a.draws} noise draws, window {window}, "
          f"threads {a.threads}; {W / 1e6:.2f} M weights a block ({W_kv / 1e6:.2f} M keys and values), {U / 1e6:.1f} M "
          f"in the unembedding; a plain "
          f"({lm.d_model} x {d_inner}) matrix product runs at {rate / 1e9:.0f} GFLOP/s")
    rows = []
    for q in queries:
        tokens, subject = q["tokens"], q["subject"]
        for kind in a.kinds.split(","):
            all_layers = ([-1] if kind == "state" else []) + list(range(lm.n_layers))
            some = all_layers[::a.plain_stride]

            def ours(layers, suffix=True):
                return tracing.trace_query(lm, tokens, subject, kind=kind, window=window, noise=noise,
                                           n_draws=a.draws, index=q["index"], layers=layers, suffix=suffix)
            new, new_w, new_c = _timed(lambda: ours(all_layers))
            old, old_w, old_c = _timed(lambda: ours(all_layers, suffix=False))
            new_s, _, new_s_c = _timed(lambda: ours(some))
            plain, plain_w, plain_c = _timed(lambda: plain_trace(lm, tokens, subject, kind, window, noise, a.draws,
                                                                  0, q["index"], some))
            row = {"relation": q["relation"], "tokens": len(tokens), "subject": list(subject), "kind": kind,
                   "layers": len(all_layers), "mechfact_cpu_s": new_c, "mechfact_wall_s": new_w,
                   "today_cpu_s": old_c, "today_wall_s": old_w, "plain_layers": len(some),
                   "plain_cpu_s": plain_c, "mechfact_on_plain_layers_cpu_s": new_s_c,
                   "diff_today": float(np.abs(new.scores - old.scores).max()),
                   "diff_plain": float(np.abs(new_s.scores - plain).max())}
            counts = trace_rows(len(tokens), subject, kind, window, lm.n_layers, all_layers)
            row["flop"] = trace_flop(counts, W, W_kv, U, a.draws)
            row["flop_least"] = trace_flop(counts, W, W_kv, U, a.draws, least=True)
            row["gflops"] = row["flop"] / max(new_c, 1e-9) / 1e9
            row["share_of_matmul"] = row["flop"] / max(new_c, 1e-9) / rate
            row["ceiling_vs_today"] = old_c / (row["flop_least"] / rate)
            row["flop_least_plain_layers"] = trace_flop(trace_rows(len(tokens), subject, kind, window, lm.n_layers,
                                                                   some), W, W_kv, U, a.draws, least=True)
            row["ceiling_vs_plain"] = plain_c / (row["flop_least_plain_layers"] / rate)
            row["vs_today"] = old_c / max(new_c, 1e-9)
            row["vs_plain"] = plain_c / max(new_s_c, 1e-9)
            rows.append(row)
            print(f"{q['relation']} ({len(tokens)} tokens, subject {subject[0]}-{subject[1]}) {kind}: mechfact "
                  f"{new_c:.1f} CPU s, today's path {old_c:.1f} ({row['vs_today']:.1f}x, max |diff| "
                  f"{row['diff_today']:.1e}); on {len(some)} layers plain {plain_c:.1f} vs {new_s_c:.1f} "
                  f"({row['vs_plain']:.1f}x, max |diff| {row['diff_plain']:.1e}); {row['flop'] / 1e12:.2f} TFLOP at "
                  f"{row['gflops']:.0f} GFLOP/s ({row['share_of_matmul']:.0%} of the matrix product's); an exact "
                  f"tracer at that rate: at most {row['ceiling_vs_today']:.1f}x today's path, "
                  f"{row['ceiling_vs_plain']:.1f}x the plain loop")
    tot = {k: sum(r[k] for r in rows) for k in ("mechfact_cpu_s", "today_cpu_s", "plain_cpu_s",
                                                "mechfact_on_plain_layers_cpu_s", "flop_least",
                                                "flop_least_plain_layers")}
    n = len(rows)
    print(f"full traces (fact x kind) per CPU-second: mechfact {n / tot['mechfact_cpu_s']:.3f}, today's path "
          f"{n / tot['today_cpu_s']:.3f} ({tot['today_cpu_s'] / tot['mechfact_cpu_s']:.2f}x); against the plain loop "
          f"on the same layers {tot['plain_cpu_s'] / tot['mechfact_on_plain_layers_cpu_s']:.1f}x; the least FLOP "
          f"of exact traces at the matrix product's rate: {n / (tot['flop_least'] / rate):.3f} "
          f"({tot['today_cpu_s'] / (tot['flop_least'] / rate):.2f}x today's path; "
          f"{tot['plain_cpu_s'] / (tot['flop_least_plain_layers'] / rate):.1f}x the plain loop "
          f"on its layers)")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
