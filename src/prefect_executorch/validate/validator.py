"""Run the exported program and eager PyTorch on the same inputs, in a child process, and gate on the result.

This module imports no torch at the top, yet everything the child needs, so the forkserver's preload
of it covers the child; a spawned child imports torch, the runtime extension and these light
modules only (no ``executorch.exir``).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from prefect_executorch.errors import ChildProcessFailed, SpecError, ValidationFailed
from prefect_executorch.export.quantize import quantized_methods
from prefect_executorch.isolation import run_isolated
from prefect_executorch.runtime.loaded_program import LoadedProgram
from prefect_executorch.spec.buildspec import BuildSpec, check_input_budget
from prefect_executorch.spec.inputs import Inputs, case_inputs
from prefect_executorch.spec.modelref import load_model, method_callable
from prefect_executorch.spec.validation import ValidationSpec
from prefect_executorch.targets import PROGRAM_FILE, get_target
from prefect_executorch.targets.delegation import DelegationFacts
from prefect_executorch.validate.bundled import Cases, write_bundled
from prefect_executorch.validate.compare import compare_outputs, flatten_with_paths
from prefect_executorch.validate.latency import measure_together
from prefect_executorch.validate.replay import ReplayCheck, check_replay
from prefect_executorch.validate.report import CaseResult, GateResult, LatencyResult, ValidationReport

if TYPE_CHECKING:
    import torch

    from prefect_executorch.targets.base import Target
    from prefect_executorch.validate.triage import TriageReport



class ValidateRequest(BaseModel):
    """What the validating child gets."""

    spec: BuildSpec
    bundle_dir: str
    program: str = PROGRAM_FILE
    data_files: list[str] = Field(default_factory=list)
    delegation: dict[str, DelegationFacts] = Field(default_factory=dict)
    bundled_out: str | None = Field(default=None, description="Where to write the .bpte of the cases, if they all pass.")


def synchronized(call: Callable[[], Any], device: str) -> Callable[[], Any]:
    """``call`` that returns only once the device has finished it: CUDA calls return before the GPU is done."""
    if not device.startswith("cuda"):
        return call
    import torch

    def run() -> Any:
        result = call()
        torch.cuda.synchronize()
        return result

    return run


def measure_latency(
    name: str, label: str, eager: Callable[[], Any], program: Callable[[], Any], shapes: list[list[int]],
    validation: ValidationSpec, device: str = "cpu",
) -> LatencyResult:
    """Windowed warm latency of eager and of the program, their windows interleaved in this process.

    On a CUDA ``device`` both sides are synchronised after every call, so each time covers the work.
    """
    eager_stats, program_stats = measure_together(
        [synchronized(eager, device), synchronized(program, device)], min_runs=validation.latency_runs,
        warmup=validation.latency_warmup, max_seconds=validation.latency_max_s,
    )
    return LatencyResult(
        method=name, shape_label=label, input_shapes=shapes, runs=program_stats.runs,
        eager_median_ms=eager_stats.p50_ms, eager_p90_ms=eager_stats.p90_ms,
        program_median_ms=program_stats.p50_ms, program_p90_ms=program_stats.p90_ms,
        ratio=program_stats.p50_ms / eager_stats.p50_ms if eager_stats.p50_ms > 0 else float("inf"),
        stable=eager_stats.stable and program_stats.stable, eager=eager_stats, program=program_stats,
        synchronized=device.startswith("cuda"),
    )


def check_gates(
    spec: ValidationSpec, methods: list[str], delegation: dict[str, DelegationFacts], latency: list[LatencyResult]
) -> list[GateResult]:
    """The spec's gates on every method: delegated fraction and latency ratio."""
    gates = []
    if spec.min_delegated_fraction is not None:
        limit = spec.min_delegated_fraction
        for name in methods:
            facts = delegation.get(name)
            fraction = facts.fraction if facts else None
            if facts is None or fraction is None:
                detail = ("unknown: the bundle records no operator counts for this method (its target cannot count "
                          "them, or it was exported before they were recorded); re-export it")
            else:
                left = ", ".join(f"{op} x{count}" for op, count in sorted(facts.undelegated.items()))
                detail = (f"{fraction:.3f} of operators delegated ({facts.delegated_ops} of {facts.total_ops}), "
                          f"{'>=' if fraction >= limit else 'below'} {limit:g}" + (f"; left outside: {left}" if left else ""))
            gates.append(GateResult(gate="min_delegated_fraction", method=name, measured=fraction, limit=limit,
                                    passed=fraction is not None and fraction >= limit, detail=detail))
    if spec.max_latency_ratio is not None:
        limit = spec.max_latency_ratio
        measured = {result.method: result for result in latency}
        for name in methods:
            result = measured.get(name)
            if result is None:
                gates.append(GateResult(gate="max_latency_ratio", method=name, measured=None, limit=limit, passed=False,
                                        detail="not measured: the method failed to run"))
                continue
            detail = (f"program median {result.program_median_ms:.3g} ms / eager median {result.eager_median_ms:.3g} ms "
                      f"= {result.ratio:.3g}, {'<=' if result.ratio <= limit else 'above'} {limit:g} "
                      f"({result.runs} runs at {result.shape_label} {result.input_shapes}"
                      f"{'' if result.stable else ', NOT stable within validation.latency_max_s'})")
            gates.append(GateResult(gate="max_latency_ratio", method=name, measured=result.ratio, limit=limit,
                                    passed=result.ratio <= limit, detail=detail))
    return gates


