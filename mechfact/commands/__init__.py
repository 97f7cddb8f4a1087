"""Subcommands of ``mechfact`` beyond ``memory`` and ``quickstart``: one module per command group, each with ``register(subparsers) -> {name: handler}``."""
