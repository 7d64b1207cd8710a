"""Fetch new weights for a build or a retrain."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task

from prefect_executorch.artifacts.weights import FetchedWeights
from prefect_executorch.artifacts.weights import fetch_weights as fetch
from prefect_executorch.tasks.retries import retry_transient


@task(name="fetch-weights", retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=retry_transient)
def fetch_weights(uri: str, dest_dir: Path, expected_sha256: str | None = None) -> FetchedWeights:
    """Download ``uri`` into ``dest_dir``, verified against ``expected_sha256`` when given."""
    fetched = fetch(uri, dest_dir, expected_sha256)
    get_run_logger().info("fetched %s (%d bytes, sha256 %s)", uri, fetched.size, fetched.sha256)
    return fetched
