"""``build_bundle``: probe -> export -> validate -> publish."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from prefect import flow
from prefect.blocks.core import Block

from prefect_executorch.artifacts.registry import BundleRef
from prefect_executorch.spec import BuildSpec
from prefect_executorch.tasks.export import export_model
from prefect_executorch.tasks.probe import check_buildable, probe_toolchain
from prefect_executorch.tasks.publish import publish_bundle
from prefect_executorch.tasks.validate import validate_export


@flow(name="build-bundle", flow_run_name="build-{spec.name}-{spec.version}")
def build_bundle(spec: BuildSpec, store: str | Block, output: str | None = None) -> BundleRef:
    """Build, validate and publish one bundle of ``spec`` to ``store`` (a URL or an S3Bucket block).

    Exports go to fresh directories under ``output``; without one, a temporary directory is used
    and removed when the flow ends.
    """
    output_root = Path(output) if output else Path(tempfile.mkdtemp(prefix="prefect-executorch-"))
    try:
        toolchain = probe_toolchain()
        check_buildable(spec, toolchain)
        export = export_model(spec, output_root)
        report = validate_export(spec, export, output_root)
        return publish_bundle(spec, toolchain, export, report, store)
    finally:
        if output is None:
            shutil.rmtree(output_root, ignore_errors=True)
