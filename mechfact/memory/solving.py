"""What every linear-memory experiment shares: how W is found, and what a config refuses up front.

:class:`SolverConfig` and :func:`solve` (Hebb, gradient training or the exact LP on a batch of same-shape
problems); the field checks each experiment config's ``__post_init__`` runs; and the refusals made before a run
directory exists (a seed out of range, a size over the memory limit).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..config import DictConfig, bad, check_choice, check_float, check_int, check_type, flag
from ..limits import check_memory
from . import analysis, solvers
from .problems import PROBLEMS, MemoryProblem, p_for_alpha
from .solvers import METHODS, MemoryTrainConfig, hebb_bytes, train_bytes


# ---- validation (run by every config's __post_init__) ------------------------------

def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_d(d) -> None:
    if not _is_int(d) or d <= 0:
        raise bad("d", d, "must be a positive integer")


def _check_ds(ds) -> list[int]:
    if isinstance(ds, (str, bytes)) or not isinstance(ds, (list, tuple)) or not ds:
        raise bad("d", ds, "must be a non-empty list of positive integers")
    for d in ds:
        _check_d(d)
    return list(ds)


def _check_seeds(seeds) -> None:
    if not _is_int(seeds) or seeds < 1:
        raise bad("seeds", seeds, "must be at least 1")


def _check_num(field_: str, value) -> None:
    """A finite real number (not a string or bool); NaN and inf are refused, naming the flag."""
    if isinstance(value, (str, bytes, bool)):
        raise bad(field_, repr(value), "must be a number")
    check_float(field_, value)


def _check_kappa(field_: str, kappa) -> None:
    _check_num(field_, kappa)
    check_float(field_, kappa, lo=0, hi=1, lo_open=True)


def _check_positive(field_: str, value) -> None:
    _check_num(field_, value)
    if value <= 0:
        raise bad(field_, value, "must be positive")


def _check_rel_tol(rel_tol) -> None:
    _check_num("rel_tol", rel_tol)
    if not (0 <= rel_tol < 0.5):
        raise bad("rel_tol", rel_tol, "must lie in [0, 0.5)")


def _check_alpha_range(cfg, lo: str, hi: str) -> list[int]:
    """The checks of a search over loads (sweep, capacity): d values, seeds, solver, 0 < lo < hi. Returns d."""
    ds = _check_ds(cfg.d)
    _check_seeds(cfg.seeds)
    check_type("solver", cfg.solver, SolverConfig)
    a, b = getattr(cfg, lo), getattr(cfg, hi)
    _check_num(lo, a)
    _check_num(hi, b)
    if not (0 < a < b):
        raise ValueError(f"{flag(lo)} {a} / {flag(hi)} {b}: need 0 < {flag(lo)[2:]} < {flag(hi)[2:]}")
    return ds


MAX_POINTS = 10_000  # loads per d of a sweep
SEPARABLE_MAX_P = 5000  # the exact LP's limit (solvers.separable)


def _check_separable_size(s, ds: list[int], field_: str, alpha: float) -> None:
    """The exact LP of ``--method separable`` handles at most SEPARABLE_MAX_P associations: refuse up front."""
    if s.method != "separable":
        return
    for d in ds:
        p = p_for_alpha(alpha, d)
        if p > SEPARABLE_MAX_P:
            raise ValueError(f"--method separable with --d {d} {flag(field_)} {alpha:g}: p = {p} associations, "
                             f"over the exact LP's limit of {SEPARABLE_MAX_P}; use a smaller --d or {flag(field_)}")


MAX_SEED = 2**40  # seeds seed, seed + 1, ... also seed each W's initialisation: an int64 (seed * 7919 + ...)


def _precheck(cfg, seed: int) -> None:
    """What a run refuses before its run directory exists: a --seed the initialisations cannot use, and a size
    over the memory limit (``cfg.check_cost()``)."""
    check_int("seed", seed, -MAX_SEED, MAX_SEED)
    cfg.check_cost()


def _solver_bytes(s: "SolverConfig", d: int, p: int, seeds: int) -> float:
    """Estimated peak bytes of :func:`solve` on ``seeds`` problems of size ``p`` in dimension ``d``."""
    if s.method == "hebb":
        return hebb_bytes(d, p, s.kappa) + 4.0 * seeds * d * d  # one problem at a time; every W is kept
    need = train_bytes(s.problem, d, p, seeds, s.kappa, s.train.active_set)
    if s.method == "separable":  # then one LP at a time: >= 8 constraints per input, d^2 + 1 variables, 3 copies
        need = max(need, 3 * 8.0 * 8 * p * (d * d + 1))
    return need


def _check_memory(rows: list[tuple], s: "SolverConfig") -> None:
    """``rows``: (bytes, flags, d, p, seeds) per shape; refuses the largest one over the memory limit, and a
    decoupled batch whose dense competitors exceed ``dp_memory_gb``."""
    need, what, d, p, seeds = max(rows, key=lambda r: r[0])
    kind = "decoupled" if s.problem == "decoupled" else "original"
    dense = " with dense decoupled competitors" if kind == "decoupled" and s.method != "hebb" else ""
    check_memory(need, f"{what} (p = {p} associations in dimension {d}, {seeds} seed{'s' if seeds != 1 else ''} "
                       f"trained at once{dense})"
                 if s.method != "hebb" else f"{what} (p = {p} associations in dimension {d})")
    if dense:
        for _, what, d, p, seeds in rows:
            gb = 4 * seeds * p * (p - 1) * d / 1e9
            if gb > s.train.dp_memory_gb:
                raise ValueError(f"{what} --problem decoupled: {seeds} x p = {p} inputs with p - 1 dense competitors "
                                 f"of dimension {d} need {gb:.1f} GB, over dp_memory_gb = {s.train.dp_memory_gb:g}; "
                                 "use a smaller --d, load or --seeds")


def _check_top_load(s: "SolverConfig", ds: list[int], field: str, alpha: float, seeds: int) -> None:
    """:func:`_check_memory` at the largest load ``alpha`` (flag ``field``) of every d, all seeds at once."""
    rows = []
    for d in ds:
        p = p_for_alpha(alpha, d)
        rows.append((_solver_bytes(s, d, p, seeds), f"--d {d} {flag(field)} {alpha:g} --seeds {seeds}", d, p, seeds))
    _check_memory(rows, s)


@dataclass
class SolverConfig(DictConfig):
    """How W is found; shared by every experiment."""

    method: str = "trained"  # hebb | trained | separable
    problem: str = "original"  # original | decoupled
    kappa: float = 1.0  # rank fraction: W = Q R^T with m = kappa * d
    train: MemoryTrainConfig = field(default_factory=MemoryTrainConfig)  # gradient training ("trained", hint for
    #                                                                       "separable")

    def __post_init__(self) -> None:
        check_choice("method", self.method, METHODS)
        check_choice("problem", self.problem, PROBLEMS)
        _check_kappa("kappa", self.kappa)
        if self.method == "separable" and self.kappa != 1.0:
            raise bad("kappa", self.kappa, "method separable is exact only for full rank (kappa 1); "
                      "the rank-constrained problem is not a linear program")
        check_type("train", self.train, MemoryTrainConfig)


def solve(problems: list[MemoryProblem], s: SolverConfig, device: torch.device) -> list[dict]:
    """Solve a batch of same-shape problems; one record per problem (with W)."""
    if s.method == "hebb":
        Ws = [solvers.hebb(pr, s.kappa) for pr in problems]
        return [{"W": W, "accuracy": analysis.accuracy(pr, W)} for pr, W in zip(problems, Ws)]
    out = solvers.train(problems, s.kappa, s.train, device=device)
    recs = [{"W": W, "accuracy": a, "steps": st} for W, a, st in zip(out.W, out.accuracy, out.steps)]
    if s.method == "separable":
        for pr, rec in zip(problems, recs):
            sep = solvers.separable(pr, rec["W"])
            rec["separable"] = sep.separable
            rec["trained_accuracy"] = rec["accuracy"]
            if sep.W is not None:
                rec["W"] = sep.W
            rec["accuracy"] = 1.0 if sep.separable else analysis.accuracy(pr, rec["W"])
            rec["lp_t_star"] = sep.t_star
    return recs