def _check_output_overrides(spec: ValidationSpec, name: str, cases: list[CaseResult]) -> set[str]:
    """The method's output paths; an override in ``validation.methods.<name>.outputs`` must name one."""
    paths = {out.path for case in cases for out in case.outputs}
    settings = spec.methods.get(name)
    unknown = sorted(set(settings.outputs) - paths) if settings and paths else []
    if unknown:
        raise SpecError(f"validation.methods.{name}.outputs: no output at {unknown}; the method's outputs are {sorted(paths)}")
    return paths


def _value_range(tensor: torch.Tensor) -> list[float] | None:
    return [float(tensor.min()), float(tensor.max())] if tensor.numel() else None


def _split_errors(case: CaseResult, spec: BuildSpec, name: str, actual: list[Any], expected: Any,
                  quantized: Any, output_spec: str | None) -> None:
    """Quantized builds: set the case's quantization error (quantized vs float eager) and lowering error (program vs quantized)."""
    from prefect_executorch.validate.compare import flatten_with_paths

    assert spec.quantization is not None
    scheme = spec.quantization.scheme
    case.quantization_error = compare_outputs([leaf for _, leaf in flatten_with_paths(quantized)], expected,
                                              spec.validation, name, quantization=scheme)
    case.lowering_error = compare_outputs(actual, quantized, spec.validation, name, output_spec, quantization=scheme)


def _validate_method(
    spec: BuildSpec, name: str, model: Any, program: LoadedProgram, first_calls: dict[str, float], recorded: Cases,
    quantized: Callable[..., Any] | None = None,
) -> tuple[list[CaseResult], LatencyResult | None]:
    """Run every case of one method on the program and on eager (on the program's device); record what ran.

    ``quantized`` is the quantized eager method of a quantized build: the gate still compares the
    program with the float model, and the case also records the two parts of that error.
    """
    method = spec.methods[name]
    target = get_target(spec.target_name)
    eager = method_callable(model, name, method.attribute)
    facts = program.facts.get(name)
    device, precision = target.eager_device(spec), target.compute_dtype(spec)
    cases: list[CaseResult] = []
    timing: tuple[str, Inputs, Inputs] | None = None
    for label, sample, host_inputs in case_inputs(spec, name, method):
        inputs = tuple(t.to(device) for t in host_inputs)
        case = CaseResult(method=name, shape_label=label, input_shapes=[list(t.shape) for t in inputs],
                          input_ranges=[_value_range(t) for t in inputs], sample=sample)
        prepared = tuple(target.prepare_input(t, spec) for t in host_inputs)
        try:
            started = time.perf_counter()
            actual = program.run(name, prepared, method.inputs)
            first_calls.setdefault(name, time.perf_counter() - started)
        except ValidationFailed as exc:
            case.error = str(exc)
        else:
            expected = eager(*inputs)
            output_spec = facts.output_spec if facts else None
            scheme = spec.quantization.scheme if spec.quantization else None
            case.outputs = compare_outputs(actual, expected, spec.validation, name, output_spec, precision, scheme)
            if quantized is not None:
                _split_errors(case, spec, name, actual, expected, quantized(*inputs), output_spec)
            recorded.setdefault(name, []).append((host_inputs, [leaf for _, leaf in flatten_with_paths(expected)]))
            # Time the typical shape: the first case at 'opt' (or the first that ran).
            if timing is None or (label == "opt" and timing[0] != "opt"):
                timing = (label, inputs, prepared)
        cases.append(case)
    latency = None
    if timing is not None and spec.validation.latency_runs:
        label, inputs, prepared = timing
        latency = measure_latency(
            name, label, lambda: eager(*inputs), lambda: program.execute(name, prepared), [list(t.shape) for t in inputs],
            spec.validation, device,
        )
    return cases, latency


def _check_replay(spec: BuildSpec, target: Target, name: str, program: LoadedProgram) -> ReplayCheck:
    """``name`` on its first case's inputs through the CUDA-graph capture and a replay (``validate/replay.py``)."""
    method = spec.methods[name]
    _, _, host_inputs = next(iter(case_inputs(spec, name, method)))
    prepared = tuple(target.prepare_input(t, spec) for t in host_inputs)
    return check_replay(name, lambda: program.run(name, prepared, method.inputs))


