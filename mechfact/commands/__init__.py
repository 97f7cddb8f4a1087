"""The subcommands of ``mechfact``: one module per command group (``memory``, ``facts``, ``probe``, ``llm``,
``quickstart``), each with ``register(subparsers) -> {name: handler}``; :mod:`mechfact.cli` builds its parser
from them and dispatches.

A handler receives the parsed args (with ``device_obj`` resolved) and raises
:class:`~mechfact.commands._args.UsageError` (also ``mechfact.cli.UsageError``) or ``ValueError`` for bad
input (exit 2). The shared argument helpers are in :mod:`._args`; the run directories of ``mechfact probe``
in :mod:`.probe_runs`.
"""
