"""``mechfact llm probe|lre|superposition|trace|models``: relational linearity and causal tracing in pretrained LLMs;
the LLM options of ``mechfact probe`` too."""

from __future__ import annotations

import argparse

from ._args import UsageError, common_args, executor_args, finite_float, make_executor_from
from ..llm.models.loading import DTYPES
from ..llm.readout import POSITIONS, SITES
from ..llm.superposition import ATTRIBUTES
from ..probes.queries import PADDING


def _layers(text: str) -> list[int] | None:
    """``all`` or a list like ``0,3,5-8``."""
    if text.strip().lower() == "all":
        return None
    out: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part[1:]:
                a, b = part.split("-", 1)
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
    except ValueError:
        raise UsageError(f"--layers {text}: expected 'all' or integers like 0,3,5-8") from None
    if not out:
        raise UsageError(f"--layers {text}: no layer given")
    return out


def placement_args(p: argparse.ArgumentParser) -> None:
    """--device-map / --offload-folder: a pretrained model larger than one device (docs/scaling.md)."""
    p.add_argument("--device-map", default=None, metavar="MAP",
                   help="spread the model with accelerate: auto, balanced, balanced_low_0, sequential, or a JSON "
                        "file of module name -> device (cpu, disk, 0, cuda:1); overrides --device")
    p.add_argument("--offload-folder", default=None, metavar="DIR",
                   help="where weights mapped to 'disk' are kept (default: read from the model's own files)")


def prompt_args(p: argparse.ArgumentParser) -> None:
    """The prompt options every command on a pretrained model shares (``mechfact llm ...``, ``mechfact probe ...``)."""
    p.add_argument("--relation-names", nargs="+", default=None, help="keep only these relations")
    p.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
    placement_args(p)
    p.add_argument("--k-shot", type=int, default=3, help="in-context examples per prompt (default 3)")
    p.add_argument("--template", type=int, default=0, help="prompt template index per relation (default 0)")
    p.add_argument("--max-samples", type=int, default=None, help="cap: N samples per relation (default all; llm lre takes them "
                   "round-robin over objects, other commands evenly spaced)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--no-state-cache", action="store_true", help="do not read/write the hidden-state disk cache")


def readout_args(p: argparse.ArgumentParser) -> None:
    """The options of the layer-wise readout (``mechfact llm probe``; ``mechfact probe readout`` on an LLM)."""
    p.add_argument("--layers", default="all", help="'all' or e.g. 0,4,8-12 (default all)")
    p.add_argument("--site", default="resid_post", choices=SITES)
    p.add_argument("--position", default="subject_last", choices=POSITIONS, help="subject_last = subject")
    p.add_argument("--known-tokens", type=int, default=1, help="a fact is known if the greedy next tokens match "
                   "the object's first N tokens (default 1)")
    p.add_argument("--readout-on", default="all", choices=("all", "known"), help="facts used by the readout (default all)")
    p.add_argument("--known-only", action="store_true",
                   help="fit and score the readout on the facts the model knows only (= --readout-on known)")
    p.add_argument("--splits", type=int, default=3,
                   help="held-out subject folds scored in turn, each fact once (default 3 of 4 folds)")
    p.add_argument("--split", default="random", choices=("stratified", "random"),
                   help="subjects dealt to folds at random, or each object's subjects spread evenly over the folds "
                        "(default random); every fact of a subject lies on one side")
    p.add_argument("--inner-folds", type=int, default=3,
                   help="folds of the training subjects that choose the reported layer (default 3)")
    p.add_argument("--padding", default="right", choices=PADDING)


