"""Prefect flows that turn PyTorch models into validated, published ExecuTorch bundles.

The names a user imports live here, each loaded on first use (the flows bring Prefect and torch):
the flows (``build_bundle``, ``build_matrix``, ``promote``, ``retrain``, ``revalidate``), the spec
(``BuildSpec``, ``load_spec``, ``parse_spec``), ``open_store`` and the typed errors. Everything else is
the package's own, by folder, in the order of the pipeline: ``spec/`` → ``machine/`` → ``targets/`` →
``export/`` → ``validate/`` → ``artifacts/`` (publish) → ``fleet/`` → ``tasks/`` → ``flows/`` → ``cli/``,
each importing only from the folders before it (docs/architecture.md).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from prefect_executorch.errors import (
    BundleConflict,
    BundleNotFound,
    IntegrityError,
    PrefectExecutorchError,
    PromotionRefused,
    SpecError,
    ToolchainMismatch,
    ValidationFailed,
)

__version__ = "0.1.0"

#: Public name -> the module that defines it, imported when the name is first used.
_LAZY = {
    "build_bundle": "prefect_executorch.flows.build",
    "build_matrix": "prefect_executorch.flows.matrix",
    "promote": "prefect_executorch.flows.promote",
    "retrain": "prefect_executorch.flows.retrain",
    "revalidate": "prefect_executorch.flows.revalidate",
    "BuildSpec": "prefect_executorch.spec.buildspec",
    "load_spec": "prefect_executorch.spec.buildspec",
    "parse_spec": "prefect_executorch.spec.buildspec",
    "open_store": "prefect_executorch.artifacts.urls",
}

__all__ = [
    "BundleConflict", "BundleNotFound", "IntegrityError", "PrefectExecutorchError", "PromotionRefused", "SpecError",
    "ToolchainMismatch", "ValidationFailed", "__version__", *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'prefect_executorch' has no attribute {name!r}")


def quiet_ephemeral_server() -> None:
    """Default Prefect's server telemetry off (``PREFECT_SERVER_ANALYTICS_ENABLED=false``) unless the user set it.

    The ephemeral API Prefect starts for a flow (a subprocess with this process's environment) runs a
    telemetry heartbeat at start: a read-then-write transaction on its SQLite database that races the
    first flow run's writes and, losing, prints a ``database is locked`` traceback (Prefect 3.9,
    ``prefect/server/services/telemetry.py``); it also posts to prefect.io, which an offline build
    should not. Set before any flow runs, so the CLI, the Python API and a worker all get it.
    """
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


quiet_ephemeral_server()
