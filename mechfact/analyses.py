"""One declaration per analysis: its command, its run folder and its Python entry point.

An analysis is a function ``fn(model, source, *, option=default, ..., seed=0, progress=False)`` on a hooked
model and the facts it runs on (a :class:`~mechfact.facts.world.FactWorld`, or relations of a pretrained model),
returning a result with ``summary(seed)`` (or ``to_dict()``). :func:`register` declares it once::

    register("knockout", causal.attention_knockout, help="...", docs={"window": "..."})

and from that one declaration come

* the command ``mechfact probe knockout --model M [--relations R] [--OPTION ...] --out DIR``: one flag per
  keyword option of ``fn``, its type, default and help taken from the signature and ``docs`` (``--model``: a
  fact-model run folder, a hub name, a local Hugging Face folder, a ``.gguf`` file or a packaged short name);
* the run folder (:class:`mechfact.runs.RunDir`): ``config.json`` (the model, the relations and every option,
  defaults included), ``result.json`` (the summary, per relation too where the analysis runs relation by
  relation), ``meta.json``; a finished folder is returned as it is, a folder holding another config is refused;
* the Python entry point :func:`run` (``mechfact.analyses.run("knockout", model, source, out=...)``) and the
  list :data:`ANALYSES`.

An analysis that runs from a config and writes its own run folder is declared by the config instead, one
:class:`Variant` per kind of model (:data:`MODEL_KINDS`)::

    register("scores", help="...", fact=variant(LogitScoresConfig, run_scores),
             pretrained=variant(LogitScoresConfig, run_scores, relations="load", prompts=True))

Its flags are the config's fields (:func:`mechfact.analysis_options.config_options`), each given flag into the
config and the others at the config's defaults; a flag of the other kind of model is refused, naming it; the run
folder is the writer's (:mod:`mechfact.probe_runs`, ``mechfact.llm``'s ``run_llm_*``); :func:`run` takes the
model's spec (a run folder or a pretrained model's name) for these.

Registered here: readout, superposition, lre, intervene, swap and scores (by their configs; ``mechfact llm
probe|lre|superposition`` are the pretrained forms of three of them) and the causal experiments of
:mod:`mechfact.causal` (by their functions): trace, knockout, attribute-rate, extraction, attribution, transfer
and selectivity.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .analysis_options import Option, config_options, int_list, options_of

__all__ = ["Option", "Variant", "Analysis", "ANALYSES", "MODEL_KINDS", "register", "run", "options_of",
           "config_options"]

MODEL_KINDS = ("fact", "pretrained")  # a fact-model run folder, or a pretrained language model


@dataclass(frozen=True)
class Variant:
    """How an analysis runs on one kind of model (:data:`MODEL_KINDS`).

    ``config``: the config dataclass; ``options``: its flags (:func:`config_options`) and the prompt options
    (``load``) that go to building the queries rather than into the config; ``run(spec, cfg, out, *, device,
    seed, progress, [executor], **load)`` writes the run folder and returns result.json's content.
    ``relations``: where ``--relations`` goes (``"ids"``: comma-separated relation ids into the config, a fact
    model; ``"config"``: the relation file or folder into the config; ``"load"``: to the prompts; None: refused).
    ``build``: the config from the option values, where it is not ``config(**values)``.
    """

    config: type
    run: Callable
    options: tuple[Option, ...]
    load: tuple[str, ...] = ()
    relations: str | None = None
    build: Callable[[dict], Any] | None = None
    executor: bool = False

    def configure(self, values: dict, *, spec, relations: str | None = None) -> tuple[Any, dict]:
        """(config, load options) from the given option values (the others keep their defaults)."""
        values = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}  # configs hold lists
        load = {k: values.pop(k) for k in list(values) if k in self.load}
        if relations is not None:
            if self.relations == "ids":
                try:
                    values["relations"] = [int(x) for x in str(relations).split(",") if x.strip()]
                except ValueError:
                    raise ValueError(f"--relations {relations}: expected comma-separated integers (relation ids of a "
                                     "fact model; a relation file or folder goes with a pretrained --model)") from None
            elif self.relations == "config":
                values["relations"] = str(relations)
            elif self.relations == "load":
                load["relations"] = str(relations)
            else:
                raise ValueError(f"--relations {relations}: a fact model runs on its own world; --relations is for "
                                 "a pretrained --model")
        if self.build is not None:
            return self.build(values), self._load(load)
        if "model" in {f.name for f in dataclasses.fields(self.config)}:
            values["model"] = str(spec)
        return self.config(**values), self._load(load)

    def _load(self, load: dict) -> dict:
        if not self.load:
            return {}
        from .llm.readout import PromptOptions

        opts = PromptOptions(**{k: v for k, v in load.items() if k != "relations"})
        return {"relations": load.get("relations"), **opts.to_dict()}


@dataclass(frozen=True)
class Analysis:
    """A registered analysis (:func:`register`): a function on a loaded model (``fn``), or a config and a run
    folder writer per kind of model (``variants``, ``fn`` None)."""

    name: str
    fn: Callable | None
    help: str
    options: tuple[Option, ...]
    per_relation: bool = False  # run relation by relation (each summarised) and pooled
    summarise: Callable[[Any, int], dict] | None = None
    variants: dict = dataclasses.field(default_factory=dict)  # model kind -> Variant

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of model it runs on (:data:`MODEL_KINDS`)."""
        return tuple(self.variants) if self.variants else MODEL_KINDS

    def variant(self, kind: str, given=(), relations: str | None = None) -> Variant:
        """The variant for ``kind``; ValueError where the analysis does not run on that kind, or where options of
        another kind (or ``--relations`` it does not take) were given, naming their flags."""
        if kind not in self.kinds:
            need = {"fact": "a synthetic fact model (world.json)", "pretrained": "a pretrained model"}
            raise ValueError(f"probe {self.name} needs {' or '.join(need[k] for k in self.kinds)}; the --model "
                             f"given is a {'fact model' if kind == 'fact' else 'pretrained model'}")
        v = self.variants[kind]
        mine = {o.name for o in v.options}
        other = [o.flag for o in self.options if o.name in given and o.name not in mine]
        if relations is not None and v.relations is None and any(x.relations for x in self.variants.values()):
            other.append("--relations")
        if other:
            takes = ", ".join(o.flag for o in v.options) or "no options"
            raise ValueError(f"probe {self.name}: {', '.join(other)} apply to "
                             f"{'a pretrained' if kind == 'fact' else 'a fact-model'} --model; "
                             f"{'a fact model' if kind == 'fact' else 'a pretrained model'} takes {takes}")
        return v

    def run_spec(self, spec, *, out, relations: str | None = None, seed: int = 0, device="cpu",
                 progress: bool = False, executor=None, run_kw: dict | None = None, **options) -> dict:
        """Runs a config analysis on the model ``spec`` (a fact-model run folder, or a pretrained model: hub
        name, local folder, ``.gguf``, short name) into the run folder ``out``; result.json's content."""
        from .targets import check_target

        if not isinstance(spec, (str, Path)):
            raise TypeError(f"analysis {self.name} runs on a model spec (a fact-model run folder, hub name, local "
                            f"folder, .gguf file or short name), not on a loaded {type(spec).__name__}")
        known = {o.name for o in self.options}
        bad = sorted(set(options) - known)
        if bad:
            raise ValueError(f"{self.name}: unknown option {', '.join(bad)}; allowed: {', '.join(sorted(known))}")
        v = self.variant(check_target(spec), options, relations)
        cfg, load = v.configure(options, spec=spec, relations=relations)
        kw = {"device": device, "seed": seed, "progress": progress, **(run_kw or {}), **load}
        if v.executor:
            kw["executor"] = executor
        return v.run(spec, cfg, out, **kw)

    def config(self, **options) -> dict:
        """Every option with its value (defaults filled in); an unknown name is a ValueError listing the known."""
        known = {o.name: o for o in self.options}
        bad = sorted(set(options) - set(known))
        if bad:
            raise ValueError(f"{self.name}: unknown option {', '.join(bad)}; allowed: {', '.join(known) or 'none'}")
        return {name: options.get(name, o.default) for name, o in known.items()}

    def summary(self, result: Any, seed: int) -> dict:
        if self.summarise is not None:
            return self.summarise(result, seed)
        return result.summary(seed) if hasattr(result, "summary") else result.to_dict()

    def compute(self, model, source, *, seed: int = 0, progress: bool = False, **options) -> dict:
        """The result's summary (and, relation by relation, each relation's and the pooled one)."""
        opts = self.config(**options)
        if "progress" in inspect.signature(self.fn).parameters:
            opts["progress"] = progress
        if not self.per_relation or not isinstance(source, (list, tuple)):
            return {"summary": self.summary(self.fn(model, source, seed=seed, **opts), seed)}
        per, skipped, results = {}, [], {}
        for rel in source:
            try:
                results[rel.name] = self.fn(model, rel, seed=seed, **opts)
            except ValueError as exc:  # a relation the model knows nothing of is counted, not fatal
                if "no known facts" not in str(exc):
                    raise
                skipped.append(rel.name)
                continue
            per[rel.name] = self.summary(results[rel.name], seed)
        if not results:
            raise ValueError(f"{self.name}: no known facts in any of the {len(source)} relations")
        from dataclasses import replace

        first = next(iter(results.values()))
        pooled = replace(first, facts=tuple(f for r in results.values() for f in r.facts))
        return {"summary": self.summary(pooled, seed), "per_relation": per, "no_known_facts": skipped}