def lre_args(p: argparse.ArgumentParser) -> None:
    """The options of the LRE (``mechfact llm lre``, ``mechfact probe lre``), after the model and prompt options."""
    p.add_argument("--layer", type=int, default=None, help="subject layer l (default: n_layers // 2, 15 for the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--layers", default=None,
                   help="sweep subject layers instead, e.g. 3,9,15 or 4-20 (each relation is reported at its best "
                        "layer, every layer kept in per_relation_layer and the figure)")
    p.add_argument("--beta", type=finite_float, default=None,
                   help="LRE scale beta, fixed in advance (default: 2.25, the authors' GPT-J value; 1 with "
                        "--protocol mechfact); the beta chosen on training facts is reported beside it")
    p.add_argument("--rank", type=int, default=64, help="mechfact protocol: rank of the pseudo-inverse for causality "
                   "edits (default 64; the authors' protocol chooses the rank on training facts)")
    p.add_argument("--n-train", type=int, default=5, help="facts whose Jacobians are averaged (default 5)")
    p.add_argument("--facts", default="known", choices=("known", "all"),
                   help="known: only facts the model completes correctly (default); all: every fact, scored "
                        "against the model's own prediction")
    p.add_argument("--max-test", type=int, default=None, help="cap on test facts per relation (default all)")
    p.add_argument("--protocol", default="authors", choices=("authors", "mechfact"),
                   help="authors: Hernandez et al.'s sweep (per trial an object-balanced split, examples = training "
                        "facts, test facts filtered under that prompt, the fact's own object scored, edit targets "
                        "among test facts), every choice made on training facts; mechfact: the first protocol "
                        "(default authors)")
    p.add_argument("--trials", type=int, default=8, help="authors: trials averaged, each its own split, prompt, "
                   "filter and operator (default 8; the paper ran up to 24)")
    p.add_argument("--max-causality", type=int, default=None,
                   help="authors: at most this many causality edits per trial, taken round-robin over objects "
                        "(default: one per test fact, as the authors; the edits are most of a run's time on a "
                        "relation the model knows well); faithfulness still scores every test fact; 0: no edits, faithfulness "
                        "only")
    p.add_argument("--ranks", default=None, help="authors: edit ranks swept, e.g. 16,64,256, or 'authors' for their "
                   "0,8,...,312 (about 7x the edits); default 16..256 and full, up to d_model")


def superposition_args(p: argparse.ArgumentParser) -> None:
    """The options of the superposition test on a pretrained model (``mechfact llm superposition``; ``mechfact probe
    superposition`` on a pretrained ``--model``), after ``--model`` and ``--relations``."""
    p.add_argument("--relation-names", nargs="+", default=None, help="keep only these relations")
    p.add_argument("--layers", default="all", help="'all' or e.g. 0,4,8-12 (default all)")
    p.add_argument("--prompt", default="{}",
                   help="relation-neutral prompt with one {} (default: the subject alone), or 'words' for "
                        "'Some facts about {}' (words before the subject, for any model)")
    p.add_argument("--attributes", default="unembed", choices=ATTRIBUTES,
                   help="attribute code: the object's unembedding row, or a one-hot class code (default unembed)")
    p.add_argument("--folds", type=int, default=None,
                   help="k of the k-fold over subjects (default: 1 / --heldout, i.e. 5)")
    p.add_argument("--splits", type=int, default=1, help="repeats of the k-fold partition (default 1)")
    p.add_argument("--heldout", type=finite_float, default=0.2,
                   help="share of subjects held out per fold when --folds is not given (default 0.2: 5 folds)")
    p.add_argument("--n-null", type=int, default=200,
                   help="draws of each null: shuffled attributes, random attribute vectors, each relation shuffled "
                        "alone, shuffled readout labels (default 200)")
    p.add_argument("--nuisance-pcs", type=int, default=3,
                   help="principal components of the layer-0 state among the nuisance regressors of the partial "
                        "R^2, beside the token count (default 3)")
    p.add_argument("--min-relations", type=int, default=4, help="relations every subject must carry (default 4)")
    p.add_argument("--standardize", action="store_true",
                   help="z-score every coordinate of the state on the training subjects before the fit, so that a "
                        "few large-norm coordinates do not decide the pooled R^2")
    p.add_argument("--drop-massive", action="store_true",
                   help="remove every coordinate that holds more than 10%% of the training subjects' variance "
                        "(a 'massive activation') before the fit")
    p.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
    placement_args(p)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--no-state-cache", action="store_true", help="do not read/write the hidden-state disk cache")


def pretrained_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default",
                   help="hub name, local HF folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--relations", default=None,
                   help="relation JSON file or folder of them (default: the shipped dataset)")
    prompt_args(p)


