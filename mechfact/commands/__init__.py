"""Subcommands of ``mechfact`` beyond ``memory`` and ``quickstart``: one module per command group, each with ``register(subparsers) -> {name: handler}``.

A handler receives the parsed args (with ``device_obj`` resolved) and raises
:class:`mechfact.cli.UsageError` or ``ValueError`` for bad input (exit 2).
"""