ANALYSES: dict[str, Analysis] = {}


def register(name: str, fn: Callable | None = None, *, help: str, docs: dict[str, str] | None = None,
             choices: dict[str, tuple] | None = None, skip: tuple[str, ...] = (), per_relation: bool = False,
             summarise: Callable[[Any, int], dict] | None = None, fact: Variant | None = None,
             pretrained: Variant | None = None) -> Analysis:
    """Declares analysis ``name`` (module docstring): a function ``fn`` on a loaded model, or a :class:`Variant`
    for a fact model and / or a pretrained one (:func:`variant`); registering a name twice is an error."""
    if name in ANALYSES:
        raise ValueError(f"analysis {name!r} is registered already")
    variants = {k: v for k, v in (("fact", fact), ("pretrained", pretrained)) if v is not None}
    if (fn is None) == (not variants):
        raise ValueError(f"analysis {name!r}: give a function, or a fact / pretrained variant (not both)")
    if fn is not None:
        a = Analysis(name, fn, help, options_of(fn, docs, choices, skip), per_relation, summarise)
    else:
        merged: dict[str, Option] = {}
        for v in variants.values():
            for o in v.options:
                if o.name in merged and (merged[o.name].kind, merged[o.name].flag) != (o.kind, o.flag):
                    raise ValueError(f"analysis {name!r}: option {o.name} is {merged[o.name].flag} "
                                     f"({merged[o.name].kind}) on one kind of model and {o.flag} ({o.kind}) on "
                                     "the other")
                merged.setdefault(o.name, o)
        a = Analysis(name, None, help, tuple(merged.values()), variants=variants)
    ANALYSES[name] = a
    return a


