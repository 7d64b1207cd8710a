"""Send each build of a matrix to the deployment of its pool, and account for every build."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from prefect import get_client, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterParentFlowRunId,
    WorkerFilter,
    WorkerFilterStatus,
)
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.exceptions import PrefectHTTPStatusError
from prefect.runtime import flow_run as this_run
from prefect.states import State

from prefect_executorch.artifacts.publishing import BundleRef
from prefect_executorch.errors import BuildFailed
from prefect_executorch.fleet.placement import MatrixCell
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.tasks.prefect_artifacts import artifact_key, format_row

#: Flow name of ``build_bundle``; its deployments are named after their pool (``build-bundle/gpu-cu132``).
BUILD_FLOW = "build-bundle"
#: How long a build may wait for a worker of its pool and queue before the matrix gives up on it.
QUEUE_WAIT_S = 3600.0
#: What a matrix does with a cell whose pool has no live worker when it starts: leave it out (recorded, with
#: the reason), fail it at once, or send it anyway and wait up to the queue wait for a worker to appear.
MissingPoolPolicy = Literal["skip", "fail", "wait"]
#: Runs of deployments with this tag are run again once after a crash by the ``prefect-executorch-retry-crashed``
#: automation (deployments/automations.yaml: a Crashed event of a run whose run count is 1).
RETRY_CRASHED_TAG = "retry-crashed"
#: How long a matrix waits for that automation to reschedule a crashed build before counting it lost.
CRASH_RETRY_GRACE_S = 30.0
#: How often a matrix reads the state of the builds it waits on.
POLL_S = 2.0

#: Per attempt of a matrix flow run, set once the flow stops waiting for its dispatches. Prefect's thread-pool task
#: runner joins its task threads when a flow ends, so a dispatch still polling its build would keep a cancelled
#: or SIGTERMed matrix alive until Prefect's SIGKILL 30 s later, with none of its own cleanup run. Kept after they
#: are set (one small object per attempt): a dispatch thread that starts late must still find its attempt's set.
_flow_stopping: dict[str, threading.Event] = {}


def _stopping_event() -> threading.Event:
    """This flow run attempt's stop event (a fresh one outside a flow run, which nothing sets)."""
    run_id = this_run.get_id()
    if run_id is None:
        return threading.Event()
    return _flow_stopping.setdefault(f"{run_id}:{this_run.get_run_count()}", threading.Event())


@contextmanager
def dispatches_stop_with_the_flow() -> Iterator[None]:
    """Around a flow's wait for its ``dispatch_build`` futures: however that wait ends (done, cancelled, SIGTERM),
    the dispatches stop polling at once, so the flow run's process can exit."""
    stopping = _stopping_event()
    try:
        yield
    finally:
        stopping.set()


@task(name="find-live-pools")
def live_pools(pools: list[str]) -> list[str]:
    """The pools among ``pools`` with a worker online now (Prefect marks one offline once its heartbeats stop)."""
    online = WorkerFilter(status=WorkerFilterStatus(any_=["ONLINE"]))
    live = []
    with get_client(sync_client=True) as client:
        for pool in sorted(set(pools)):
            try:
                if client.read_workers_for_work_pool(pool, worker_filter=online, limit=1):
                    live.append(pool)
            except PrefectHTTPStatusError as exc:
                if exc.response.status_code != 404:
                    raise
                # No such pool: nobody can take its builds.
    return live


def missing_worker(cell: MatrixCell) -> str:
    """Why a cell was not sent, and what starts a worker that would take it."""
    pool, queue = cell.placement.pool, cell.placement.queue
    return (f"no live worker in pool {pool} when the matrix started; start one with "
            f"`prefect-executorch worker --pool {pool} --queue {queue}`")


def build_parameters(
    spec: BuildSpec, cell: MatrixCell, store: str, weights_uri: str | None, weights_sha256: str | None,
    training_run: str | None = None,
) -> dict[str, Any]:
    """The ``build_bundle`` parameters of one cell, as JSON."""
    return {
        "spec": cell.spec_for(spec).model_dump(mode="json"),
        "store": store,
        "placement": cell.placement.model_dump(mode="json"),
        "weights_uri": weights_uri,
        "weights_sha256": weights_sha256,
        "training_run": training_run,
    }


def will_be_retried(run: FlowRun) -> bool:
    """Whether the retry-crashed automation reruns ``run`` after its crash: tagged, and on its first run."""
    return RETRY_CRASHED_TAG in run.tags and run.run_count <= 1


def wait_for_build(client: SyncPrefectClient, run: FlowRun, timeout: float, stopping: threading.Event) -> FlowRun:
    """Read ``run`` until it is final, ``timeout`` passed or ``stopping`` is set; a crash the retry automation reruns
    is waited through."""
    deadline = time.monotonic() + timeout
    crashed_at: float | None = None
    while True:
        run = client.read_flow_run(run.id)
        state = run.state
        if state is not None and state.is_final():
            if not (state.is_crashed() and will_be_retried(run)):
                return run
            crashed_at = crashed_at or time.monotonic()
            if time.monotonic() - crashed_at > CRASH_RETRY_GRACE_S:
                return run
        else:
            crashed_at = None
            if time.monotonic() > deadline:
                return run
        if stopping.wait(POLL_S):
            return run


