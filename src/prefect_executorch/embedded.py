"""Prefect settings for the embedded default: flows on an ephemeral API that lives in this process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


def quiet_ephemeral_server() -> None:
    """Default Prefect's server telemetry off (``PREFECT_SERVER_ANALYTICS_ENABLED=false``) unless the user set it.

    The ephemeral API Prefect starts for a flow (a subprocess with this process's environment) runs a
    telemetry heartbeat at start: a read-then-write transaction on its SQLite database that races the
    first flow run's writes and, losing, prints a ``database is locked`` traceback (Prefect 3.9,
    ``prefect/server/services/telemetry.py``); it also posts to prefect.io, which an offline build
    should not. Set before any flow runs, so the CLI, the Python API and a worker all get it.
    """
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


@contextmanager
def embedded_settings() -> Iterator[None]:
    """Without a configured server (no ``PREFECT_API_URL``), run flows without flow-run heartbeats.

    Heartbeats let a server mark a crashed run; an ephemeral API stops with this process, so no one
    reads them, and Prefect's heartbeat thread holds the end of every flow run for up to a second
    (it sleeps in 1 s steps). With a server configured, nothing changes.
    """
    from prefect.settings import get_current_settings, temporary_settings

    if get_current_settings().api.url:
        yield
        return
    with temporary_settings(updates={"flows.heartbeat_frequency": None}):
        yield
