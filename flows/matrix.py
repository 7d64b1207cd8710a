"""``build_matrix``: one build per target and placement, each on the workers of its pool and queue."""

from __future__ import annotations

from prefect import flow
from prefect.runtime import deployment
from prefect.utilities.annotations import quote

from prefect_executorch.artifacts.registry import BundleRef
from prefect_executorch.fleet.placement import MatrixCell
from prefect_executorch.flows.build import build_bundle
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.tasks.dispatch import dispatch_build, summarize_matrix


@flow(name="build-matrix", flow_run_name="matrix-{spec.name}-{spec.version}")
def build_matrix(
    spec: BuildSpec,
    targets: list[MatrixCell],
    store: str,
    weights_uri: str | None = None,
    weights_sha256: str | None = None,
    dispatch: bool | None = None,
    output: str | None = None,
    training_run: str | None = None,
) -> list[BundleRef]:
    """Build ``spec`` for every cell of ``targets``; fail naming every failed build, else return all bundles.

    Under a deployment (or with ``dispatch=True``) each cell runs the ``build-bundle/<pool>``
    deployment on its arch queue, all at once; otherwise each cell is a local ``build_bundle``
    subflow, one after another. ``weights_uri`` is fetched by each build on its own worker.
    """
    if dispatch is None:
        dispatch = deployment.id is not None
    if dispatch:
        futures = [dispatch_build.submit(spec, cell, store, weights_uri, weights_sha256, training_run) for cell in targets]
        for future in futures:
            future.wait()
        states = [future.state for future in futures]
    else:
        states = [
            build_bundle(cell.spec_for(spec), store, output=output, placement=cell.placement,
                         weights_uri=weights_uri, weights_sha256=weights_sha256, training_run=training_run,
                         return_state=True)
            for cell in targets
        ]
    # Prefect unwraps quote() before the task runs; its overloads cannot say so.
    return summarize_matrix(spec, targets, quote(states))  # type: ignore[call-overload]
