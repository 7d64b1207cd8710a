"""A configured Prefect API that is down, starting, or no Prefect API: one line in the command's words, exit 2, and a
bounded wait for a server still starting (``fleet/server.py``)."""

from __future__ import annotations

import http.server
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from prefect_executorch.errors import PrefectApiUnreachable
from prefect_executorch.testing.prefect_server import CLI, PrefectServer
from prefect_executorch.testing.seaweedfs import free_port

ROOT = Path(__file__).resolve().parents[2]
SHA = "a" * 64


def _cli(*args: str, api: str, wait_s: float, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_EXECUTORCH_API_WAIT_S": str(wait_s)}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


@pytest.fixture
def not_prefect() -> Iterator[str]:
    """An HTTP server that answers every request, but is no Prefect API."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/api"
    finally:
        server.shutdown()


def test_a_build_against_a_server_that_is_down_stops_before_any_work_with_one_line(tmp_path: Path) -> None:
    api = f"http://127.0.0.1:{free_port()}/api"
    started = time.monotonic()
    done = _cli("build", str(ROOT / "examples" / "convnet" / "spec.yaml"), "--store", "store", api=api, wait_s=1,
                cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith(f"PrefectApiUnreachable: PREFECT_API_URL={api}: no Prefect server answered within 1 s")
    assert "start it (`prefect server start`)" in lines[-1] and "unset PREFECT_API_URL" in lines[-1]
    assert "Traceback" not in done.stderr and not (tmp_path / "store").exists()
    assert time.monotonic() - started < 60


def test_with_debug_the_same_exit_code_and_the_traceback(tmp_path: Path) -> None:
    api = f"http://127.0.0.1:{free_port()}/api"
    done = _cli("--debug", "retrain", "m", "--weights", "s3://b/k", "--sha256", SHA, api=api, wait_s=0.5, cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" in done.stderr and "PrefectApiUnreachable: PREFECT_API_URL=" in done.stderr


@pytest.mark.parametrize("command", [["retrain", "m", "--weights", "s3://b/k", "--sha256", SHA],
                                     ["worker", "--pool", "cpu", "--run-once"]])
def test_a_url_that_answers_but_is_no_prefect_api_is_refused_at_once(not_prefect: str, tmp_path: Path,
                                                                     command: list[str]) -> None:
    started = time.monotonic()
    done = _cli(*command, api=not_prefect, wait_s=60, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"PrefectApiUnreachable: PREFECT_API_URL={not_prefect} answers but is no Prefect API (GET /health: HTTP " \
           "404" in done.stderr
    assert time.monotonic() - started < 30  # not the 60 s wait: no server that answers so will become Prefect's


def test_a_command_waits_for_a_server_that_starts_after_it(tmp_path: Path) -> None:
    server = PrefectServer(tmp_path / "home", f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}", tmp_path)
    (tmp_path / "home").mkdir()
    command = subprocess.Popen(
        [*CLI, "retrain", "m", "--weights", "s3://b/k", "--sha256", SHA], cwd=tmp_path, text=True,
        env={**server.env, "PREFECT_EXECUTORCH_API_WAIT_S": "180"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(2)
        assert command.poll() is None  # still waiting: nothing listens yet
        server.start_server()
        out, err = command.communicate(timeout=180)
    finally:
        command.kill()
        server.stop_all()
    assert command.returncode == 0, err
    assert "emitted model.retrain.requested for" in out


def test_the_python_api_raises_the_typed_error_before_prefect_reaches_for_the_server(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from prefect_executorch import build_bundle
    from prefect_executorch.spec.buildspec import load_spec

    monkeypatch.setenv("PREFECT_EXECUTORCH_API_WAIT_S", "0.5")
    spec = load_spec(ROOT / "examples" / "convnet" / "spec.yaml")
    api = f"http://127.0.0.1:{free_port()}/api"
    with temporary_settings({PREFECT_API_URL: api}), pytest.raises(PrefectApiUnreachable, match="no Prefect server"):
        build_bundle(spec, store=str(tmp_path / "store"))
    assert not (tmp_path / "store").exists()
