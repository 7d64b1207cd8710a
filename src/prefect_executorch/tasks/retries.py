"""When a store task is worth another try."""

from __future__ import annotations

from typing import Any

from prefect_executorch.errors import PrefectExecutorchError


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry unexpected failures only: our typed errors (conflicts, integrity, credentials, a store
    that stayed unreachable through the client's own retries) would fail the same way again."""
    try:
        state.result()
    except PrefectExecutorchError:
        return False
    except Exception:  # noqa: BLE001 - anything else (a dropped connection mid-task) is worth another try
        return True
    return False
