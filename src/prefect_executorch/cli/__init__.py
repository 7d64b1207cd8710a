"""``prefect-executorch``: the command line over the flows, on an embedded ephemeral Prefect API by default.
"""

import sys


def main() -> None:
    """The console script: Ctrl-C and SIGTERM handled first, then the commands' imports and the command."""
    from prefect_executorch.cli.signals import install

    install(sys.argv[1:])
    from prefect_executorch.cli.main import run

    run()
