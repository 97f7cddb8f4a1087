"""What every command module shares: the parser class, the usage error, argument helpers, quiet progress.

``mechfact.cli`` builds its parser from the command modules and dispatches; the command modules import
their helpers from here (never from ``mechfact.cli``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os

from ..device import DEVICE_CHOICES


class UsageError(Exception):
    """Bad command-line input (exit code 2)."""


def finite_float(text: str) -> float:
    """argparse type: a finite number (NaN and inf are refused with the flag's name by argparse)."""
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(text)
    return v


finite_float.__name__ = "finite number"  # argparse: "argument --lr: invalid finite number value: 'inf'"


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        raise UsageError(f"{self.prog}: error: {message}")


def common_args(p: argparse.ArgumentParser, out_required: bool = True) -> None:
    """--device, --seed, --out, --threads, --quiet: every command has them."""
    p.add_argument("--device", default="auto", choices=DEVICE_CHOICES, help="auto picks CUDA when present (default auto)")
    p.add_argument("--seed", type=int, default=0, help="base seed; seeds are seed, seed+1, ... (default 0)")
    p.add_argument("--out", required=out_required, help="run directory (created; reused to resume)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--max-memory", type=finite_float, default=None, metavar="GB",
                   help="refuse work whose estimated memory exceeds this (default: this machine's memory)")


def executor_args(p: argparse.ArgumentParser) -> None:
    """--executor, --workers, --ray-address: sweeps whose jobs are independent (docs/scaling.md)."""
    p.add_argument("--executor", default="local", choices=("local", "ray"),
                   help="local: one job at a time in this process; ray: one Ray task per job (default local)")
    p.add_argument("--workers", type=int, default=None,
                   help="jobs run at once with --executor ray, one CPU and one thread each (default: every core)")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="join a running Ray cluster ('auto' or HOST:PORT); default: start one on this machine")
    p.add_argument("--gpus-per-task", type=finite_float, default=None,
                   help="GPUs each Ray task reserves when the device is CUDA (default 1; 0.5 shares one GPU by two)")


def make_executor_from(a, desc: str):
    """The executor a command's flags ask for; a context manager that closes it (``with make_executor_from(...)``)."""
    from ..executor import make_executor

    return make_executor(a.executor, workers=a.workers, address=a.ray_address, device=a.device_obj,
                         progress=not a.quiet, desc=desc, gpus_per_task=a.gpus_per_task)


@contextlib.contextmanager
def quiet_progress(quiet: bool = True):
    """``--quiet``: no progress bars while the block runs, in this process and in the processes it starts.

    ``TQDM_DISABLE=1`` for child processes (Ray workers import tqdm after it is set). tqdm reads that variable
    once, when it is imported, and torch has imported it by the time the arguments are parsed; so in this
    process the class's own default is switched off too (an explicit ``disable=`` still wins). Both are
    restored when the block ends.
    """
    if not quiet:
        yield
        return
    import functools

    import tqdm

    cls = tqdm.std.tqdm
    env, init = os.environ.get("TQDM_DISABLE"), cls.__dict__["__init__"]
    os.environ["TQDM_DISABLE"] = "1"
    cls.__init__ = functools.partialmethod(init, disable=True)
    try:
        yield
    finally:
        cls.__init__ = init
        if env is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = env


def analysis_args(p: argparse.ArgumentParser, analysis, kinds=None, *, model_default: str | None = None) -> None:
    """The flags of a registered analysis (:mod:`mechfact.analyses`), generated from its declaration: ``--model``
    (required, or ``model_default``), ``--relations`` where a variant takes it, one flag per option of the
    variants for ``kinds`` (default: every kind it runs on; each given flag only, so that a variant's own
    defaults apply), the placement flags for a pretrained model, the executor's where a variant has one, and
    :func:`common_args`."""
    kinds = tuple(kinds or analysis.kinds)
    variants = [analysis.variants[k] for k in kinds if k in analysis.variants]
    pretrained = "pretrained" in kinds
    what = "run directory of `mechfact facts train|construct`"
    if pretrained:
        what += ", or a pretrained model: hub name, local HF folder, .gguf file, short name, default"
    else:
        what += " (needs a fact world)"
    p.add_argument("--model", required=model_default is None, default=model_default, help=what)
    if not variants or any(v.relations for v in variants):
        p.add_argument("--relations", default=None,
                       help="fact model: comma-separated relation ids (default all); pretrained model: a relation "
                            "JSON file or folder (default: the shipped dataset; superposition: 73 countries)")
    mine = {o.name for v in variants for o in v.options} if variants else None
    for o in analysis.options:
        if mine is not None and o.name not in mine:
            continue
        p.add_argument(o.flag, dest=o.dest, default=argparse.SUPPRESS, help=_option_help(analysis, o, kinds),
                       **({"action": argparse.BooleanOptionalAction} if o.kind == "bool" else
                          {"metavar": o.kind.upper(), "nargs": "+" if o.kind == "strs" else None}))
    if pretrained:
        placement_args(p)
    common_args(p)
    if any(v.executor for v in variants):
        executor_args(p)


