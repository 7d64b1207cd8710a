"""``python -m prefect_executorch.cli``."""

from prefect_executorch.cli.main import run

run()
