"""A matrix on a fleet without the workers some cells need: left out with the reason, or failed at once.

On the session's real Prefect API (prefect_test_harness): the pools and the workers' heartbeats are
the server's own records, as on a fleet.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.client.schemas.sorting import ArtifactSort

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
        table = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["matrix-mlp"])),
                                      sort=ArtifactSort.CREATED_DESC, limit=1)[0]
    assert f'"state": "{"Skipped" if policy == "skip" else "Failed"}"' in str(table.data)
    assert "no live worker in pool gpu-cu134 when the matrix started" in str(table.data)


def test_the_crash_retry_automation_and_the_matrix_agree_on_what_is_rerun() -> None:
    """The matrix waits through a crash only when the deployed automation will rerun the build."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.events.schemas.automations import AutomationCore

    from prefect_executorch.fleet.automations import load_automations
    from prefect_executorch.tasks.dispatch import RETRY_CRASHED_TAG, will_be_retried

    root = Path(__file__).resolve().parents[2] / "deployments"
    (retry,) = [a for a in load_automations(root / "automations.yaml") if a["name"] == "prefect-executorch-retry-crashed"]
    automation = AutomationCore.model_validate(retry)
    assert automation.trigger.match.model_dump() == {"prefect.resource.id": "prefect.flow-run.*", "prefect.run-count": "1"}
    assert automation.trigger.match_related.model_dump() == {"prefect.resource.role": "tag",  # type: ignore[union-attr]
                                                              "prefect.resource.id": f"prefect.tag.{RETRY_CRASHED_TAG}"}
    assert automation.trigger.expect == {"prefect.flow-run.Crashed"}
    run = FlowRun(flow_id=uuid.uuid4(), tags=["executorch", RETRY_CRASHED_TAG], run_count=1)
    assert will_be_retried(run)
    assert not will_be_retried(run.model_copy(update={"run_count": 2}))  # its one retry was used
    assert not will_be_retried(run.model_copy(update={"tags": ["executorch"]}))
    deployments = yaml.safe_load((root / "prefect.yaml").read_text())["deployments"]
    builds = [d for d in deployments if d["entrypoint"].endswith(":build_bundle")]
    assert builds and all(RETRY_CRASHED_TAG in d["tags"] for d in builds)
