"""Send each build of a matrix to the deployment of its pool, and account for every build."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.states import State

from prefect_executorch.artifacts.registry import BundleRef
from prefect_executorch.artifacts.reports import artifact_key
from prefect_executorch.errors import BuildFailed
from prefect_executorch.fleet.placement import MatrixCell
from prefect_executorch.spec.buildspec import BuildSpec

#: Flow name of ``build_bundle``; its deployments are named after their pool (``build-bundle/gpu-cu132``).
BUILD_FLOW = "build-bundle"
#: How long a build may wait for a worker of its pool and queue before the matrix gives up on it.
QUEUE_WAIT_S = 3600.0


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


@task(name="dispatch-build", task_run_name="dispatch-{cell.label}")
def dispatch_build(
    spec: BuildSpec,
    cell: MatrixCell,
    store: str,
    weights_uri: str | None = None,
    weights_sha256: str | None = None,
    training_run: str | None = None,
) -> BundleRef:
    """Run ``build-bundle/<pool>`` on the cell's arch queue, wait for it, and return its bundle."""
    deployment = f"{BUILD_FLOW}/{cell.placement.pool}"
    flow_run: FlowRun = run_deployment(  # type: ignore[assignment]  # sync call: not a coroutine
        name=deployment,
        parameters=build_parameters(spec, cell, store, weights_uri, weights_sha256, training_run),
        work_queue_name=cell.placement.queue,
        flow_run_name=f"build-{spec.name}-{spec.version}-{cell.label}",
        timeout=spec.export_timeout_s + spec.validation.timeout_s + QUEUE_WAIT_S,
        poll_interval=2,
    )
    state = flow_run.state
    where = f"{deployment} (queue {cell.placement.queue}, flow run {flow_run.name})"
    if state is None or not state.is_final():
        raise BuildFailed(
            f"{cell.label}: {where} is still {state.name if state else 'unscheduled'}; start a worker with "
            f"`prefect-executorch worker --pool {cell.placement.pool} --queue {cell.placement.queue}`"
        )
    if not state.is_completed():
        raise BuildFailed(f"{cell.label}: {where} ended {state.name}: {state.message}")
    ref = state.result()
    get_run_logger().info("%s: published %s", cell.label, ref.key.prefix)
    return BundleRef.model_validate(ref)


@task(name="summarize-matrix")
def summarize_matrix(spec: BuildSpec, cells: list[MatrixCell], states: list[State]) -> list[BundleRef]:
    """Attach a table of every build; raise ``BuildFailed`` naming each failed one, else return the bundles.

    Pass ``states`` wrapped in ``prefect.utilities.annotations.quote`` so failed ones reach this task.
    """
    rows, refs, failures = [], [], []
    for cell, state in zip(cells, states, strict=False):
        if state.is_completed():
            ref = BundleRef.model_validate(state.result())
            refs.append(ref)
            rows.append({"build": cell.label, "state": state.name, "bundle": ref.key.prefix,
                         "manifest sha256": ref.manifest_sha256})
        else:
            failures.append(f"{cell.label}: {state.name}: {state.message}")
            rows.append({"build": cell.label, "state": state.name, "bundle": "-", "manifest sha256": "-"})
    create_table_artifact(rows, key=artifact_key("matrix", spec.name, spec.version),
                          description=f"Build matrix of {spec.name} {spec.version}")
    if failures:
        raise BuildFailed(f"{len(failures)} of {len(cells)} builds of {spec.name} {spec.version} failed:\n  "
                          + "\n  ".join(failures))
    return refs
