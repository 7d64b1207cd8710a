"""Prefect flows that turn PyTorch models into validated, published ExecuTorch bundles."""

__version__ = "0.1.0"
