"""Prefect settings for the embedded default: flows on an ephemeral API that lives in this process."""

from __future__ import annotations

import atexit
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any


class EphemeralApi:
    """Prefect's ephemeral API for one CLI build: the subprocess ``SubprocessASGIServer`` runs, started alike.

    Prefect starts it from ``get_client()``, after importing ``prefect.server`` into the calling
    process (~3.5 s on 2 cores) only to reach that class; a CLI build waits for both. Started here,
    the subprocess does its own imports while this process and the child server do theirs. Same
    uvicorn arguments, environment and health check as Prefect 3's (``prefect/server/api/server.py``), run
    by ``cli/apiserver.py``, which also leaves when this process is killed. Stopped at
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
    def start_unless_configured(cls, cancelled: threading.Event | None = None) -> EphemeralApi | None:
        """Start the API and wait until it answers; None where a server is configured or ephemeral mode is off, or
        once ``cancelled`` is set (the API is stopped then)."""
        from prefect.settings import get_current_settings

        settings = get_current_settings()
        if settings.api.url or not settings.server.ephemeral.enabled:
            return None
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
               **settings.to_environment_variables(exclude_unset=True)}
        api = cls(*cls._launch(env))
        atexit.register(api.stop)
        healthy = api._wait_healthy(env, settings.server.ephemeral.startup_timeout_seconds, cancelled or threading.Event())
        return api if healthy else None

    @staticmethod
    def _launch(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
        import prefect

        with closing(socket.socket()) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        command = [sys.executable, "-m", "prefect_executorch.cli.apiserver", "--app-dir", str(Path(prefect.__file__).parent.parent), "--factory",
                   "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
                   "--log-level", "error", "--lifespan", "on"]
        # Its own session: Ctrl-C reaches the whole foreground process group, and an API that died with it
        # left the interrupted flow retrying its last reports for minutes. The CLI stops it, last; a killed CLI's
        # API leaves by itself (cli/apiserver.py).
        return subprocess.Popen(command, env=env, start_new_session=True), port

    def _wait_healthy(self, env: dict[str, str], timeout_s: float, cancelled: threading.Event) -> bool:
        """Whether the API answered (False: ``cancelled``, and it is stopped); an error if it did not start in time."""
        import httpx

        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=1) as client:
            while True:
                if cancelled.is_set():
                    self.stop()
                    return False
                assert self.process is not None
                if self.process.poll() == 3:  # uvicorn: the port was taken meanwhile
                    self.process, self.port = self._launch(env)
                try:
                    if client.get(f"{self.api_url}/health").status_code == 200:
                        return True
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


class ApiStart:
    """``EphemeralApi.start_unless_configured`` on a thread of its own, so that it overlaps a build's other start-up.

    ``abandon`` ends a start still under way (and its API): a command refused or interrupted meanwhile
    otherwise exited with that thread still polling, and interpreter shutdown under it aborted the process
    (SIGABRT, exit 134, after the refusal's line). If the start fails, the flow starts Prefect's own and
    reports what fails.
    """

    def __init__(self) -> None:
        self._cancelled = threading.Event()
        self._future: Future[EphemeralApi | None] = Future()
        self._thread = threading.Thread(target=self._start, name="prefect-api-start", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            self._future.set_result(EphemeralApi.start_unless_configured(self._cancelled))
        except Exception as exc:  # noqa: BLE001 - reported by the flow's own start
            logging.getLogger(__name__).debug("early start of Prefect's API failed: %s", exc)
            self._future.set_result(None)

    def result(self) -> EphemeralApi | None:
        """The API once it answers (None: a server is configured, or it failed to start)."""
        return self._future.result()

    def abandon(self) -> None:
        """Stop a start still under way, and its API; a started API stays up until exit, for Prefect's last reports."""
        if not self._future.done():
            self._cancelled.set()
            self._thread.join()


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
