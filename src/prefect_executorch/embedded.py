"""Prefect settings for the embedded default: flows on an ephemeral API that lives in this process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


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
