"""``prefect-executorch``: the command line over the flows, on an embedded ephemeral Prefect API by default.
"""

import sys


def main() -> None:
    """The console script: Ctrl-C and SIGTERM handled first, then the commands' imports and the command."""
    from prefect_executorch.cli.signals import install, stopped

    install(sys.argv[1:])
    try:
        from prefect_executorch.cli.main import run

        run()
    except KeyboardInterrupt:
        stopped()  # it came while the commands were still imported: uncaught, Python would die of SIGINT (-2)
