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

from helpers import spec_data  # noqa: E402

@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """A temporary Prefect API for the whole session (starting one takes 12-17 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def make_spec() -> Callable[..., BuildSpec]:
    """Build a validated spec for a model in tests/models.py."""

    def make(factory: str = "convnet", **overrides: Any) -> BuildSpec:
        return parse_spec(spec_data(factory, **overrides))

    return make
