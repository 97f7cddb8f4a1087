"""Causal-tracing benchmark (run on demand, not in CI): one fact's full trace, side by side, one thread count.

  (a) ``plain``: what a researcher writes from the tracing authors' code -- one forward pass per (token, layer)
      cell of a batch of 1 clean + ``n_draws`` corrupted copies of the prompt, plain hooks (noise at the
      embedding, the clean state copied into the corrupted rows), every position unembedded, every token traced;
  (b) ``mechfact``: :func:`mechfact.probes.tracing.trace_query` (cells batched, tokens before the subject not
      run, the corrupted runs' states reused so a restored run starts at the block after the restored state,
      only the answer position unembedded).

Prints wall and process CPU seconds per fact and kind, the ratio plain/mechfact, and the largest absolute
difference of the two traces' scores (the same noise draws). A ``--layers`` stride traces the same subset of layers
in both (the full trace of ``plain`` on a 30-layer model takes minutes per kind).

    python benchmarks/trace_bench.py [--threads 1] [--model default] [--kinds state,mlp] [--draws 10]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported: idle OpenMP threads sleep

import argparse  # noqa: E402
import json  # noqa: E402
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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default="default")
    ap.add_argument("--kinds", default="state,mlp")
    ap.add_argument("--draws", type=int, default=10)
    ap.add_argument("--layers", type=int, default=1, help="trace every k-th layer (both methods)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    import mechfact
    from mechfact.llm.trace import relation_queries

    lm = mechfact.load_model(a.model)
    rel = [r for r in mechfact.load_relations() if r.name == "country_capital"]
    q = relation_queries(lm, rel, max_facts=1)[0][0]
    tokens, subject = q["tokens"], q["subject"]
    noise = tracing.noise_scale(lm, [tokens], [subject])
    window = tracing.default_window(lm.n_layers)
    print(f"{lm.name}: {lm.n_layers} layers, prompt of {len(tokens)} tokens, subject tokens {subject}, "
          f"{a.draws} noise draws, window {window}, threads {a.threads}")
    rows = []
    for kind in a.kinds.split(","):
        all_layers = ([-1] if kind == "state" else []) + list(range(lm.n_layers))
        layers = all_layers[::a.layers]
        t0, c0 = time.perf_counter(), time.process_time()
        ours = tracing.trace_query(lm, tokens, subject, kind=kind, window=window, noise=noise, n_draws=a.draws,
                                   index=0, layers=layers)
        t1, c1 = time.perf_counter(), time.process_time()
        plain = plain_trace(lm, tokens, subject, kind, window, noise, a.draws, 0, 0, layers)
        t2, c2 = time.perf_counter(), time.process_time()
        diff = float(np.abs(ours.scores - plain).max())
        row = {"kind": kind, "layers": len(layers), "mechfact_wall_s": t1 - t0, "mechfact_cpu_s": c1 - c0,
               "plain_wall_s": t2 - t1, "plain_cpu_s": c2 - c1, "max_abs_diff": diff}
        row["ratio_cpu"] = row["plain_cpu_s"] / max(row["mechfact_cpu_s"], 1e-9)
        row["ratio_wall"] = row["plain_wall_s"] / max(row["mechfact_wall_s"], 1e-9)
        rows.append(row)
        print(f"{kind}: plain {row['plain_wall_s']:.1f} s wall / {row['plain_cpu_s']:.1f} s CPU, mechfact "
              f"{row['mechfact_wall_s']:.1f} s / {row['mechfact_cpu_s']:.1f} s ({len(layers)} of {len(all_layers)} "
              f"layers, every token); ratio {row['ratio_wall']:.1f}x wall, "
              f"{row['ratio_cpu']:.1f}x CPU; max |difference| {diff:.1e}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
