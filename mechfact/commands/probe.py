"""``mechfact probe NAME --model MODEL --out DIR``: every analysis registered in :mod:`mechfact.analyses`.

``NAME``: readout, superposition, intervene, swap, scores, lre, trace, knockout, attribute-rate, extraction,
attribution, transfer, selectivity. Each command's flags are generated from its declaration (the keyword
options of its function, or the fields of its config per kind of model); ``mechfact llm probe|lre|superposition``
are the pretrained-model forms of readout, lre and superposition (same options, same run folders).

``--model`` is a fact-model run directory (``mechfact facts train|construct``) or a pretrained model (hub name,
local Hugging Face folder, ``.gguf`` file, short name, ``default``). On a pretrained model ``--relations`` is a
relation file or folder; on a fact model, relation ids where the analysis takes them. A flag of the other kind
of model is refused, naming it. ``swap`` needs a fact world, ``lre`` a pretrained model.
"""

from __future__ import annotations

from ._args import analysis_args, run_analysis_args


def register(subparsers) -> dict:
    from ..analyses import ANALYSES

    pr = subparsers.add_parser("probe", help="mechanistic probes on a fact run dir or a pretrained model")
    psub = pr.add_subparsers(dest="probe_kind", required=True, parser_class=type(pr))
    for name, an in ANALYSES.items():  # one parser per registered analysis, its flags from its declaration
        analysis_args(psub.add_parser(name, help=an.help), an)
    return {"probe": _run}


def _run(a) -> None:
    run_analysis_args(a, a.probe_kind)
