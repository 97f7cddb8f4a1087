"""The options of an analysis (:mod:`mechfact.analyses`): what one flag of its command is, read from a
function's keyword parameters (:func:`options_of`) or a config dataclass's fields (:func:`config_options`), with
its type, default, help and spelling; :meth:`Option.parse` reads the flag's text."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Option", "options_of", "config_options", "COMMON_DOCS", "COMMON_FLAGS", "int_list"]

# what an option means, where the function's own signature or the config cannot say it (shared by every analysis)
COMMON_DOCS = {
    "max_facts": "known facts per relation (default: every known fact)",
    "k_shot": "in-context examples in every prompt",
    "template": "index of the relation's prompt template",
    "layers": "comma-separated layers, ranges allowed (0,3,5-8) (default: every layer)",
    "relation_names": "keep only these relations (names; default all)",
    "dtype": "precision the pretrained model runs in",
    "max_samples": "cap: samples per relation (default all; evenly spaced, the LRE round-robin over objects)",
    "batch_size": "prompts per forward pass",
    "cache_states": "read / write the hidden-state disk cache",
    "heldout_fraction": "share of subjects held out",
    "n_splits": "held-out folds scored in turn",
    "layer": "block analysed (default: the middle block; 0 for a one-layer fact model)",
    "kind": "what is restored: the residual state after a block, or a window of MLP / attention outputs",
    "corruption": "noise: Gaussian noise on the subject's embeddings; replace: another subject's tokens",
    "metric": "the clean answer's probability, or its logit minus the corrupted answer's",
}
# the flag of a field when it is not the field's name
COMMON_FLAGS = {"heldout_fraction": "heldout", "n_splits": "splits", "n_trials": "trials",
                "cache_states": "state_cache"}


def int_list(text: str, allow_all: bool) -> tuple[int, ...] | None:
    """``0,3,5-8`` (and ``all`` -> None where every layer is the default)."""
    if allow_all and text.strip().lower() == "all":
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part[1:]:  # a range; its first number may be negative
            head, last = part[1:].split("-", 1)
            out.extend(range(int(part[0] + head), int(last) + 1))
        else:
            out.append(int(part))
    if not out:
        raise ValueError
    return tuple(out)


@dataclass(frozen=True)
class Option:
    """One option of an analysis: its name (the keyword / config field), default, parsed type and help."""

    name: str
    default: Any
    kind: str  # "int", "float", "str", "bool", "ints", "strs"
    help: str
    choices: tuple | None = None
    flag_name: str | None = None  # the flag when it is not the name (heldout_fraction: --heldout)
    parse_text: Callable[[str], Any] | None = None  # a special reading of the text (--ranks authors)

    @property
    def flag(self) -> str:
        return "--" + (self.flag_name or self.name).replace("_", "-")

    @property
    def dest(self) -> str:
        return "opt_" + self.name

    def parse(self, text: Any) -> Any:
        """The value of ``--flag text`` (a list of texts for ``strs``: joined, then split at commas); ValueError
        naming the flag, the bad value and what is allowed."""
        if self.kind == "bool":
            return bool(text)
        if isinstance(text, (list, tuple)):
            text = ",".join(str(t) for t in text)
        if self.parse_text is not None:
            try:
                return self.parse_text(text)
            except ValueError as exc:
                raise ValueError(f"{self.flag} {text}: {exc}") from None
        try:
            if self.kind == "int":
                return int(text)
            if self.kind == "float":
                v = float(text)
                if v != v or v in (float("inf"), float("-inf")):
                    raise ValueError
                return v
            if self.kind == "ints":
                return int_list(text, allow_all=self.default is None)
            if self.kind == "strs":
                return tuple(x.strip() for x in text.split(",") if x.strip())
        except ValueError:
            what = {"int": "an integer", "float": "a finite number",
                    "ints": "comma-separated integers or ranges like 0,3,5-8"
                            + (", or all" if self.default is None else "")}[self.kind]
            raise ValueError(f"{self.flag} {text}: expected {what}") from None
        if self.choices is not None and text not in self.choices:
            raise ValueError(f"{self.flag} {text}: allowed values are {', '.join(self.choices)}")
        return text


def _kind_of(default: Any, hint: Any) -> str | None:
    """The option kind of a default and its annotation; None where no flag can carry it (a nested config)."""
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float):
        return "float"
    if isinstance(default, str):
        return "str"
    if isinstance(default, (tuple, list)) and default:
        return "ints" if all(isinstance(x, int) for x in default) else "strs"
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    base = args[0] if len(args) == 1 else hint
    if base in (int, float, str, bool):
        return {int: "int", float: "float", str: "str", bool: "bool"}[base]
    inner = typing.get_args(base)
    if typing.get_origin(base) in (list, tuple) and inner and inner[0] in (int, str):
        return "ints" if inner[0] is int else "strs"
    return None


def _option(name: str, default: Any, kind: str, docs, flags, choices, parsers) -> Option:
    """An option with its help, choices and flag from the declaration's dicts, else the common ones (``flags``
    None: the flag is the name)."""
    help_ = (docs or {}).get(name) or COMMON_DOCS.get(name) or name.replace("_", " ")
    flag = None if flags is None else flags.get(name) or COMMON_FLAGS.get(name)
    return Option(name, default, kind, help_, (choices or {}).get(name) or _common_choices(name), flag,
                  (parsers or {}).get(name))


def _common_choices(name: str) -> tuple | None:
    """The choices an option of this name has in every analysis (``dtype``: the precisions a model runs in)."""
    if name == "dtype":
        from .llm.models.language_model import DTYPES

        return tuple(DTYPES)
    return None


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
        out.append(_option(p.name, p.default, _param_kind(p.default, hints.get(p.name)), docs, None, choices, None))
    return tuple(out)


def _param_kind(d: Any, hint: Any) -> str:
    """The option kind of a keyword parameter: its default's type, else its annotation's; None and anything
    else: a comma list of integers (``layers=None``)."""
    if isinstance(d, tuple) and not d:  # the annotation says what an empty default holds (tuple[int, ...])
        return "ints" if int in typing.get_args(hint) else "strs"
    kind = _kind_of(d, hint)
    return "ints" if kind in (None, "bool") and not isinstance(d, bool) else kind


def config_options(config: type, *, docs: dict[str, str] | None = None, flags: dict[str, str] | None = None,
                   choices: dict[str, tuple] | None = None, parsers: dict[str, Callable] | None = None,
                   skip: tuple[str, ...] = ()) -> tuple[Option, ...]:
    """One option per field of the config dataclass ``config`` (but ``model``, ``relations`` and ``skip``): the
    field's default and type, its help from ``docs`` (else :data:`COMMON_DOCS`), its flag from ``flags`` (else
    :data:`COMMON_FLAGS`, else the field's name). A field no flag can carry (a nested config) must be skipped."""
    hints = typing.get_type_hints(config)
    out = []
    for f in dataclasses.fields(config):
        if f.name in ("model", *skip) or (f.name == "relations" and f.name not in (flags or {})):
            continue  # --model and --relations are every command's own
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        kind = _kind_of(default, hints.get(f.name, Any))
        if kind is None:
            raise TypeError(f"{config.__name__}.{f.name}: no command-line flag can carry a "
                            f"{hints.get(f.name)!r}; skip it or give the variant its own options")
        out.append(_option(f.name, default, kind, docs, flags or {}, choices, parsers))
    return tuple(out)
