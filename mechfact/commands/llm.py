"""``mechfact llm probe|lre|superposition|trace|models``: relational linearity and causal tracing in pretrained LLMs.

``llm probe``, ``llm lre`` and ``llm superposition`` are ``mechfact probe readout|lre|superposition`` on a
pretrained model (:data:`ALIASES`): their flags come from the same declarations (:mod:`mechfact.analyses`),
``--model`` defaults to the embedded SmolLM2-135M-Instruct, and ``llm probe``'s run folder is of kind
``llm.probe``.
"""

from __future__ import annotations

import argparse

from ._args import (analysis_args, common_args, executor_args, finite_float, make_executor_from,
                    run_analysis_args)
from ..llm.models.loading import DTYPES

# command -> registered analysis, help
ALIASES = (("probe", "readout", "layer-wise linear readout of the object from the subject state"),
           ("lre", "lre", "linear relational embeddings: faithfulness and causality"),
           ("superposition", "superposition", "is a subject's state a superposition of its attributes under "
                                              "several relations? (per layer, with controls)"))


def register(subparsers) -> dict:
    llm = subparsers.add_parser("llm", help="pretrained LLMs: readout, LRE, superposition, causal tracing")
    sub = llm.add_subparsers(dest="llm_sub", required=True, parser_class=type(llm))

    from ..analyses import ANALYSES

    # the pretrained-model forms of three registered analyses, their flags from the same declarations
    for name, analysis, what in ALIASES:
        analysis_args(sub.add_parser(name, help=what), ANALYSES[analysis], ("pretrained",), model_default="default")

    p = sub.add_parser("models", help="the packaged pretrained models: short name, installed or not, install line")
    p.set_defaults(out=None, device="cpu", seed=0, threads=None, quiet=True, max_memory=None)

    p = sub.add_parser("trace", help="causal tracing: where restoring one clean state brings a corrupted fact back")
    p.add_argument("--model", default="default",
                   help="hub name, local HF folder, .gguf file or short name (default: the embedded SmolLM2-135M-Instruct, Q4_1)")
    p.add_argument("--relations", nargs="+", default=None, metavar="SOURCE",
                   help="relation JSON files or folders of them; 'shipped': the shipped dataset (default: shipped)")
    p.add_argument("--relation-names", nargs="+", default=None, help="keep only these relations")
    p.add_argument("--kinds", nargs="+", default=None, metavar="KIND",
                   help="what is restored: state (the residual after a block), mlp, attn (a window of layers), "
                        "severed_mlp, severed_attn (the state with the later MLP / attention outputs at that token "
                        "held corrupted) (default: state mlp attn)")
    p.add_argument("--kind", dest="kinds", action="append", help=argparse.SUPPRESS)
    p.add_argument("--corruption", default="noise", choices=("noise", "replace"),
                   help="noise: Gaussian noise on the subject's embeddings; replace: another subject of the same "
                        "token length (default noise)")
    p.add_argument("--metric", default="prob", choices=("prob", "logit_diff"),
                   help="probability of the clean answer, or (replace) its logit minus the corrupted answer's")
    p.add_argument("--window", type=int, default=None, help="layers restored together by mlp / attn (default: 10 "
                   "of 48 scaled to the depth)")
    p.add_argument("--draws", type=int, default=10, help="noise draws per fact (default 10)")
    p.add_argument("--noise-factor", type=finite_float, default=3.0,
                   help="noise scale in standard deviations of the subject embeddings (default 3)")
    p.add_argument("--replacements", type=int, default=5, help="replacement subjects per fact (default 5)")
    p.add_argument("--max-facts", type=int, default=20, help="known facts traced per relation (default 20)")
    p.add_argument("--k-shot", type=int, default=0, help="in-context examples per prompt (default 0: zero-shot, "
                   "as the tracing authors)")
    p.add_argument("--template", type=int, default=0, help="prompt template index per relation (default 0)")
    p.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
    p.add_argument("--batch-rows", type=int, default=256, help="rows per forward pass (default 256)")
    p.add_argument("--layers", nargs="+", type=int, default=None, metavar="L",
                   help="the layers traced (default every layer; -1, the embedding, with state)")
    p.add_argument("--known", default="spells", choices=("spells", "prefix"),
                   help="facts traced: spells (the top-1 token spells the object; ' the' before 'the United States' "
                        "does not count; default) or prefix (the LRE authors' first-token prefix match)")
    common_args(p)
    executor_args(p)  # one job per relation; each Ray worker loads the model itself
    return {"llm": _run_llm}


def _run_llm(a) -> None:
    progress = not a.quiet
    if a.llm_sub == "models":
        from ..llm.models.registry import status

        for row in status():
            print(f"{row['name']:>27}  {'installed' if row['installed'] else 'not installed':<13}  {row['model']}: "
                  f"{row['note']}\n{'':>29}{row['install']}")
        return
    if a.llm_sub == "trace":
        from ..llm.trace import TraceConfig, run_llm_trace

        cfg = TraceConfig(model=a.model, relations=a.relations, relation_names=a.relation_names, kinds=a.kinds,
                          corruption=a.corruption, metric=a.metric, window=a.window, n_draws=a.draws,
                          noise_factor=a.noise_factor, n_replace=a.replacements, max_facts=a.max_facts,
                          k_shot=a.k_shot, template=a.template, dtype=a.dtype, batch_rows=a.batch_rows,
                          layers=a.layers, known=a.known)
        with make_executor_from(a, "llm trace: relations") as executor:
            run_llm_trace(cfg, a.out, device=a.device_obj, seed=a.seed, progress=progress, executor=executor)
    else:
        name = {alias: analysis for alias, analysis, _ in ALIASES}[a.llm_sub]
        run_analysis_args(a, name, ("pretrained",), {"kind": "llm.probe"} if a.llm_sub == "probe" else None)
        return
    print(f"results written to {a.out}")
