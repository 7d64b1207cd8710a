"""Run the exported program and eager PyTorch on the same inputs, in a child process."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from prefect_executorch.errors import ChildProcessFailed, ValidationFailed
from prefect_executorch.isolation import run_isolated
from prefect_executorch.report import CaseResult, ValidationReport
from prefect_executorch.spec import BuildSpec
from prefect_executorch.targets import PROGRAM_FILE, get_target


class ValidateRequest(BaseModel):
    """What the validating child gets."""

    spec: BuildSpec
    bundle_dir: str
    program: str = PROGRAM_FILE
    data_files: list[str] = Field(default_factory=list)


def validate_in_child(request: dict[str, Any]) -> ValidationReport:
    """Child side: load the program (after the target's runtime setup) and compare with eager."""
    import torch

    from prefect_executorch.compare import compare_outputs
    from prefect_executorch.inputs import random_inputs, shape_points
    from prefect_executorch.modelref import load_model, method_callable
    from prefect_executorch.runtime import LoadedProgram

    req = ValidateRequest.model_validate(request)
    spec, bundle = req.spec, Path(req.bundle_dir)
    target = get_target(spec.target_name)
    target.runtime_setup()
    data = bundle / req.data_files[0] if req.data_files else None
    started = time.monotonic()
    program = LoadedProgram(bundle / req.program, data)
    load_seconds = time.monotonic() - started
    device = target.eager_device(spec)
    precision = target.compute_dtype(spec)
    model = load_model(spec).to(device)
    cases: list[CaseResult] = []
    with torch.no_grad():
        for name, method in spec.methods.items():
            eager = method_callable(model, name, method.attribute)
            generator = torch.Generator().manual_seed(spec.validation.seed)
            for label, shapes in shape_points(method):
                for sample in range(spec.validation.samples):
                    inputs = random_inputs(method, shapes, generator)
                    case = CaseResult(method=name, shape_label=label, input_shapes=shapes, sample=sample)
                    try:
                        actual = program.run(name, tuple(target.prepare_input(t, spec) for t in inputs), method.inputs)
                    except ValidationFailed as exc:
                        case.error = str(exc)
                    else:
                        expected = eager(*(t.to(device) for t in inputs))
                        case.outputs = compare_outputs(actual, expected, spec.validation, precision)
                    cases.append(case)
    return ValidationReport(
        passed=all(case.passed for case in cases),
        cases=cases,
        delegates={name: facts.delegates for name, facts in program.facts.items()},
        load_seconds=load_seconds,
        used_data_file=data is not None,
    )


def validate_program(
    spec: BuildSpec,
    bundle_dir: Path,
    data_files: list[str],
    *,
    scratch_dir: Path,
    memory_limit_mib: int | None = None,
) -> ValidationReport:
    """Validate the program in ``bundle_dir`` against eager; a crash of the child fails the validation."""
    try:
        return run_isolated(
            "validate",
            ValidateRequest(spec=spec, bundle_dir=str(bundle_dir), data_files=data_files),
            ValidationReport,
            timeout_s=spec.validation.timeout_s,
            scratch_dir=scratch_dir,
            memory_limit_mib=memory_limit_mib,
            what=f"validation of {spec.name} {spec.version}",
        )
    except ChildProcessFailed as exc:
        raise ValidationFailed(str(exc)) from exc


def require_passed(report: ValidationReport) -> None:
    """Raise ``ValidationFailed`` naming the worst output if the report failed."""
    if not report.passed:
        failed = report.failures()
        raise ValidationFailed(
            f"{len(failed)} of {len(report.cases)} validation cases failed; worst: {report.describe_worst()}"
        )
