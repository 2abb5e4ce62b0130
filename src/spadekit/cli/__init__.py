"""The ``spadekit`` command: typer + rich front-ends over the layers below, nothing else.

Layer 8: cli.
May import: common, envs, sandbox, runs, policy, rollout, train, eval, curriculum, report, selfplay, integrations.

``app`` holds the typer app and the core commands (selfplay, generate, validate, play, memory,
report, serve, ...); ``train`` the training commands, ``eval`` the evaluation commands,
``compat`` the reference-compatibility commands and ``doctor`` the machine check.
"""

from spadekit.cli.app import main

__all__ = ["main"]