def validate_in_child(request: dict[str, Any]) -> ValidationReport:
    """Child side: load the program (after the target's runtime setup), compare with eager, apply the gates."""
    import torch

    req = ValidateRequest.model_validate(request)
    spec, bundle = req.spec, Path(req.bundle_dir)
    if spec.llm is not None:
        from prefect_executorch.validate.generation import validate_generation

        return validate_generation(req)
    if spec.asr is not None:
        from prefect_executorch.validate.transcription import validate_transcription

        return validate_transcription(req)
    target = get_target(spec.target_name)
    hints = target.runtime_hints(spec)
    target.runtime_setup(hints)
    data = bundle / req.data_files[0] if req.data_files else None
    started = time.monotonic()
    program = LoadedProgram(bundle / req.program, data)
    load_seconds = time.monotonic() - started
    # Before any case: every later call of a graph method is a replay, so the cases judge what serving runs.
    replay = [_check_replay(spec, target, name, program) for name in hints.get("cuda_graph_methods") or []]
    model = load_model(spec).to(target.eager_device(spec))
    cases: list[CaseResult] = []
    latency: list[LatencyResult] = []
    first_calls: dict[str, float] = {}
    seen_paths: set[str] = set()
    recorded: Cases = {}
    with torch.no_grad():
        quantized, quantization = quantized_methods(model, spec) if spec.quantization else ({}, None)
        for name in spec.methods:
            method_cases, method_latency = _validate_method(spec, name, model, program, first_calls, recorded,
                                                            quantized.get(name))
            seen_paths |= _check_output_overrides(spec.validation, name, method_cases)
            cases += method_cases
            latency += [method_latency] if method_latency else []
    unknown = sorted(set(spec.validation.outputs) - seen_paths) if seen_paths else []
    if unknown:
        raise SpecError(f"validation.outputs: no method has an output at {unknown}; outputs are {sorted(seen_paths)}")
    gates = check_gates(spec.validation, list(spec.methods), req.delegation, latency)
    if req.bundled_out and all(case.passed for case in cases):
        write_bundled(bundle / req.program, recorded, Path(req.bundled_out))
    return ValidationReport(
        passed=(all(case.passed for case in cases) and all(gate.passed for gate in gates)
                and not any(check.problem for check in replay)),
        replay=replay,
        cases=cases,
        delegates={name: facts.delegates for name, facts in program.facts.items()},
        load_seconds=load_seconds,
        first_call_seconds=first_calls,
        used_data_file=data is not None,
        delegation=req.delegation,
        latency=latency,
        gates=gates,
        quantization=quantization,
        file_sizes={f: (bundle / f).stat().st_size for f in [req.program, *req.data_files]},
    )


def validate_program(
    spec: BuildSpec,
    bundle_dir: Path,
    data_files: list[str],
    *,
    scratch_dir: Path,
    delegation: dict[str, DelegationFacts] | None = None,
    bundled_out: Path | None = None,
) -> ValidationReport:
    """Validate the program in ``bundle_dir`` against eager; a crash, hang or memory blow-up of the child fails it.

    With ``bundled_out``, the child also writes there the ``.bpte`` of the cases when they all pass.
    """
    bound = get_target(spec.target_name).memory_limit("validate", spec.validation.memory_limit_mib)
    check_input_budget(spec, bound.mib * 2**20 if bound else None, "validation.memory_limit_mib")
    try:
        report = run_isolated(
            "validate",
            ValidateRequest(spec=spec, bundle_dir=str(bundle_dir), data_files=data_files, delegation=delegation or {},
                            bundled_out=str(bundled_out) if bundled_out else None),
            ValidationReport,
            timeout_s=spec.validation.timeout_s,
            scratch_dir=scratch_dir,
            memory_limit=bound,
            what=f"validation of {spec.name} {spec.version}",
        )
    except ChildProcessFailed as exc:
        message = str(exc)
        if exc.returncode in (-signal.SIGSEGV, -signal.SIGABRT, -signal.SIGBUS):
            message += (f"; the ExecuTorch runtime crashed on this program: check that it is loaded with the .ptd "
                        f"it was exported with (given: {data_files or 'none'}) and was built for this platform")
        raise ValidationFailed(message, child_output=exc.child_output) from exc
    return report.model_copy(update={"memory_bound": bound.describe() if bound else "none"})


def require_passed(report: ValidationReport, triage: TriageReport | None = None) -> None:
    """Raise ``ValidationFailed`` naming the worst output (or the failed gates), and the triage's operator, if it failed."""
    if report.passed:
        return
    parts = []
    failed = report.failures()
    generation = report.generation
    if generation is not None and generation.failed_cases():  # an exact build: every token must be eager's
        parts.append(f"{len(generation.failed_cases())} of {len(generation.cases)} prompts generated other tokens "
                     "than eager PyTorch")
    if failed:
        parts.append(f"{len(failed)} of {len(report.cases)} validation cases failed")
    parts += [gate.describe() for gate in report.failed_gates()]
    parts += [problem for check in report.replay if (problem := check.problem)]
    if generation is not None and not generation.exact:
        parts.append(generation.describe())  # departing is allowed: the figures and where it first departed
    else:
        parts.append(f"worst: {report.describe_worst()}")
    parts += [triage.describe()] if triage else []
    raise ValidationFailed("; ".join(parts))
