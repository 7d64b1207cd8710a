"""Shared fixtures: quiet Prefect in a temporary home, one test harness per session, spec builders."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

os.environ["DO_NOT_TRACK"] = "1"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="prefect-executorch-tests-home-"))
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from prefect_executorch.spec import BuildSpec, parse_spec  # noqa: E402

TESTS = Path(__file__).parent
MODELS = TESTS / "models.py"


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """A temporary Prefect API for the whole session (starting one takes 12-17 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


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


@pytest.fixture
def make_spec() -> Callable[..., BuildSpec]:
    """Build a validated spec for a model in tests/models.py."""

    def make(factory: str = "convnet", **overrides: Any) -> BuildSpec:
        return parse_spec(spec_data(factory, **overrides))

    return make
