"""Helpers shared by test modules (import as `helpers`; pytest puts tests/ on sys.path)."""

from __future__ import annotations

import subprocess
import sys
import time
import wave
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from prefect_executorch.artifacts.manifest import Manifest
    from prefect_executorch.spec.buildspec import BuildSpec

TESTS = Path(__file__).parent
MODELS = TESTS / "models.py"
#: What must stay out of the CLI's normal output: third-party notes (torchao, torch's _pytree, ExecuTorch's
#: cpuinfo) and Prefect's engine logs of a failed task or flow.
CLI_NOISE = ("Failed to load", "_pytree", "cpuinfo", "Traceback", "Encountered exception", "Finished in state")


def settled(read: Callable[[], Any], until: Callable[[Any], bool] = lambda value: not value, timeout: float = 15,
            interval: float = 0.2) -> Any:
    """``read()`` once ``until`` holds for it (by default: empty, such as nothing left running), or its last value
    after ``timeout`` s, read every ``interval`` s. For what another process does after the moment a test observed
    (a killed child reaped, a log line sent), so that the assertion after it judges the settled value."""
    deadline = time.monotonic() + timeout
    while not until(value := read()) and time.monotonic() < deadline:
        time.sleep(interval)
    return value


@contextmanager
def cpu_burner() -> Iterator[None]:
    """A CPU-bound process beside the block: the races that an idle machine hides show on a busy one, as in CI."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        burner.kill()
        burner.wait()


def session_api() -> dict[str, str]:
    """``PREFECT_API_URL`` of this test process's Prefect API (``prefect_harness``), for a CLI child whose test is
    not about the embedded API: a CLI build otherwise starts an API of its own, ~9 s of CPU beside its export.
    Empty where no harness is up here (the child then runs embedded, as a user's build does)."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    return {"PREFECT_API_URL": url} if url else {}


def spec_data(factory: str = "convnet", **overrides: Any) -> dict[str, Any]:
    """A spec mapping for a model in tests/models.py; fields may be overridden."""
    data: dict[str, Any] = {
        "name": factory.replace("_", "-"),
        "version": "1",
        "model": f"{MODELS}:{factory}",
        "methods": {"forward": {"inputs": [{"name": "x", "shape": [2, 3, 8, 8]}]}},
        "target": "xnnpack",
        "validation": {"samples": 1},
    }
    data.update(overrides)
    return data


_AWS_VARS_TO_CLEAR = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                      "AWS_DEFAULT_REGION", "PREFECT_EXECUTORCH_STORE")


def set_aws_env(patch: pytest.MonkeyPatch, server: Any) -> None:
    """Point boto3's standard chain at a SeaweedS3 ``server`` and nowhere else (no profiles, no IMDS)."""
    for name in _AWS_VARS_TO_CLEAR:
        patch.delenv(name, raising=False)
    for name, value in server.env().items():
        patch.setenv(name, value)


def fresh_store(server: Any, **settings: Any) -> Any:
    """An S3Store on a new bucket of a SeaweedS3 ``server`` (credentials from the environment)."""
    from prefect_executorch.artifacts.s3 import S3Settings, S3Store

    return S3Store.from_url(f"s3://{server.make_bucket()}/reg", settings=S3Settings(**settings))


def write_wav(path: Path, samples: Any, rate: int = 16000) -> Path:
    """``samples`` in [-1, 1] (a numpy array) as a mono 16-bit PCM WAV file at ``path``."""
    import numpy as np

    with wave.open(str(path), "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(2)
        audio.setframerate(rate)
        audio.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return path


def check_bundle_runs(spec: BuildSpec, dest: Path, manifest: Manifest) -> None:
    """Verify a bundle directory and run every method against eager at the largest shapes."""
    import torch

    from prefect_executorch.artifacts.publishing import verify_bundle_dir
    from prefect_executorch.runtime.loaded_program import LoadedProgram
    from prefect_executorch.spec.inputs import random_inputs
    from prefect_executorch.spec.modelref import load_model, method_callable

    assert verify_bundle_dir(dest) == manifest
    program = LoadedProgram(dest / manifest.program, dest / manifest.data_files[0] if manifest.data_files else None)
    model = load_model(spec)
    generator = torch.Generator().manual_seed(1234)
    for name, method in spec.methods.items():
        shapes = [list(i.shape) for i in method.inputs]
        for inp in method.inputs:
            for index, dim in inp.dynamic.items():
                shapes[method.inputs.index(inp)][index] = dim.max
        inputs = random_inputs(method, shapes, generator)
        got = program.run(name, inputs)
        want = method_callable(model, name, method.attribute)(*inputs)
        want = want if isinstance(want, tuple) else (want,)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=False):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
