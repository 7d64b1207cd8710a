"""Real torch-tensorrt wheels for tests that read their source (importing it needs TensorRT).

Downloaded once with ``pip download --no-deps`` into ``$PREFECT_EXECUTORCH_WHEEL_CACHE`` (default
``~/.cache/prefect-executorch/wheels``). A failed download fails the test: the conformance tests
are the only guard against an upstream rename, so they must not quietly vanish. On a machine
without a package index, set ``PREFECT_EXECUTORCH_OFFLINE=1`` to skip them instead (never in CI).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TORCH_TENSORRT = "torch-tensorrt==2.14.0"
DELEGATE_RUNTIME = "torch-tensorrt-executorch-runtime==0.1.0"
#: NVIDIA ModelOpt, whose quantize ops the TensorRT int8/fp8 schemes build (pure Python, read with ``ast``).
MODELOPT = "nvidia-modelopt==0.47.0"
WHEEL_CACHE = Path(os.environ.get("PREFECT_EXECUTORCH_WHEEL_CACHE", Path.home() / ".cache/prefect-executorch/wheels"))


def download_wheel(requirement: str) -> Path:
    """The cached wheel of ``name==version``, downloading it first if needed."""
    name, _, version = requirement.partition("==")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    cached = sorted(WHEEL_CACHE.glob(pattern))
    if cached:
        return cached[0]
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(WHEEL_CACHE),
         requirement],
        capture_output=True, text=True, timeout=600,
    )
    cached = sorted(WHEEL_CACHE.glob(pattern))
    if result.returncode != 0 or not cached:
        message = f"pip download {requirement} failed (exit {result.returncode}): {result.stderr.strip()[-2000:]}"
        if os.environ.get("PREFECT_EXECUTORCH_OFFLINE"):
            pytest.skip(f"PREFECT_EXECUTORCH_OFFLINE is set and {message}")
        pytest.fail(message)
    return cached[0]
