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

The analyses registered here are the causal experiments of :mod:`mechfact.causal`: trace, knockout,
attribute-rate, extraction, attribution, transfer and selectivity.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

__all__ = ["Option", "Analysis", "ANALYSES", "register", "run", "options_of"]

# what an option means, where the function's own signature cannot say it (shared by every analysis)
COMMON_DOCS = {
    "max_facts": "known facts per relation (default: every known fact)",
    "k_shot": "in-context examples in every prompt",
    "template": "index of the relation's prompt template",
    "layers": "comma-separated layers (default: every layer)",
}


@dataclass(frozen=True)
class Option:
    """One keyword option of an analysis: its name, default, parsed type and help."""

    name: str
    default: Any
    kind: str  # "int", "float", "str", "bool", "ints", "strs"
    help: str
    choices: tuple | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, text: str) -> Any:
        """The value of ``--flag text``; ValueError naming the flag, the bad value and what is allowed."""
        try:
            if self.kind == "int":
                return int(text)
            if self.kind == "float":
                v = float(text)
                if v != v or v in (float("inf"), float("-inf")):
                    raise ValueError
                return v
            if self.kind == "ints":
                return tuple(int(x) for x in text.split(",") if x.strip())
            if self.kind == "strs":
                return tuple(x.strip() for x in text.split(",") if x.strip())
        except ValueError:
            what = {"int": "an integer", "float": "a finite number", "ints": "comma-separated integers"}[self.kind]
            raise ValueError(f"{self.flag} {text}: expected {what}") from None
        if self.choices is not None and text not in self.choices:
            raise ValueError(f"{self.flag} {text}: allowed values are {', '.join(self.choices)}")
        return text


def _kind(param: inspect.Parameter, hint: Any) -> str:
    d = param.default
    if isinstance(d, bool):
        return "bool"
    if isinstance(d, int):
        return "int"
    if isinstance(d, float):
        return "float"
    if isinstance(d, str):
        return "str"
    if isinstance(d, tuple):
        if not d:  # the annotation says what an empty default holds (tuple[int, ...]: integers)
            return "ints" if int in typing.get_args(hint) else "strs"
        return "ints" if all(isinstance(x, int) for x in d) else "strs"
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if len(args) == 1 else hint
    if base is int:
        return "int"
    if base is float:
        return "float"
    if base is str:
        return "str"
    return "ints"  # layers=None and the like: a comma list of integers


def options_of(fn: Callable, docs: dict[str, str] | None = None, choices: dict[str, tuple] | None = None,
               skip: tuple[str, ...] = ()) -> tuple[Option, ...]:
    """The keyword options of ``fn`` (after ``model, source``), without ``seed`` and ``progress`` (every command
    has ``--seed`` and ``--quiet``) and ``skip``."""
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - annotations that do not resolve: the defaults decide
        hints = {}
    out = []
    for p in sig.parameters.values():
        if p.kind is not inspect.Parameter.KEYWORD_ONLY or p.name in ("seed", "progress", *skip):
            continue
        help_ = (docs or {}).get(p.name) or COMMON_DOCS.get(p.name) or p.name.replace("_", " ")
        out.append(Option(p.name, p.default, _kind(p, hints.get(p.name)), help_, (choices or {}).get(p.name)))
    return tuple(out)


@dataclass(frozen=True)
class Analysis:
    """A registered analysis (:func:`register`)."""

    name: str
    fn: Callable
    help: str
    options: tuple[Option, ...]
    per_relation: bool = False  # run relation by relation (each summarised) and pooled
    summarise: Callable[[Any, int], dict] | None = None

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


def register(name: str, fn: Callable, *, help: str, docs: dict[str, str] | None = None,
             choices: dict[str, tuple] | None = None, skip: tuple[str, ...] = (), per_relation: bool = False,
             summarise: Callable[[Any, int], dict] | None = None) -> Analysis:
    """Declares analysis ``name`` (module docstring); registering a name twice is an error."""
    if name in ANALYSES:
        raise ValueError(f"analysis {name!r} is registered already")
    a = Analysis(name, fn, help, options_of(fn, docs, choices, skip), per_relation, summarise)
    ANALYSES[name] = a
    return a


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


_register_builtin()