def earlier_attempt(client: SyncPrefectClient, deployment_id: Any, cell: MatrixCell) -> FlowRun | None:
    """The build this matrix run sent for ``cell`` before it was itself rerun, if still running or completed.

    A matrix rerun after a crash (same flow run) takes that build over instead of sending a second one;
    a failed, crashed or cancelled one is sent again.
    """
    parent = this_run.get_id()
    if parent is None or this_run.get_run_count() <= 1:
        return None
    runs = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent])),
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
    )
    # The cell is in the parameters (a build renames its run when it starts).
    placement = cell.placement.model_dump(mode="json")
    return next((run for run in runs if run.parameters.get("placement") == placement
                 and run.parameters.get("spec", {}).get("target", {}).get("kind") == cell.target.kind
                 and run.state and (not run.state.is_final() or run.state.is_completed())), None)


@task(name="dispatch-build", task_run_name="dispatch-{cell.label}")
def dispatch_build(
    spec: BuildSpec,
    cell: MatrixCell,
    store: str,
    weights_uri: str | None = None,
    weights_sha256: str | None = None,
    training_run: str | None = None,
    queue_wait_s: float = QUEUE_WAIT_S,
) -> BundleRef:
    """Run ``build-bundle/<pool>`` on the cell's arch queue, wait for it, and return its bundle.

    A build that crashes and is rescheduled by the retry-crashed automation is waited on through its
    second run; a matrix that is itself rerun takes over the builds its first run sent.
    """
    deployment = f"{BUILD_FLOW}/{cell.placement.pool}"
    stopping = _stopping_event()
    with get_client(sync_client=True) as client:
        sent = earlier_attempt(client, client.read_deployment_by_name(deployment).id, cell)
        if sent is not None:
            get_run_logger().info("%s: taking over %s, sent by this matrix's earlier run", cell.label, sent.name)
        else:
            sent = run_deployment(  # type: ignore[assignment]  # sync call: not a coroutine
                name=deployment,
                parameters=build_parameters(spec, cell, store, weights_uri, weights_sha256, training_run),
                work_queue_name=cell.placement.queue,
                flow_run_name=f"build-{spec.name}-{spec.version}-{cell.label}",
                timeout=0,
            )
        assert sent is not None
        flow_run = wait_for_build(client, sent, spec.export_timeout_s + spec.validation.timeout_s + queue_wait_s,
                                  stopping)
    state = flow_run.state
    where = f"{deployment} (queue {cell.placement.queue}, flow run {flow_run.name})"
    if stopping.is_set() and (state is None or not state.is_final()):
        raise BuildFailed(f"{cell.label}: the matrix stopped while {where} was {state.name if state else 'unscheduled'}"
                          "; a rerun of the matrix takes it over, a cancelled matrix's builds are cancelled with it")
    if state is None or not state.is_final():
        raise BuildFailed(
            f"{cell.label}: {where} is still {state.name if state else 'unscheduled'}; start a worker with "
            f"`prefect-executorch worker --pool {cell.placement.pool} --queue {cell.placement.queue}`"
        )
    if not state.is_completed():
        raise BuildFailed(f"{cell.label}: {where} ended {state.name}: {state.message}")
    ref = state.result()
    bundle = BundleRef.model_validate(ref)
    get_run_logger().info("%s: %s %s", cell.label, "reused (cache hit)" if bundle.cache_hit else "published",
                          bundle.key.prefix)
    return bundle


@task(name="summarize-matrix")
def summarize_matrix(
    spec: BuildSpec, cells: list[MatrixCell], states: list[State], skipped: dict[str, str] | None = None,
) -> list[BundleRef]:
    """Attach a table of every build; raise ``BuildFailed`` naming each failed one, else return the bundles.

    The columns that fit a 1600 px page come first (build, state, bundle, manifest); why a build was skipped or
    failed, which can be long (the command that starts a missing worker), comes last.

    Pass ``states`` wrapped in ``prefect.utilities.annotations.quote`` so failed ones reach this task;
    ``skipped`` maps the label of each cell left out to why (its row says so; it is no failure).
    """
    rows: list[dict[str, Any]] = []
    refs, failures = [], []
    for label, reason in (skipped or {}).items():
        get_run_logger().warning("%s: skipped: %s", label, reason)
        rows.append(format_row({"build": label, "state": "Skipped", "bundle": None, "manifest": None, "why": reason}))
    for cell, state in zip([c for c in cells if c.label not in (skipped or {})], states, strict=True):
        if state.is_completed():
            ref = BundleRef.model_validate(state.result())
            refs.append(ref)
            rows.append(format_row({"build": cell.label, "state": "Cache hit" if ref.cache_hit else "Published",
                                    "bundle": ref.key.prefix,
                                    # The whole sha256 is in the bundle's own artifact; a prefix tells runs apart.
                                    "manifest": ref.manifest_sha256[:12], "why": None}))
        else:
            failures.append(f"{cell.label}: {state.name}: {state.message}")
            rows.append(format_row({"build": cell.label, "state": state.name, "bundle": None, "manifest": None,
                                    "why": state.message}))
    # Keyed per model: the artifact's history is that model's matrices.
    create_table_artifact(rows, key=artifact_key("matrix", spec.name),
                          description=f"Build matrix of {spec.name} {spec.version}")
    if failures:
        raise BuildFailed(f"{len(failures)} of {len(cells)} builds of {spec.name} {spec.version} failed: "
                          + "; ".join(failures))
    return refs
