"""Export the model in a child process, into a directory of its own."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task

from prefect_executorch.export.exporter import ExportedProgramDir, export_program
from prefect_executorch.progress import stage
from prefect_executorch.spec.buildspec import BuildSpec


@task(name="export")
def export_model(spec: BuildSpec, output_root: Path) -> ExportedProgramDir:
    """Export ``spec``; a crash or timeout of the child fails this task with its stderr."""
    spec.check_model_reference()
    with stage("export"):
        result = export_program(spec, output_root)
    logger = get_run_logger()
    logger.info("exported %s in %.1f s; delegates: %s", result.out_dir, result.seconds, result.delegates())
    for warning in result.warnings:
        logger.warning(warning)
    return result
