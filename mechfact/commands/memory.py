"""``mechfact memory sweep|capacity|scores|spectrum|rank``: linear associative memories (paper A)."""

from __future__ import annotations

import argparse

from ._args import common_args, executor_args, finite_float, make_executor_from


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=5000, help="Adam step budget per run (default 5000)")
    p.add_argument("--lr", type=finite_float, default=1.0, help="Adam learning rate (default 1.0)")
    p.add_argument("--loss", default="ce", choices=("ce", "ce-margin", "hinge2"), help="training loss (default ce)")
    p.add_argument("--patience", type=int, default=1500,
                   help="give up a run after this many steps without fewer errors; 0 = never (default 1500)")
    p.add_argument("--active-set", type=int, default=0,
                   help="train on each input's K strongest competitors, refreshed and checked exactly every 20 steps; "
                        "0 = all competitors (default 0)")


def _solver_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", default="trained", choices=("hebb", "trained", "separable"))
    p.add_argument("--problem", default="original", choices=("original", "decoupled"))
    p.add_argument("--kappa", type=finite_float, default=1.0, help="rank fraction m/d in (0, 1] (default 1)")
    _train_args(p)


def register(sub) -> dict:
    mem = sub.add_parser("memory", help="linear associative memories (paper A)")
    msub = mem.add_subparsers(dest="sub", required=True, parser_class=type(mem))

    p = msub.add_parser("sweep", help="accuracy vs load alpha = p ln p / d^2")
    p.add_argument("--d", type=int, nargs="+", default=[32, 64])
    p.add_argument("--alpha-min", type=finite_float, default=0.05)
    p.add_argument("--alpha-max", type=finite_float, default=1.2)
    p.add_argument("--points", type=int, default=12)
    p.add_argument("--seeds", type=int, default=3)
    _solver_args(p)
    common_args(p)
    executor_args(p)

    p = msub.add_parser("capacity", help="perfect-recall capacity p_c per (d, seed) by bisection")
    p.add_argument("--d", type=int, nargs="+", default=[24, 32, 48, 64])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--alpha-lo", type=finite_float, default=0.02, help="initial lower bracket on alpha (default 0.02)")
    p.add_argument("--alpha-hi", type=finite_float, default=1.5, help="initial upper bracket on alpha (default 1.5)")
    p.add_argument("--rel-tol", type=finite_float, default=0.01, help="bisection resolution on p_c, relative (default 0.01)")
    _solver_args(p)
    common_args(p)
    executor_args(p)

    p = msub.add_parser("scores", help="target vs competitor score distributions, Hebb vs trained")
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--alpha", type=finite_float, default=0.5)
    p.add_argument("--problem", default="original", choices=("original", "decoupled"))
    p.add_argument("--kappa", type=finite_float, default=1.0)
    _train_args(p)
    common_args(p)

    p = msub.add_parser("spectrum", help="singular values of trained (OP, DP), Hebb and initial W")
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--alpha", type=finite_float, default=0.8)
    p.add_argument("--seeds", type=int, default=3, help="instances pooled (default 3)")
    p.add_argument("--kappa", type=finite_float, default=1.0)
    _train_args(p)
    p.set_defaults(steps=3000)
    common_args(p)

    p = msub.add_parser("rank", help="capacity of rank-constrained W = Q R^T against kappa")
    p.add_argument("--d", type=int, nargs="+", default=[24, 32])
    p.add_argument("--kappas", type=finite_float, nargs="+", default=[0.25, 0.5, 0.75, 1.0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--problem", default="original", choices=("original", "decoupled"))
    _train_args(p)
    common_args(p)
    executor_args(p)
    return {"memory": _run}


def _train_cfg(a, **over):
    from ..memory.solvers import MemoryTrainConfig

    return MemoryTrainConfig(lr=a.lr, steps=a.steps, loss=a.loss, patience=a.patience, active_set=a.active_set, **over)


def _run(a) -> None:
    from ..memory import experiments as ex

    device = a.device_obj
    if a.sub in ("sweep", "capacity"):
        solver = ex.SolverConfig(method=a.method, problem=a.problem, kappa=a.kappa, train=_train_cfg(a))
        if a.sub == "sweep":
            cfg = ex.SweepConfig(d=a.d, alpha_min=a.alpha_min, alpha_max=a.alpha_max, points=a.points, seeds=a.seeds, solver=solver)
            run = ex.run_sweep
        else:
            cfg = ex.CapacityConfig(d=a.d, seeds=a.seeds, solver=solver, alpha_lo=a.alpha_lo, alpha_hi=a.alpha_hi,
                                    rel_tol=a.rel_tol)
            run = ex.run_capacity
        with make_executor_from(a, f"memory {a.sub}") as executor:
            run(cfg, a.out, device=device, seed=a.seed, executor=executor)
    elif a.sub == "scores":
        ex.run_scores(ex.ScoresConfig(d=a.d, alpha=a.alpha, problem=a.problem, kappa=a.kappa, train=_train_cfg(a)),
                      a.out, device=device, seed=a.seed)
    elif a.sub == "spectrum":
        ex.run_spectrum(ex.SpectrumConfig(d=a.d, alpha=a.alpha, kappa=a.kappa, seeds=a.seeds, train=_train_cfg(a, early_stop=False)),
                        a.out, device=device, seed=a.seed)
    elif a.sub == "rank":
        cfg = ex.RankConfig(d=a.d, kappas=a.kappas, seeds=a.seeds, problem=a.problem, train=_train_cfg(a))
        with make_executor_from(a, "memory rank") as executor:
            ex.run_rank(cfg, a.out, device=device, seed=a.seed, executor=executor)
    print(f"results written to {a.out}")
