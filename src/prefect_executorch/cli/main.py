"""``prefect-executorch``: the commands, by group (``build``, ``bundles``, ``fleet``) on one app, and ``run``."""

from __future__ import annotations

import sys

# Each import registers its commands on ``app``, in the order --help lists them.
from prefect_executorch.cli import build, bundles, fleet  # noqa: F401
from prefect_executorch.cli.app import app
from prefect_executorch.cli.signals import Stop, stopped

__all__ = ["app", "run"]


def run() -> None:
    """``app`` with ``--debug`` accepted after the command too (``build spec.yaml --debug``)."""
    args = sys.argv[1:]
    # A global option, but every error says "rerun with --debug": take it wherever it is written, before `--`.
    end = args.index("--") if "--" in args else len(args)
    if "--debug" in args[:end]:
        args = ["--debug", *(a for i, a in enumerate(args) if a != "--debug" or i >= end)]
    try:
        app(args)
    except SystemExit:
        if Stop.signum is None:
            raise
        stopped()  # also before a command ran (click still reading the line, the callback): typer exits 130 unsaid
