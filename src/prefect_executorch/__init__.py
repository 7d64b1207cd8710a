"""Prefect flows that turn PyTorch models into validated, published ExecuTorch bundles."""

from prefect_executorch.embedded import quiet_ephemeral_server

__version__ = "0.1.0"

quiet_ephemeral_server()
