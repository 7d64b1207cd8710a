"""The cached unit of a build: export -> validate -> publish, skipped when an identical build is published."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prefect import get_run_logger, task

from prefect_executorch.artifacts.manifest import MANIFEST_FILE, BundleKey
from prefect_executorch.artifacts.registry import BundleRef
from prefect_executorch.artifacts.store import open_store
from prefect_executorch.errors import ValidationFailed
from prefect_executorch.placement import needs_cuda
from prefect_executorch.spec import BuildSpec
from prefect_executorch.tasks.cache import BuildCachePolicy
from prefect_executorch.tasks.events import VALIDATION_FAILED, emit_bundle_event
from prefect_executorch.tasks.export import export_model
from prefect_executorch.tasks.gpu import gpu_slot
from prefect_executorch.tasks.publish import publish_bundle
from prefect_executorch.tasks.validate import validate_export
from prefect_executorch.toolchain import Toolchain

if TYPE_CHECKING:
    from prefect.blocks.core import Block


def bundle_key(spec: BuildSpec, compat: str) -> BundleKey:
    """Where ``spec`` built for ``compat`` is published."""
    return BundleKey(name=spec.name, version=spec.version, target=spec.target_name, compat=compat)


@task(name="is-published")
def is_published(spec: BuildSpec, compat: str, store: str | Block) -> bool:
    """Whether the bundle's manifest exists in the store (a cached result is only trusted if it does)."""
    return open_store(store).exists(bundle_key(spec, compat).key(MANIFEST_FILE))


@task(name="build-and-publish", cache_policy=BuildCachePolicy(), persist_result=True)
def build_and_publish(
    spec: BuildSpec, toolchain: Toolchain, compat: str, store: str | Block, output_root: Path,
    weights_uri: str | None = None, training_run: str | None = None,
) -> BundleRef:
    """Export, validate and publish; a cache hit returns the published bundle without exporting."""
    # Validation runs the engine too, so it holds the GPU as long as the export does.
    with gpu_slot(needs_cuda(spec.target_name)) as slot:
        if slot:
            get_run_logger().info("holding GPU slot %s", slot)
        export = export_model(spec, output_root)
        try:
            report = validate_export(spec, export, output_root)
        except ValidationFailed as exc:
            emit_bundle_event(VALIDATION_FAILED, bundle_key(spec, compat), open_store(store).url,
                              payload={"error": str(exc).splitlines()[0]})
            raise
    return publish_bundle(spec, toolchain, export, report, store, weights_uri, training_run)