def variant(config: type, run: Callable, *, docs: dict[str, str] | None = None, flags: dict[str, str] | None = None,
            choices: dict[str, tuple] | None = None, parsers: dict[str, Callable] | None = None,
            skip: tuple[str, ...] = (), options: tuple[Option, ...] | None = None, prompts: bool = False,
            relations: str | None = None, build: Callable[[dict], Any] | None = None,
            executor: bool = False) -> Variant:
    """A :class:`Variant`: the options are the fields of ``config`` (:func:`config_options`; or ``options``
    where the config is nested, with ``build``), plus the prompt options of a pretrained model (``prompts``:
    the fields of :class:`mechfact.llm.readout.PromptOptions`, handed to ``run``)."""
    opts = options if options is not None else config_options(config, docs=docs, flags=flags, choices=choices,
                                                              parsers=parsers, skip=skip)
    load: tuple[str, ...] = ()
    if prompts:
        from .llm.readout import PromptOptions

        extra = config_options(PromptOptions, docs=docs, flags=flags, choices=choices)
        opts, load = opts + extra, tuple(o.name for o in extra)
    return Variant(config, run, opts, load, relations, build, executor)


def _source(model, world, relations):
    """What an analysis runs on: the fact model's world, or the relations (default: the shipped dataset)."""
    if world is not None:
        return world
    from .llm.relations import as_relations

    return list(as_relations(relations))


