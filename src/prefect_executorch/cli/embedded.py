"""Prefect settings for the embedded default: flows on an ephemeral API that lives in this process."""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any


class EphemeralApi:
    """Prefect's ephemeral API for one CLI build: the subprocess ``SubprocessASGIServer`` runs, started alike.

    Prefect starts it from ``get_client()``, after importing ``prefect.server`` into the calling
    process (~3.5 s on 2 cores) only to reach that class; a CLI build waits for both. Started here,
    the subprocess does its own imports while this process and the child server do theirs. Same
    command, environment and health check as Prefect 3's (``prefect/server/api/server.py``). Stopped at
    exit, as Prefect's is: its ``atexit`` hook, registered first, runs after Prefect's log and event
    workers have sent what they hold.
    """

    def __init__(self, process: subprocess.Popen[bytes], port: int) -> None:
        self.process: subprocess.Popen[bytes] | None = process
        self.port = port

    @property
    def api_url(self) -> str:
        """``http://127.0.0.1:<port>/api``."""
        return f"http://127.0.0.1:{self.port}/api"

    @classmethod
    def start_unless_configured(cls) -> EphemeralApi | None:
        """Start the API and wait until it answers; None where a server is configured or ephemeral mode is off."""
        from prefect.settings import get_current_settings

        settings = get_current_settings()
        if settings.api.url or not settings.server.ephemeral.enabled:
            return None
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
               **settings.to_environment_variables(exclude_unset=True)}
        api = cls(*cls._launch(env))
        atexit.register(api.stop)
        api._wait_healthy(env, settings.server.ephemeral.startup_timeout_seconds)
        return api

    @staticmethod
    def _launch(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
        import prefect

        with closing(socket.socket()) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        command = [sys.executable, "-m", "uvicorn", "--app-dir", str(Path(prefect.__file__).parent.parent), "--factory",
                   "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
                   "--log-level", "error", "--lifespan", "on"]
        # Its own session: Ctrl-C reaches the whole foreground process group, and an API that died with it
        # left the interrupted flow retrying its last reports for minutes. The CLI stops it, last.
        return subprocess.Popen(command, env=env, start_new_session=True), port

    def _wait_healthy(self, env: dict[str, str], timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        with httpx.Client() as client:
            while True:
                assert self.process is not None
                if self.process.poll() == 3:  # uvicorn: the port was taken meanwhile
                    self.process, self.port = self._launch(env)
                try:
                    if client.get(f"{self.api_url}/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if self.process.poll() is not None or time.monotonic() > deadline:
                    code = self.process.poll()
                    self.stop()
                    raise RuntimeError(f"Prefect's ephemeral API did not start on port {self.port} within "
                                       f"{timeout_s:g} s (exit code {code})")
                time.sleep(0.1)

    def stop(self) -> None:
        """Terminate the API (killed after 5 s, as Prefect does); once."""
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def embedded_settings(api: EphemeralApi | None = None) -> Iterator[None]:
    """Flows on ``api`` if given (it outlives the block, no UI links), without flow-run heartbeats; with a
    configured server, nothing changes.

    Heartbeats let a server mark a crashed run; an ephemeral API stops with this process, so no one
    reads them, and Prefect's heartbeat thread holds the end of every flow run for up to a second
    (it sleeps in 1 s steps).
    """
    from prefect.settings import get_current_settings, temporary_settings

    if api is None and get_current_settings().api.url:
        yield
        return
    updates: dict[str, Any] = {"flows.heartbeat_frequency": None}
    if api is not None:
        # It serves no UI (PREFECT_UI_ENABLED=0), so Prefect's "View at <url>" line would point nowhere.
        updates.update({"api.url": api.api_url, "ui_url": ""})
    with temporary_settings(updates=updates):
        yield
