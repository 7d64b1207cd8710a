"""Validate an exported or pulled program against eager PyTorch; a failed report stops the flow."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task

from prefect_executorch.artifacts.manifest import Manifest
from prefect_executorch.export.exporter import ExportedProgramDir
from prefect_executorch.progress import stage
from prefect_executorch.runtime.bundled_cases import BUNDLED_FILE, require_bundled_passed, verify_bundled
from prefect_executorch.spec.asr import TRANSCRIPTION_CASES_FILE
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.llm import GENERATION_CASES_FILE
from prefect_executorch.targets import get_target
from prefect_executorch.targets.delegation import DelegationFacts
from prefect_executorch.tasks.prefect_artifacts import publish_triage_artifact, publish_validation_artifacts
from prefect_executorch.validate.bundled import method_cases, skip_reason
from prefect_executorch.validate.report import ValidationReport
from prefect_executorch.validate.triage import triage_failure
from prefect_executorch.validate.validator import require_passed, validate_program


def _validate(
    spec: BuildSpec, title: str, bundle_dir: Path, data_files: list[str], delegation: dict[str, DelegationFacts],
    scratch_dir: Path, bundled_out: Path | None = None,
) -> ValidationReport:
    report = validate_program(spec, bundle_dir, data_files, scratch_dir=scratch_dir, delegation=delegation,
                              bundled_out=bundled_out)
    key = f"{spec.name}-{spec.target_name}"
    publish_validation_artifacts(title, key, report, spec.card)
    get_run_logger().info("validation of %s %s: %s", title, "passed" if report.passed else "FAILED",
                          report.describe_worst())
    triage = triage_failure(spec, report, bundle_dir, data_files, scratch_dir=scratch_dir)  # None for a pass
    if triage is not None:
        publish_triage_artifact(title, key, triage)
    require_passed(report, triage)
    return report


@task(name="validate")
def validate_export(spec: BuildSpec, export: ExportedProgramDir, scratch_dir: Path) -> ValidationReport:
    """Run program and eager model on the same inputs; attach the tables; fail if a case or gate failed.

    The cases are also written to a ``model.bpte`` (CPU targets, unless the program is too large), which
    ExecuTorch then runs in a fresh child: the bundle's own test cases must pass before it is published.
    """
    title = f"{spec.name}-{spec.version}-{spec.target_name}"
    with stage("validate"):
        if spec.llm is not None:
            # A decoder LM's own test cases are its prompts and eager's tokens, written once they all pass.
            return _validate(spec, title, export.path, export.data_files, export.delegation, scratch_dir,
                             export.path / GENERATION_CASES_FILE)
        if spec.asr is not None:  # a speech model's own test cases are its clips and the program's tokens
            return _validate(spec, title, export.path, export.data_files, export.delegation, scratch_dir,
                             export.path / TRANSCRIPTION_CASES_FILE)
        skipped = skip_reason(export.path / export.program, spec)
        bundled_out = None if skipped else export.path / BUNDLED_FILE
        report = _validate(spec, title, export.path, export.data_files, export.delegation, scratch_dir, bundled_out)
        if (export.path / BUNDLED_FILE).is_file():
            check = verify_bundled(export.path, spec.target_name, export.data_files, method_cases(report),
                                   scratch_dir=scratch_dir,
                                   runtime_hints=get_target(spec.target_name).runtime_hints(spec))
            require_bundled_passed(check, export.path)
        else:
            get_run_logger().info("no %s: %s", BUNDLED_FILE, skipped or "an input or output is not a tensor")
    return report


@task(name="revalidate")
def validate_pulled(spec: BuildSpec, manifest: Manifest, bundle_dir: Path, scratch_dir: Path) -> ValidationReport:
    """Re-run a pulled bundle against the current eager model; fail if a case or gate failed."""
    title = f"revalidate-{manifest.key.prefix}"
    return _validate(spec, title, bundle_dir, manifest.data_files, manifest.delegation(), scratch_dir)
