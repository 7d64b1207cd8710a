"""``python -m prefect_executorch.cli``."""

from prefect_executorch.cli import main

main()