def run(name: str, model, source=None, *, out, seed: int = 0, device: str = "cpu", progress: bool = False,
        model_spec: str | None = None, relations: str | None = None, **options) -> dict:
    """Runs analysis ``name`` on ``model`` and ``source`` (None: the fact model's world is not known here, so
    relations: ``relations`` or the shipped dataset) into the run folder ``out``; returns result.json's content.
    A finished folder with the same config is returned without running; one with another config is refused."""
    from .runs import RunDir, read_json

    if name not in ANALYSES:
        raise ValueError(f"analysis {name!r}: allowed: {', '.join(sorted(ANALYSES))}")
    a = ANALYSES[name]
    if a.variants:
        return a.run_spec(model_spec or model, out=out, relations=relations, seed=seed, device=device,
                          progress=progress, **options)
    cfg = {"model": model_spec or getattr(model, "name", type(model).__name__), "relations": relations,
           **a.config(**options)}
    identity = {"model_id": model.model_id} if getattr(model, "model_id", None) else {}
    rd = RunDir(out, cfg, kind=f"probe.{name}", seed=seed, device=str(device), **identity)
    if (Path(out) / "meta.json").is_file() and (Path(out) / "result.json").is_file():
        from .runs import release

        release(rd.path)
        return read_json(Path(out) / "result.json")
    src = source if source is not None else _source(model, None, relations)
    result = {"analysis": name, **a.compute(model, src, seed=seed, progress=progress, **a.config(**options))}
    return rd.finish(result, model=cfg["model"])


def _sweep_layers(text: str) -> tuple[int, ...]:
    try:
        return int_list(text, allow_all=False)  # "all" is no integer: refused
    except ValueError:
        raise ValueError("the LRE sweeps listed layers, e.g. 3,9,15 or 4-20") from None


def _edit_ranks(text: str) -> tuple[int, ...]:
    from .llm.lre.protocol_authors import AUTHORS_RANKS

    if text.strip().lower() == "authors":
        return tuple(AUTHORS_RANKS)
    try:
        return int_list(text, allow_all=False)
    except ValueError:
        raise ValueError("expected comma-separated ranks, e.g. 16,64,256, or authors") from None


