"""``build_matrix``: one build per target and placement, each on the workers of its pool and queue."""

from __future__ import annotations

from prefect.futures import PrefectFuture
from prefect.runtime import deployment
from prefect.states import Failed, State
from prefect.utilities.annotations import quote

from prefect_executorch.artifacts.publishing import BundleRef
from prefect_executorch.fleet.placement import MatrixCell
from prefect_executorch.fleet.server import api_checked_flow
from prefect_executorch.flows.build import build_bundle
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.tasks.dispatch import (
    QUEUE_WAIT_S,
    MissingPoolPolicy,
    dispatch_build,
    dispatches_stop_with_the_flow,
    live_pools,
    missing_worker,
    summarize_matrix,
)


@api_checked_flow(name="build-matrix", flow_run_name="matrix-{spec.name}-{spec.version}")
def build_matrix(
    spec: BuildSpec,
    targets: list[MatrixCell],
    store: str,
    weights_uri: str | None = None,
    weights_sha256: str | None = None,
    dispatch: bool | None = None,
    output: str | None = None,
    training_run: str | None = None,
    on_missing_pool: MissingPoolPolicy = "wait",
    queue_wait_s: float = QUEUE_WAIT_S,
) -> list[BundleRef]:
    """Build ``spec`` for every cell of ``targets``; fail naming every failed build, else return all bundles.

    Under a deployment (or with ``dispatch=True``) each cell runs the ``build-bundle/<pool>``
    deployment on its arch queue, all at once; otherwise each cell is a local ``build_bundle``
    subflow, one after another. ``weights_uri`` is fetched by each build on its own worker.
    A dispatched cell whose pool has no live worker when the matrix starts is, per ``on_missing_pool``,
    left out with the reason (``skip``), failed at once (``fail``), or sent to wait up to
    ``queue_wait_s`` for a worker (``wait``).
    """
    if dispatch is None:
        dispatch = deployment.id is not None
    skipped: dict[str, str] = {}
    if dispatch:
        live = live_pools([cell.placement.pool for cell in targets]) if on_missing_pool != "wait" else None
        sent: dict[str, PrefectFuture[BundleRef]] = {}
        refused: dict[str, State] = {}
        for cell in targets:
            if live is None or cell.placement.pool in live:
                sent[cell.label] = dispatch_build.submit(spec, cell, store, weights_uri, weights_sha256, training_run,
                                                         queue_wait_s)
            elif on_missing_pool == "skip":
                skipped[cell.label] = missing_worker(cell)
            else:
                refused[cell.label] = Failed(message=missing_worker(cell))
        with dispatches_stop_with_the_flow():
            for future in sent.values():
                future.wait()
        states = [refused[cell.label] if cell.label in refused else sent[cell.label].state
                  for cell in targets if cell.label not in skipped]
    else:
        states = [
            build_bundle(cell.spec_for(spec), store, output=output, placement=cell.placement,
                         weights_uri=weights_uri, weights_sha256=weights_sha256, training_run=training_run,
                         return_state=True)
            for cell in targets
        ]
    # Prefect unwraps quote() before the task runs; its overloads cannot say so.
    return summarize_matrix(spec, targets, quote(states), skipped)  # type: ignore[call-overload]
