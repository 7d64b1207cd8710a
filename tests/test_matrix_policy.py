"""A matrix on a fleet without the workers some cells need: left out with the reason, or failed at once.

On the session's real Prefect API (prefect_test_harness): the pools and the workers' heartbeats are
the server's own records, as on a fleet.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from prefect_executorch.errors import BuildFailed
from prefect_executorch.fleet.placement import MatrixCell
from prefect_executorch.flows.matrix import build_matrix
from prefect_executorch.spec.buildspec import parse_spec
from prefect_executorch.tasks.dispatch import live_pools

from helpers import spec_data

pytestmark = pytest.mark.usefixtures("prefect_harness")
#: A GPU cell: its pool (gpu-cu134) has no worker in this test session.
GPU_CELL = MatrixCell.model_validate({"target": "cuda", "placement": {"channel": "cu134", "sm": "sm100"}})


def test_only_pools_with_a_worker_online_are_live() -> None:
    live, idle = f"live-{uuid.uuid4().hex[:8]}", f"idle-{uuid.uuid4().hex[:8]}"
    with get_client(sync_client=True) as client:
        for pool in (live, idle):
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        client.send_worker_heartbeat(live, "worker-1")
    assert live_pools([idle, live, "no-such-pool", live]) == [live]


@pytest.mark.parametrize("policy", ["skip", "fail"])
def test_a_cell_no_worker_can_take_is_skipped_or_failed_at_once(policy: str, tmp_path: Path) -> None:
    spec = parse_spec(spec_data("mlp", version=f"policy-{policy}",
                                methods={"forward": {"inputs": [{"name": "x", "shape": [2, 32]}]}}))
    started = time.monotonic()
    if policy == "skip":
        assert build_matrix(spec, [GPU_CELL], str(tmp_path), dispatch=True, on_missing_pool="skip") == []
    else:
        with pytest.raises(BuildFailed, match="(?s)1 of 1 builds .* no live worker in pool gpu-cu134 .*--pool gpu-cu134"):
            build_matrix(spec, [GPU_CELL], str(tmp_path), dispatch=True, on_missing_pool="fail")
    assert time.monotonic() - started < 60  # nothing waited for a worker
    with get_client(sync_client=True) as client:
        (table,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"matrix-mlp-policy-{policy}"])))
    assert f'"state": "{"Skipped" if policy == "skip" else "Failed"}"' in str(table.data)
    assert "no live worker in pool gpu-cu134 when the matrix started" in str(table.data)
