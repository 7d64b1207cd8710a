"""Validate the exported program against eager PyTorch; a failed report stops the flow."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task

from prefect_executorch.artifacts.reports import publish_validation_artifact
from prefect_executorch.exporter import ExportedProgramDir
from prefect_executorch.report import ValidationReport
from prefect_executorch.spec import BuildSpec
from prefect_executorch.validator import require_passed, validate_program


@task(name="validate")
def validate_export(spec: BuildSpec, export: ExportedProgramDir, scratch_dir: Path) -> ValidationReport:
    """Run program and eager model on the same inputs; attach the table; fail if any case failed."""
    report = validate_program(spec, export.path, export.data_files, scratch_dir=scratch_dir)
    publish_validation_artifact(f"{spec.name}-{spec.version}-{spec.target_name}", report)
    get_run_logger().info("validation %s: %s", "passed" if report.passed else "FAILED", report.describe_worst())
    require_passed(report)
    return report
