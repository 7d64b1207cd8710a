"""A real ``prefect server start`` on a free loopback port and the processes run against it.

Used by the fleet's end-to-end tests and its benchmark: every process (server, workers, CLI runs)
is started with Popen, logs to ``<home>/<name>.log`` and is stopped by its pid, workers first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prefect_executorch.testing.seaweedfs import free_port

#: The CLI as a child process runs it.
CLI = [sys.executable, "-m", "prefect_executorch.cli"]


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGINT, timeout: float = 20) -> None:
    """Ask ``proc`` to stop with ``sig`` (a worker's graceful stop), then kill it by pid; never leave it running."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


def tail(path: Path, chars: int = 4000) -> str:
    """The end of a log, or nothing if it is not there."""
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


class PrefectServer:
    """A Prefect server's address and environment (``database``: its connection URL), and the processes started."""

    def __init__(self, home: Path, database: str, cwd: Path, **env: str) -> None:
        self.home, self.cwd = home, cwd
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.env = {
            **os.environ,
            "PREFECT_HOME": str(home),
            "PREFECT_API_URL": self.url,
            "PREFECT_SERVER_DATABASE_CONNECTION_URL": database,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DO_NOT_TRACK": "1",
            # Workers poll every second and take runs due in 5 s: a test's run starts at once.
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_WORKER_PREFETCH_SECONDS": "5",
            **env,
        }
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str], **env: str) -> subprocess.Popen[bytes]:
        """Start ``argv`` against the server, its output in ``<home>/<name>.log``."""
        with open(self.home / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(argv, cwd=self.cwd, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def start_server(self, timeout: float = 180) -> None:
        """``prefect server start`` (no UI), back once its health endpoint answers."""
        proc = self.start("server", [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                     "--port", str(self.port), "--analytics-off", "--no-ui"])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"prefect server exited:\n{tail(self.home / 'server.log')}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"prefect server not healthy in {timeout} s:\n{tail(self.home / 'server.log')}")

    def cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """``prefect-executorch ARGS`` against the server, waited for."""
        return subprocess.run([*CLI, *args], cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def stop_all(self) -> None:
        """Every process started, the last first (workers before the server)."""
        for proc in reversed(self.procs):
            stop(proc)
