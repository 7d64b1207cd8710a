"""Publish a validated bundle: objects first, manifest last, never overwriting."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect import get_run_logger, task

from prefect_executorch.artifacts.publishing import BundleRef, prepare_bundle, publish
from prefect_executorch.artifacts.rebuild import identical_build_published
from prefect_executorch.artifacts.urls import open_store
from prefect_executorch.errors import BundleConflict
from prefect_executorch.export.exporter import ExportedProgramDir
from prefect_executorch.export.fingerprint import BuildFingerprint
from prefect_executorch.export.lineage import collect_lineage
from prefect_executorch.machine.toolchain import Toolchain
from prefect_executorch.progress import stage
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.tasks.assets import record_bundle
from prefect_executorch.tasks.events import PUBLISHED, emit_bundle_event, emit_reused
from prefect_executorch.tasks.prefect_artifacts import publish_build_summary, publish_bundle_link
from prefect_executorch.tasks.retries import retry_transient
from prefect_executorch.validate.report import ValidationReport

if TYPE_CHECKING:
    from prefect.blocks.core import Block


@task(name="publish", retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=retry_transient)
def publish_bundle(
    spec: BuildSpec, toolchain: Toolchain, export: ExportedProgramDir, report: ValidationReport, store: str | Block,
    build_inputs: BuildFingerprint | None = None, weights_uri: str | None = None, training_run: str | None = None,
    compat: str | None = None,
) -> BundleRef:
    """Write the manifest (with the build's lineage) and publish the bundle to ``store`` (a URL or an S3Bucket block)."""
    manifest = prepare_bundle(spec, toolchain, export, report, build_inputs,
                              collect_lineage(spec, weights_uri, training_run), compat)
    opened = open_store(store)
    with stage("publish"):
        try:
            ref = publish(opened, export.path, manifest)
        except BundleConflict:
            found = identical_build_published(opened, manifest)
            if found is None:
                raise
            get_run_logger().info("%s was published by an identical build (manifest sha256 %s): this run's own bundle, "
                                  "nothing written", found.key.prefix, found.manifest_sha256)
            emit_reused(found, "publish")
            return found
    get_run_logger().info("published %s to %s (manifest sha256 %s)", ref.key.prefix, ref.store, ref.manifest_sha256)
    emit_bundle_event(PUBLISHED, ref.key, ref.store, ref.manifest_sha256, payload={
        "manifest_key": ref.manifest_key, "validation_passed": manifest.validation.passed,
        "validation_cases": manifest.validation.cases, "worst": manifest.validation.worst},
        # A label, not only payload: automations match on resource labels (deployments/prefect.yaml).
        # `retrain`: built from weights fetched by URI, as a retrain does; the retrain promotes its bundles itself once
        # the whole matrix validated, so the staging automation leaves them alone.
        labels={"validated": str(manifest.validation.passed).lower(), "retrain": str(weights_uri is not None).lower()})
    publish_bundle_link(ref, "published")
    publish_build_summary(ref, report, export.seconds)
    record_bundle(ref.store, ref.key, weights_uri)
    return ref