def placement_args(p: argparse.ArgumentParser) -> None:
    """--device-map / --offload-folder: a pretrained model larger than one device (docs/scaling.md)."""
    p.add_argument("--device-map", default=None, metavar="MAP",
                   help="spread the model with accelerate: auto, balanced, balanced_low_0, sequential, or a JSON "
                        "file of module name -> device (cpu, disk, 0, cuda:1); overrides --device")
    p.add_argument("--offload-folder", default=None, metavar="DIR",
                   help="where weights mapped to 'disk' are kept (default: read from the model's own files)")


def run_analysis_args(a, name: str, kinds=None, run_kw: dict | None = None) -> None:
    """Runs registered analysis ``name`` from the flags :func:`analysis_args` made (``kinds``: the kinds of model
    the command takes)."""
    from ..analyses import ANALYSES, _source, run
    from ..targets import check_target

    an = ANALYSES[name]
    given = {}
    for o in an.options:
        if hasattr(a, o.dest):
            try:
                given[o.name] = o.parse(getattr(a, o.dest))
            except ValueError as exc:
                raise UsageError(str(exc)) from None
    relations = getattr(a, "relations", None)
    if an.variants:
        kind = check_target(a.model)
        if kinds is not None and kind not in kinds:
            raise UsageError(f"--model {a.model}: a {'fact' if kind == 'fact' else 'pretrained'} model; this "
                             f"command takes a {' or '.join(kinds)} model")
        an.variant(kind, given, relations)  # other kinds' flags refused before anything loads
        executor = getattr(a, "executor", None)
        if executor not in (None, "local") and not an.variants[kind].executor:
            raise UsageError(f"--executor {executor}: probe {name} on a {kind} model runs in this process (the "
                             "executor serves the relation-by-relation runs of a pretrained model)")
        if executor is not None and an.variants[kind].executor:
            with make_executor_from(a, f"{name}: relations") as ex:
                an.run_spec(a.model, out=a.out, relations=relations, seed=a.seed, device=a.device_obj,
                            progress=not a.quiet, executor=ex, run_kw=run_kw, **given)
        else:
            an.run_spec(a.model, out=a.out, relations=relations, seed=a.seed, device=a.device_obj,
                        progress=not a.quiet, run_kw=run_kw, **given)
    else:
        from ..targets import load_target

        model, world, _ = load_target(a.model, device=a.device_obj)
        if world is not None and relations is not None:
            raise UsageError(f"--relations {relations}: a fact model runs on its own world; --relations is for a "
                             "pretrained --model")
        run(name, model, _source(model, world, None if world is not None else relations), out=a.out, seed=a.seed,
            device=str(a.device_obj), progress=not a.quiet, model_spec=str(a.model),
            relations=None if world is not None else relations, **given)
    print(f"results written to {a.out}")


def _option_help(analysis, o, kinds) -> str:
    """The option's help, its default (per kind of model where they differ), the kinds of model that take it
    (where not all do) and its choices."""
    def shown(v):
        v = ",".join(map(str, v)) if isinstance(v, (tuple, list)) else v
        return "auto" if v is None else v

    per = {k: next(x for x in analysis.variants[k].options if x.name == o.name) for k in kinds
           if k in analysis.variants and any(x.name == o.name for x in analysis.variants[k].options)}
    text = o.help
    if "default" not in o.help:
        defaults = {k: x.default for k, x in per.items()} or {"": o.default}
        if len({repr(v) for v in defaults.values()}) > 1:
            text += " (default " + ", ".join(f"{shown(v)} on a {k} model" for k, v in defaults.items()) + ")"
        else:
            text += f" (default {shown(next(iter(defaults.values())))})"
    if len(analysis.kinds) > 1 and per and len(per) < len([k for k in kinds if k in analysis.variants]):
        text += "; " + " and ".join(per) + " model only"
    if o.choices:
        text += f"; one of {', '.join(o.choices)}"
    return text.replace("%", "%%")
