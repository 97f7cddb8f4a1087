"""``mechfact quickstart``: small versions of every capability and one HTML report."""

from __future__ import annotations

from ._args import common_args


def register(sub) -> dict:
    q = sub.add_parser("quickstart", help="small versions of every capability and one HTML report")
    q.add_argument("--fast", action="store_true", help="smoke-sized version (used by the tests)")
    q.add_argument("--full", action="store_true", help="also the slow, secondary runs: the geometric regime on the "
                   "bijection world and five superposition layers")
    q.add_argument("--families", nargs="*", default=None, metavar="NAME",
                   help="also run the readout and superposition on other packaged models and add a side-by-side "
                        "section: no NAME = every installed one (`mechfact llm models`), else the NAMEs given")
    common_args(q, out_required=False)
    q.set_defaults(out="mechfact_quickstart")
    return {"quickstart": _run}


def _run(a) -> None:
    from ..quickstart import run_quickstart

    families = False if a.families is None else (a.families or True)
    if families is not True and families:
        from ..llm.models.registry import MODELS

        bad = [f for f in families if f not in MODELS]
        if bad:
            raise ValueError(f"--families {' '.join(bad)}: unknown model; packaged models: {', '.join(sorted(MODELS))}")
    path = run_quickstart(a.out, device=a.device_obj, seed=a.seed, fast=a.fast, full=a.full, families=families)
    print(f"report: {path}")
