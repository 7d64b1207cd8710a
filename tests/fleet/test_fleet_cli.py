"""The fleet commands refuse bad input with exit 2 and a message naming the option; the worker type is registered."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "prefect_executorch.cli"]


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_EXECUTORCH_STORE")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env={**clean, **env}, timeout=120)


def test_retrain_request_is_checked_before_anything_is_sent(tmp_path: Path) -> None:
    no_server = _run("retrain", "small-convnet", "--weights", "s3://models/w.pt")
    assert no_server.returncode == 2 and "PREFECT_API_URL: not set" in no_server.stderr
    bad = _run("retrain", "Bad/Name", "--weights", "s3://models/w.pt", "--sha256", "xyz",
               PREFECT_API_URL="http://127.0.0.1:9/api")
    assert bad.returncode == 2
    assert "name: 'Bad/Name' is not a valid name" in bad.stderr
    assert "weights_sha256: 'xyz' is not 64 hex digits" in bad.stderr
    assert "Traceback" not in bad.stderr + bad.stdout


def test_deploy_needs_a_store_and_a_reachable_server(tmp_path: Path) -> None:
    no_store = _run("deploy")
    assert no_store.returncode == 2 and "--store: not set" in no_store.stderr
    unreachable = _run("deploy", "--store", str(tmp_path), PREFECT_API_URL="http://127.0.0.1:9/api",
                       PREFECT_EXECUTORCH_API_WAIT_S="1")
    assert unreachable.returncode == 2
    assert "PrefectApiUnreachable: PREFECT_API_URL=http://127.0.0.1:9/api: no Prefect server answered within 1 s" \
        in unreachable.stderr
    assert "Traceback" not in unreachable.stderr


def test_worker_refuses_a_gpu_this_machine_does_not_have() -> None:
    result = _run("worker", "--pool", "gpu-cu132", "--gpu", "7", PREFECT_API_URL="http://127.0.0.1:9/api")
    assert result.returncode == 2 and "--gpu: no GPU 7 here" in result.stderr


def test_worker_type_is_registered_through_the_entry_point() -> None:
    code = ("from prefect.workers.base import BaseWorker; "
            "print(BaseWorker.get_worker_class_from_type('executorch').__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/").stdout
    assert out.strip() == "prefect_executorch.fleet.worker"


def test_a_retrain_moves_one_alias_per_bundle() -> None:
    from prefect_executorch.artifacts.manifest import BundleKey
    from prefect_executorch.fleet.retrain_event import promotion_aliases

    cpu = BundleKey(name="m", version="2", target="xnnpack", compat="cpu-xnnpack-x86_64")
    gpu = BundleKey(name="m", version="2", target="tensorrt", compat="cu132-sm90-trt11.1-x86_64")
    assert promotion_aliases("staging", [cpu, gpu]) == [
        ("staging-cpu-xnnpack-x86_64", cpu), ("staging-cu132-sm90-trt11.1-x86_64", gpu)]
    # The GPU cell skipped for want of a worker (or a one-target matrix): the CPU bundle's alias is the same.
    assert promotion_aliases("staging", [cpu]) == [("staging-cpu-xnnpack-x86_64", cpu)]