def _swap_config(values: dict):
    from .facts.train import TrainConfig
    from .targets import SwapConfig

    steps, lr = values.pop("steps", 300), values.pop("lr", 1e-2)
    retrain = TrainConfig(lr=lr, steps=steps, eval_every=max(1, steps // 12), target_accuracy=None)
    return SwapConfig(new_seed=values.pop("new_seed", 1), retrain=retrain)


def _register_configured() -> None:
    """The analyses declared with a config per kind of model: readout, superposition, lre, intervene, swap,
    scores."""
    from . import probe_runs as R
    from .llm.lre import LreConfig
    from .llm.readout import POSITIONS, SITES, ProbeConfig
    from .llm.superposition import ATTRIBUTES, LlmSuperpositionConfig
    from .probes.queries import PADDING

    register("readout", help="linear readouts per relation and hook site (fact model) or per layer (pretrained "
                             "model: mechfact llm probe)",
             fact=variant(R.ReadoutConfig, R.run_readout, relations="ids", choices={"kind": ("auto", "vector",
                                                                                             "classifier")},
                          docs={"sites": "HOOK@POSITION ... (default: embed@subject, resid_mid, mlp_post, "
                                         "resid_post @last)",
                                "kind": "vector or classifier readout (auto: vector where the objects have "
                                        "unembedding vectors)",
                                "heldout_fraction": "share of subjects held out",
                                "alpha": "ridge strength of vector readouts (features at unit RMS)"}),
             pretrained=variant(ProbeConfig, R.run_llm_readout, relations="config", executor=True,
                                choices={"site": SITES, "position": POSITIONS, "readout_on": ("all", "known"),
                                         "split": ("stratified", "random"), "padding": PADDING},
                                docs={"site": "where the state is read in each block",
                                      "padding": "side the prompts of a batch are padded on (both exact)",
                                      "position": "subject_last (= subject), subject_first or last",
                                      "known_tokens": "a fact is known if the greedy next tokens match the "
                                                      "object's first N tokens",
                                      "readout_on": "facts used by the readout",
                                      "known_only": "fit and score the readout on the facts the model knows "
                                                    "only (= --readout-on known)",
                                      "heldout_fraction": "share of subjects held out: round(1 / share) folds",
                                      "n_splits": "held-out subject folds scored in turn, each fact once",
                                      "split": "subjects dealt to folds at random, or each object's subjects "
                                               "spread evenly over the folds; every fact of a subject lies on one "
                                               "side",
                                      "inner_folds": "folds of the training subjects that choose the reported "
                                                     "layer",
                                      "C": "logistic-regression regularisation (classifier readout)",
                                      "alpha": "ridge strength of the vector readout (features at unit RMS)"}))
    register("superposition", help="regress subject embeddings (fact model) or states (pretrained model, per "
                                   "layer, with controls: mechfact llm superposition) on their attribute vectors",
             fact=variant(R.SuperpositionConfig, R.run_superposition,
                          docs={"heldout_fraction": "share of subjects held out of the fit"}),
             pretrained=variant(LlmSuperpositionConfig, R.run_llm_superposition, relations="config",
                                choices={"attributes": ATTRIBUTES},
                                docs={"prompt": "relation-neutral prompt with one {} (default: the subject alone), "
                                                "or 'words' for 'Some facts about {}'",
                                      "attributes": "attribute code: the object's unembedding row, or a one-hot "
                                                    "class code",
                                      "heldout_fraction": "share of subjects held out per fold when --folds is "
                                                          "not given (0.2: 5 folds)",
                                      "n_splits": "repeats of the k-fold partition",
                                      "min_relations": "relations every subject must carry",
                                      "standardize": "z-score every coordinate of the state on the training "
                                                     "subjects before the fit",
                                      "folds": "k of the k-fold over subjects (default: 1 / --heldout)",
                                      "n_null": "draws of each null: shuffled attributes, random attribute "
                                                "vectors, each relation shuffled alone, shuffled readout labels",
                                      "nuisance_pcs": "principal components of the layer-0 state among the "
                                                      "nuisance regressors, beside the token count",
                                      "drop_massive": "remove every coordinate that holds more than 10% of the "
                                                      "training subjects' variance before the fit"}))
    register("lre", help="linear relational embeddings (pretrained model): faithfulness and causality "
                         "(mechfact llm lre)",
             pretrained=variant(LreConfig, R.run_llm_lre, relations="config", executor=True,
                                parsers={"layers": _sweep_layers, "ranks": _edit_ranks},
                                choices={"facts": ("known", "all"), "protocol": ("authors", "mechfact")},
                                docs={"layer": "subject layer l (default: n_layers // 2, 15 for the embedded "
                                               "SmolLM2-135M-Instruct)",
                                      "layers": "sweep subject layers instead, e.g. 3,9,15 or 4-20 (each relation "
                                                "reported at its best layer)",
                                      "beta": "LRE scale beta, fixed in advance (default: 2.25, the authors' GPT-J "
                                              "value; 1 with --protocol mechfact)",
                                      "rank": "mechfact protocol: rank of the pseudo-inverse of causality edits",
                                      "n_train": "facts whose Jacobians are averaged",
                                      "facts": "known: only facts the model completes correctly; all: every fact, "
                                               "scored against the model's own prediction",
                                      "max_test": "cap on test facts per relation (default all)",
                                      "max_causality": "authors: at most this many causality edits per trial, "
                                                       "round-robin over objects (default: one per test fact; "
                                                       "0: faithfulness only)",
                                      "chunk": "Jacobian input directions per tangent product (default: all)",
                                      "protocol": "authors: Hernandez et al.'s sweep, every choice made on "
                                                  "training facts; mechfact: the first protocol",
                                      "n_trials": "authors: trials averaged, each its own split, prompt, filter "
                                                  "and operator (the paper ran up to 24)",
                                      "ranks": "authors: edit ranks swept, e.g. 16,64,256, or 'authors' for "
                                               "their 0,8,...,312 (default 16..256 and full)"}))
    iv = {"site": "hook of the units (default blocks.LAYER.mlp.hook_post)",
          "n_units": "units per relation (default: all that prefer it)", "kind": "ablation: zero or mean",
          "relations": "relation ids to ablate (default all)"}
    register("intervene", help="selector-unit ablation, relation selectivity, relation-token swaps",
             fact=variant(R.InterveneConfig, R.run_intervene, relations="ids", skip=("swap_pairs",), docs=iv,
                          flags={"n_units": "units", "kind": "ablation"}, choices={"kind": ("zero", "mean")}),
             pretrained=variant(R.InterveneConfig, R.run_intervene, relations="load", skip=("swap_pairs",),
                                prompts=True, docs=iv, choices={"kind": ("zero", "mean")},
                                flags={"n_units": "units", "kind": "ablation", "relations": "relation_ids"}))
    register("swap", help="freeze-and-swap: new bijections, zero-shot and retrained embeddings",
             fact=variant(R.SwapConfig, R.run_swap, build=_swap_config,
                          options=(Option("new_seed", 1, "int", "seed of the new bijections"),
                                   Option("steps", 300, "int", "retraining steps"),
                                   Option("lr", 1e-2, "float", "retraining Adam lr"))))
    register("scores", help="target vs competitor logits (EVT line) and spectra of effective maps",
             fact=variant(R.LogitScoresConfig, R.run_scores),
             pretrained=variant(R.LogitScoresConfig, R.run_scores, relations="load", prompts=True))


def _register_builtin() -> None:
    from . import causal

    register("trace", causal.causal_trace, skip=("batch_rows",),
             help="causal tracing (Meng et al. 2022): the subject's tokens corrupted, one state (or a window of MLP "
                  "/ attention outputs) restored at a time; the answer's probability recovered, per token bucket "
                  "and layer (the relation-by-relation study with its verdicts: mechfact llm trace)",
             choices={"kind": ("state", "mlp", "attn"), "corruption": ("noise", "replace"),
                      "metric": ("prob", "logit_diff"), "sever": ("mlp", "attn"), "known": ("spells", "prefix")},
             docs={"window": "layers restored at once for mlp / attn (default: 10 of 48, scaled to the depth)",
                   "sever": "with kind state: the later MLP or attention outputs held corrupted",
                   "n_draws": "noise draws per fact", "noise_factor": "noise std in units of the subject "
                   "embeddings' std", "n_replace": "replacement subjects per fact (corruption replace)",
                   "known": "spells: the top token spells the object; prefix: the LRE authors' first-token prefix",
                   "exclude": "comma-separated layers a window never restores (0: the MLP-0-excluded check)"})
    register("knockout", causal.attention_knockout, per_relation=True,
             help="attention knockout (Geva et al. 2023): the last position's attention to the subject / relation "
                  "/ last position blocked over a window of layers; the answer's relative probability change",
             docs={"window": "layers blocked at once (default: scaled to the depth)",
                   "targets": "comma-separated positions whose attention is blocked"})
    register("attribute-rate", causal.attribute_rate,
             help="attribute rate (Geva et al. 2023): share of the top-k logit-lens tokens at each position and "
                  "layer that are the subject's attributes, beside another subject's",
             docs={"k": "logit-lens tokens per position and layer", "positions": "comma-separated positions"})
    register("extraction", causal.extraction_events, per_relation=True,
             help="extraction events (Geva et al. 2023): per layer, the share of known facts whose attention or "
                  "MLP update at the last position has the answer as its logit-lens top-1 token")
    register("attribution", causal.attribution_patching,
             help="attribution patching: the linear estimate of every single-site restoration of a causal trace "
                  "from two forward passes and one backward pass",
             choices={"kind": ("state", "mlp", "attn"), "corruption": ("noise", "replace"),
                      "metric": ("prob", "logit_diff")},
             docs={"agreement": "also the exact trace (window 1) and their rank correlation per prompt",
                   "n_draws": "noise draws per fact", "noise_factor": "noise std in units of the subject "
                   "embeddings' std", "n_replace": "replacement subjects per fact (corruption replace)"})
    register("transfer", causal.state_transfer, skip=("batch_size",),
             help="subject-state transfer: a subject's state read from a neutral context, patched into another "
                  "subject's relation prompt, against a same-length random donor")
    register("selectivity", causal.relation_selectivity,
             help="relation selectivity of the last-position MLP units: ablate the units most selective for one "
                  "relation, measure every relation, against as many random units",
             docs={"layer": "MLP block (default: the middle one)", "n_units": "units ablated per relation",
                   "held_out": "units chosen on one half of the facts, scored on the other (both ways)"})


_register_configured()
_register_builtin()