def register(subparsers) -> dict:
    llm = subparsers.add_parser("llm", help="pretrained LLMs: readout, LRE, superposition, causal tracing")
    sub = llm.add_subparsers(dest="llm_sub", required=True, parser_class=type(llm))

    p = sub.add_parser("probe", help="layer-wise linear readout of the object from the subject state")
    pretrained_model_args(p)
    readout_args(p)
    common_args(p)
    executor_args(p)  # one job per relation; each Ray worker loads the model itself

    p = sub.add_parser("lre", help="linear relational embeddings: faithfulness and causality")
    pretrained_model_args(p)
    lre_args(p)
    common_args(p)
    executor_args(p)  # one job per relation; each Ray worker loads the model itself

    p = sub.add_parser("models", help="the packaged pretrained models: short name, installed or not, install line")
    p.set_defaults(out=None, device="cpu", seed=0, threads=None, quiet=True, max_memory=None)

    p = sub.add_parser("superposition", help="is a subject's state a superposition of its attributes under "
                                             "several relations? (per layer, with controls)")
    p.add_argument("--model", default="default",
                   help="hub name, local HF folder, .gguf file or short name (default: the embedded SmolLM2-135M-Instruct, Q4_1)")
    p.add_argument("--relations", default=None,
                   help="folder of relations that share subjects (default: mechfact/data/countries, 73 countries "
                        "x 5 relations)")
    superposition_args(p)
    common_args(p)

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


def prompt_options(a) -> dict:
    """The :func:`mechfact.llm.prompts.probe_set` / config options of ``prompt_args``."""
    return dict(relation_names=a.relation_names, dtype=a.dtype, k_shot=a.k_shot, template=a.template,
                max_samples=a.max_samples, batch_size=a.batch_size, cache_states=not a.no_state_cache)


def probe_config(a, model: str, relations: str | None):
    """The ProbeConfig of ``mechfact llm probe`` (and of ``mechfact probe readout`` on a pretrained model)."""
    from ..llm.readout import ProbeConfig

    return ProbeConfig(model=model, relations=relations, layers=_layers(a.layers), site=a.site, position=a.position,
                       known_tokens=a.known_tokens, readout_on=a.readout_on, n_splits=a.splits, split=a.split,
                       known_only=a.known_only, inner_folds=a.inner_folds, padding=a.padding,
                       **prompt_options(a))


def _run_llm(a) -> None:
    from ..llm import readout as P

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
    elif a.llm_sub == "superposition":
        run_superposition(a)
    elif a.llm_sub == "probe":
        with make_executor_from(a, "llm probe: relations") as executor:
            P.run_llm_probe(probe_config(a, a.model, a.relations), a.out, device=a.device_obj, seed=a.seed,
                            progress=progress, executor=executor)
    else:
        run_lre(a)
    print(f"results written to {a.out}")


def run_superposition(a) -> None:
    """``mechfact llm superposition`` (and ``mechfact probe superposition`` on a pretrained model)."""
    from ..llm.superposition import LlmSuperpositionConfig, run_llm_superposition

    cfg = LlmSuperpositionConfig(model=a.model, relations=a.relations, relation_names=a.relation_names,
                                 layers=_layers(a.layers), prompt=a.prompt, attributes=a.attributes,
                                 heldout_fraction=a.heldout, n_splits=a.splits, min_relations=a.min_relations,
                                 dtype=a.dtype, batch_size=a.batch_size, cache_states=not a.no_state_cache,
                                 standardize=a.standardize, folds=a.folds, n_null=a.n_null,
                                 nuisance_pcs=a.nuisance_pcs, drop_massive=a.drop_massive)
    run_llm_superposition(cfg, a.out, device=a.device_obj, seed=a.seed, progress=not a.quiet)


def run_lre(a) -> None:
    """``mechfact llm lre`` (and ``mechfact probe lre``)."""
    from ..llm import lre as L
    from ..llm.lre.protocol_authors import AUTHORS_RANKS

    ranks = None if a.ranks is None else list(AUTHORS_RANKS) if a.ranks == "authors" else _layers(a.ranks)
    layers = None if a.layers is None else _layers(a.layers)
    if a.layers is not None and layers is None:
        raise UsageError(f"--layers {a.layers}: llm lre sweeps listed layers, e.g. 3,9,15 or 4-20")
    cfg = L.LreConfig(model=a.model, relations=a.relations, layer=a.layer, layers=layers, beta=a.beta, rank=a.rank,
                      n_train=a.n_train, facts=a.facts, max_test=a.max_test, protocol=a.protocol,
                      n_trials=a.trials, max_causality=a.max_causality, ranks=ranks,
                      **prompt_options(a))
    with make_executor_from(a, "llm lre: relations") as executor:
        L.run_llm_lre(cfg, a.out, device=a.device_obj, seed=a.seed, progress=not a.quiet, executor=executor)
