"""Jacobian benchmark of the linear relational embedding (run on demand, not in CI).

For one k-shot prompt per model (the shipped ``city_country`` relation, five in-context examples as in the
LRE authors' protocol) and the subject layer ``n_layers // 2``, times side by side, one thread count:

  (a) ``old``: the batched-copies method (prefix key/value cache, the suffix as 96 copies through the
      bridge, one backward per 96 rows): ``mechfact.llm.lre.jacobian`` while that is still its own function,
      else the same method kept as ``mechfact.llm.jacobian.jacobian_copies`` (which one ran is printed);
  (b) ``new``: ``mechfact.llm.jacobian.jacobian`` (forward mode from one captured forward pass, the MLPs
      linearised as explicit matrices);
  (c) ``plain``: what a researcher would write -- ``torch.autograd.functional.jacobian`` of a function s -> z
      that runs the whole prompt through the bridge with a hook setting the state (``vectorize=True``; the
      plain loop of one backward per row if that fails; which one ran is printed). It runs on the models of
      ``--plain-models`` only (default: the embedded SmolLM2, to keep the default run short).

Prints wall and process CPU seconds (a shared machine inflates wall time; with one thread CPU seconds are the
work done), the speed-ups old/new and plain/new, and the largest absolute difference between the methods'
Jacobians, also relative to the largest |J|. Each method runs ``--reps`` times in turns; the medians count.

    python benchmarks/jacobian_bench.py [--threads 1] [--models default,qwen2.5-coder-0.5b-instruct] [--reps 1]

A model that is not installed is skipped with its install command. ``--models`` takes any name or path that
``mechfact.load_model`` accepts (e.g. ``gemma3-270m``).
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
from mechfact.llm import jacobian as jac  # noqa: E402
from mechfact.llm.models.loading import load_model  # noqa: E402
from mechfact.llm.prompts import build_prompts  # noqa: E402
from mechfact.llm.relations import load_relations  # noqa: E402
from mechfact.probes.queries import StopForward  # noqa: E402


def plain_jacobian(lm, tokens: list[int], pos: int, layer: int, vectorize: bool):
    """torch.autograd.functional.jacobian of s -> z through the bridge (the whole prompt every call)."""
    toks = torch.tensor([tokens], device=lm.device)

    def f(sv):
        got = {}

        def put(act, hook):
            act = act.clone()
            act[0, pos] = sv
            return act

        def take(act, hook):
            got["o"] = act[0, -1]
            raise StopForward

        try:
            lm.bridge.run_with_hooks(toks, fwd_hooks=[(hooks.resid(layer, "post"), put),
                                                      (hooks.resid(lm.n_layers - 1, "post"), take)])
        except StopForward:
            pass
        return got["o"]

    with torch.no_grad():
        got = {}

        def take_s(act, hook):
            got["s"] = act[0, pos].clone()
            raise StopForward
        try:
            lm.bridge.run_with_hooks(toks, fwd_hooks=[(hooks.resid(layer, "post"), take_s)])
        except StopForward:
            pass
    return torch.autograd.functional.jacobian(f, got["s"], vectorize=vectorize).float().cpu()


def old_method():
    """(name, function) of the batched-copies Jacobian: lre.jacobian while it is its own function."""
    try:
        from mechfact.llm import lre
    except ImportError:
        return "mechfact.llm.jacobian.jacobian_copies", jac.jacobian_copies
    if getattr(lre, "jacobian", jac.jacobian) is jac.jacobian:
        return "mechfact.llm.jacobian.jacobian_copies", jac.jacobian_copies
    return "mechfact.llm.lre.jacobian", lre.jacobian


def timed(fn) -> tuple[float, float, object]:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w, time.process_time() - c, out


def prompt_of(lm, relation: str, sample: int, k: int):
    rel = load_relations(names=[relation])[0]
    examples = [i for i in range(len(rel)) if i != sample][:k]
    return build_prompts(rel, lm.tokenizer, lm.bos_id, examples=examples, samples=[sample])[0]


def bench_model(spec: str, args) -> dict | None:
    try:
        lm = load_model(spec)
    except ValueError as exc:
        print(f"{spec}: skipped ({exc})")
        return None
    p = prompt_of(lm, args.relation, args.sample, args.k)
    layer = lm.n_layers // 2 if args.layer is None else args.layer
    pos = p.subject_last
    print(f"\n{lm.name}: d_model={lm.d_model}, {lm.n_layers} layers, subject layer {layer}, {len(p.tokens)} tokens, "
          f"{len(p.tokens) - pos} from the subject's last on; {torch.get_num_threads()} thread(s)")
    old_name, old_fn = old_method()
    print(f"  old = {old_name}")
    methods = {"old": lambda: old_fn(lm, p.tokens, pos, layer, 96)[0],
               "new": lambda: jac.jacobian(lm, p.tokens, pos, layer)[0]}
    plain_kind = None
    if spec in args.plain_models.split(","):
        def plain():
            nonlocal plain_kind
            if plain_kind != "loop":
                try:
                    out = plain_jacobian(lm, p.tokens, pos, layer, vectorize=True)
                    plain_kind = "vectorize=True"
                    return out
                except Exception as exc:  # noqa: BLE001 - any failure of the vmap path: the plain loop
                    print(f"  plain: vectorize=True failed ({type(exc).__name__}: {str(exc)[:120]}); "
                          "the plain loop runs (its time includes the failed attempt)")
                    plain_kind = "loop"
            return plain_jacobian(lm, p.tokens, pos, layer, vectorize=False)
        methods["plain"] = plain
    jac.jacobian(lm, p.tokens, pos, layer)  # warm-up (first-call allocations)
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in methods}
    Js: dict[str, torch.Tensor] = {}
    for _ in range(args.reps):
        for m, fn in methods.items():
            w, c, J = timed(fn)
            times[m].append((w, c))
            Js[m] = J
    med = {m: (statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)) for m, ts in times.items()}
    scale = float(Js["old"].abs().max())
    row = {"model": lm.name, "old": old_name, "d_model": lm.d_model, "layer": layer, "threads": torch.get_num_threads(),
           "tokens": len(p.tokens), "suffix": len(p.tokens) - pos, "plain": plain_kind, "max_abs_J": scale}
    for m, (w, c) in med.items():
        label = f"plain ({plain_kind})" if m == "plain" else m
        print(f"  {label:<24} wall {w:8.2f} s   cpu {c:8.2f} s")
        row[f"{m}_wall_s"], row[f"{m}_cpu_s"] = w, c
    for m in methods:
        if m == "new":
            continue
        sw, sc = med[m][0] / med["new"][0], med[m][1] / med["new"][1]
        diff = float((Js[m] - Js["new"]).abs().max())
        print(f"  {m}/new: speed-up {sw:5.2f}x wall, {sc:5.2f}x cpu (new/{m} time {1 / sc:.3f});  "
              f"max |J_{m} - J_new| = {diff:.2e} ({diff / scale:.1e} of max |J| = {scale:.3g})")
        row[f"speedup_{m}_wall"], row[f"speedup_{m}_cpu"], row[f"maxdiff_{m}"] = sw, sc, diff
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="default,qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--plain-models", default="default", help="models on which (c) runs (comma-separated)")
    ap.add_argument("--relation", default="city_country")
    ap.add_argument("--sample", type=int, default=6, help="the fact whose prompt is used")
    ap.add_argument("--k", type=int, default=5, help="in-context examples")
    ap.add_argument("--layer", type=int, default=None, help="subject layer (default n_layers // 2)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = [r for spec in args.models.split(",") if (r := bench_model(spec, args)) is not None]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
