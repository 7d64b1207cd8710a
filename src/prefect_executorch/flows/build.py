"""``build_bundle``: probe -> check placement -> export -> validate -> publish (cached)."""

from __future__ import annotations

from pathlib import Path

from prefect.blocks.core import Block

from prefect_executorch.artifacts.publishing import BundleRef
from prefect_executorch.fleet.placement import Placement
from prefect_executorch.fleet.server import api_checked_flow
from prefect_executorch.scratch import scratch_dir
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.tasks.build import build_and_publish, check_published
from prefect_executorch.tasks.cache import resolve_result_storage
from prefect_executorch.tasks.probe import check_buildable, check_placement, probe_toolchain
from prefect_executorch.tasks.weights import fetch_weights


@api_checked_flow(name="build-bundle", flow_run_name="build-{spec.name}-{spec.version}-{spec.target.kind}", persist_result=True)
def build_bundle(
    spec: BuildSpec,
    store: str | Block,
    output: str | None = None,
    placement: Placement | None = None,
    result_storage: str | None = None,
    weights_uri: str | None = None,
    weights_sha256: str | None = None,
    training_run: str | None = None,
) -> BundleRef:
    """Build, validate and publish one bundle of ``spec`` to ``store`` (a URL or an S3Bucket block).

    An unchanged rebuild (same weights, model source, spec, toolchain and store) returns the
    published bundle without exporting, as long as its manifest is still in the store.
    ``placement`` is checked against this worker's toolchain before any work. ``weights_uri``
    (``s3://...`` or a path, verified against ``weights_sha256``) replaces the spec's weights,
    fetched into the output directory; it and ``training_run`` go into the manifest's lineage. Exports go to fresh
    directories under ``output``; without one, in a scratch directory removed when the run ends
    (``prefect_executorch.scratch``).
    ``result_storage`` (a directory or ``block:<type>/<name>``; default ``$PREFECT_EXECUTORCH_RESULT_STORAGE``)
    holds the cache records.
    """
    with scratch_dir("build", Path(output) if output else None) as output_root:
        toolchain = probe_toolchain()
        if placement is not None:
            check_placement(spec, placement, toolchain)
        if weights_uri:
            spec = fetch_weights(weights_uri, output_root, weights_sha256).apply(spec)
        compat = check_buildable(spec, toolchain)
        published = check_published(spec, toolchain, compat, store)
        if published.ref is not None:
            return published.ref
        storage = resolve_result_storage(result_storage)
        # A cache record whose bundle is gone from the store is refreshed: the build runs again.
        build = build_and_publish.with_options(refresh_cache=not published.published)
        if storage is not None:
            build = build.with_options(result_storage=storage)
        return build(spec, toolchain, compat, store, published, output_root, weights_uri, training_run)
