"""The cached unit of a build: export -> validate -> publish, skipped when an identical build is published."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prefect import get_run_logger, task

from prefect_executorch.artifacts.manifest import BundleKey
from prefect_executorch.artifacts.publishing import BundleRef, sign_unsigned
from prefect_executorch.artifacts.rebuild import PublishedBuild, check_rebuild
from prefect_executorch.artifacts.urls import open_store
from prefect_executorch.errors import PrefectExecutorchError
from prefect_executorch.fleet.gpu_slots import gpu_slot
from prefect_executorch.machine.toolchain import Toolchain
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.targets import needs_cuda
from prefect_executorch.tasks.cache import BuildCachePolicy
from prefect_executorch.tasks.events import EXPORT_FAILED, VALIDATION_FAILED, emit_bundle_event, emit_reused
from prefect_executorch.tasks.export import export_model
from prefect_executorch.tasks.failures import keep_child_output
from prefect_executorch.tasks.prefect_artifacts import publish_bundle_link, publish_failure_summary
from prefect_executorch.tasks.publish import publish_bundle
from prefect_executorch.tasks.validate import validate_export

if TYPE_CHECKING:
    from prefect.blocks.core import Block


@task(name="check-published")
def check_published(spec: BuildSpec, toolchain: Toolchain, compat: str, store: str | Block) -> PublishedBuild:
    """Before exporting: the published bundle of an unchanged rebuild, or ``BundleConflict`` for a changed one.

    A cache hit says so: a log line, a link to the bundle it returns and a ``bundle.reused`` event.
    """
    opened = open_store(store)
    published = check_rebuild(spec, toolchain, compat, opened)
    if published.ref is not None:
        ref = published.ref
        get_run_logger().info("cache hit: %s is in %s from an identical build (manifest sha256 %s); nothing exported",
                              ref.key.prefix, ref.store, ref.manifest_sha256)
        publish_bundle_link(ref, "cache hit: an identical build's bundle, nothing exported")
        emit_reused(ref, "flow")
        if sign_unsigned(opened, ref):
            get_run_logger().info("signed %s: it was published unsigned; its model.sig is stored now", ref.key.prefix)
    return published


@task(name="build-and-publish", cache_policy=BuildCachePolicy(), persist_result=True)
def build_and_publish(
    spec: BuildSpec, toolchain: Toolchain, compat: str, store: str | Block, published: PublishedBuild,
    output_root: Path, weights_uri: str | None = None, training_run: str | None = None,
) -> BundleRef:
    """Export, validate and publish; a cache hit (keyed on ``published.fingerprint``) returns the bundle without exporting."""
    # Validation runs the engine too, so it holds the GPU as long as the export does.
    with gpu_slot(needs_cuda(spec.target_name)) as slot:
        if slot:
            get_run_logger().info("holding GPU slot %s", slot)
        key = BundleKey.of(spec.name, spec.version, spec.target_name, compat)
        try:
            export = export_model(spec, output_root)
        except PrefectExecutorchError as exc:  # a model factory that raises is a SpecError, a crash ChildProcessFailed
            _report_failure(EXPORT_FAILED, spec, key, published.store_url, exc)
            raise
        try:
            report = validate_export(spec, export, output_root)
        except PrefectExecutorchError as exc:
            _report_failure(VALIDATION_FAILED, spec, key, published.store_url, exc)
            raise
    return publish_bundle(spec, toolchain, export, report, store, published.inputs, weights_uri, training_run, compat)


def _report_failure(event: str, spec: BuildSpec, key: BundleKey, store_url: str, exc: PrefectExecutorchError) -> None:
    """What a failed build leaves, whatever failed: the event automations notify on, its summary and its child's output."""
    emit_bundle_event(event, key, store_url, payload={"error": str(exc).splitlines()[0]})
    kept = keep_child_output(spec, exc)
    publish_failure_summary(key, "export" if event == EXPORT_FAILED else "validation", exc, kept)
