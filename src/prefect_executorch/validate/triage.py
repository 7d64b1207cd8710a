"""Triage of a failed validation: the operators where the program first and most departs from eager.

ExecuTorch's Inspector pairs, by debug handle, the intermediate outputs of a reference graph (an
ETRecord of the eager model re-exported in the child, run on the failing case's inputs) with the
ones the runtime logged while running the published program (an ETDump and its debug buffer). The
runtime logs them only when it was built with the event tracer (EXECUTORCH_ENABLE_EVENT_TRACER): the
PyPI wheel of ExecuTorch 1.4.1 was not, 1.5.1 is. Without it triage is skipped, and says why.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from prefect_executorch.errors import PrefectExecutorchError
from prefect_executorch.isolation import run_isolated
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.targets import PROGRAM_FILE, get_target

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from prefect_executorch.validate.report import ValidationReport

#: Targets whose lowering the child can redo with an ETRecord (the GPU target's engines log no intermediates).
TRIAGE_TARGETS = ("portable", "xnnpack")
#: Bytes the runtime may log intermediate outputs into; what does not fit is not logged.
DEBUG_BUFFER_BYTES = 64 * 2**20
NO_EVENT_TRACER = (
    "this ExecuTorch runtime ({version}) was built without the event tracer (EXECUTORCH_ENABLE_EVENT_TRACER): "
    "write_etdump_result_to_file wrote no ETDump, so there are no runtime intermediate outputs to compare; "
    "install executorch>=1.5.1, whose PyPI wheel has it, to get operator-level triage"
)
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)\n\s*(?P<code>[^\n]*)')


class OperatorGap(BaseModel):
    """One operator (or delegated subgraph) of the program beside the same operator of the eager model."""

    position: int = Field(description="Order in the program's execution.")
    operators: str = Field(description="The reference graph's operators, e.g. 'linear_1'.")
    module: str | None = Field(None, description="The model's submodule that produced them, e.g. 'fc1 (Linear)'.")
    runtime: str = Field(description="What the runtime ran: a kernel ('native_call_addmm.out') or 'DELEGATE_CALL'.")
    mse: float
    max_abs_error: float
    departs: bool = Field(description="Whether the error is above the spec's tolerances (atol + rtol * |eager|).")
    source: str | None = Field(None, description="The model's source line: 'file:line in function: code'.")

    def describe(self) -> str:
        """'linear_1 (fc2 (Linear), models.py:57) max |err| 0.3, mse 0.01'."""
        where = ", ".join(part for part in (self.module, self.source) if part)
        return (f"{self.operators}{f' ({where})' if where else ''}: max |error| {self.max_abs_error:.3g}, "
                f"mse {self.mse:.3g}, runtime {self.runtime}")


class TriageReport(BaseModel):
    """Where the program departs from eager on one failing case, or why that was not found out."""

    method: str
    case: str = Field(description="The failing case replayed: '<shape label>[<sample>]'.")
    skipped: str | None = Field(None, description="Why no operator-level comparison was made.")
    operators: list[OperatorGap] = Field(default_factory=list)

    @property
    def first(self) -> OperatorGap | None:
        """The first operator, in execution order, above the tolerances."""
        return next((gap for gap in self.operators if gap.departs), None)

    @property
    def worst(self) -> OperatorGap | None:
        """The operator with the largest error."""
        return max(self.operators, key=lambda gap: gap.max_abs_error, default=None)

    def rows(self) -> list[OperatorGap]:
        """The first and the worst operator (one row when they are the same)."""
        rows = [gap for gap in (self.first, self.worst) if gap is not None]
        return rows[:1] if len(rows) == 2 and rows[0] == rows[1] else rows

    def describe(self) -> str:
        """One line for the failure message: the worst operator and the first one, or why triage was skipped."""
        if self.skipped:
            return f"triage of {self.method} {self.case} skipped: {self.skipped}"
        worst, first = self.worst, self.first
        if worst is None:
            return f"triage of {self.method} {self.case}: the runtime logged no operator outputs to compare"
        text = f"worst operator of {self.method} {self.case}: {worst.describe()}"
        if first is not None and first != worst:
            text += f"; first departs at {first.describe()}"
        return text


class TriageRequest(BaseModel):
    """What the triage child gets: the bundle and the failing case to replay."""

    spec: BuildSpec
    bundle_dir: str
    data_files: list[str] = Field(default_factory=list)
    method: str
    shape_label: str
    sample: int
    work_dir: str


def _case_inputs(spec: BuildSpec, method: str, label: str, sample: int) -> tuple[torch.Tensor, ...]:
    from prefect_executorch.spec.inputs import case_inputs

    for case_label, case_sample, inputs in case_inputs(spec, method, spec.methods[method]):
        if (case_label, case_sample) == (label, sample):
            return inputs
    raise PrefectExecutorchError(f"triage: method {method!r} has no case {label}[{sample}] to replay")


def run_with_etdump(pte: Path, data: Path | None, method: str, inputs: tuple[Any, ...], out_dir: Path) -> str | None:
    """Run one method with an ETDump and debug buffer written to ``out_dir``; the reason if the runtime logs nothing."""
    from importlib.metadata import version

    from prefect_executorch.machine.runtime_extension import runtime_extension

    module = runtime_extension()._load_for_executorch(str(pte), str(data) if data else None, enable_etdump=True,
                                  debug_buffer_size=DEBUG_BUFFER_BYTES)
    module.run_method(method, inputs)
    module.write_etdump_result_to_file(str(out_dir / "etdump.etdp"), str(out_dir / "debug.bin"))
    if (out_dir / "etdump.etdp").is_file():
        return None
    # The package has no __version__; its distribution's metadata says which wheel this is.
    return NO_EVENT_TRACER.format(version=f"executorch {version('executorch')}")


def _reference_etrecord(spec: BuildSpec, method: str, inputs: tuple[Any, ...], path: Path) -> ExportedProgram:
    """Export and lower the eager method as the target does, save its ETRecord with ``inputs``; return the ATen program."""
    from prefect_executorch.spec.inputs import dynamic_shapes, example_inputs
    from prefect_executorch.spec.modelref import load_model, method_module
    from prefect_executorch.targets.cpu import CpuTarget

    target = get_target(spec.target_name)
    assert isinstance(target, CpuTarget), "triage covers the CPU targets (TRIAGE_TARGETS) only"
    settings = spec.methods[method]
    module = method_module(load_model(spec), method, settings.attribute)
    program = target.export_method(module, example_inputs(settings, seed=spec.validation.seed), dynamic_shapes(settings), spec)
    etrecord = target.to_executorch(target.edge_program(program, generate_etrecord=True), spec).get_etrecord()
    etrecord.update_representative_inputs(list(inputs))
    etrecord.save(str(path))
    return program


def _source_line(trace: str | None, library_roots: tuple[str, ...]) -> str | None:
    """The innermost frame of ``trace`` in the model's code (not in torch's)."""
    frames = [m for m in _FRAME.finditer(trace or "") if not m["file"].startswith(library_roots)]
    if not frames:
        return None
    last = frames[-1]
    return f"{last['file']}:{last['line']} in {last['function']}: {last['code'].strip()}"


def _module_names(program: ExportedProgram) -> dict[str, str]:
    """Node name -> the innermost submodule that produced it, as 'fc1 (Linear)'."""
    names = {}
    for node in program.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            path, kind = list(stack.values())[-1]
            kind = getattr(kind, "__name__", str(kind).rsplit(".", 1)[-1])
            names[node.name] = f"{path} ({kind})" if path else kind
    return names


def _flat(value: Any) -> list[torch.Tensor]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _flat(item)]
    return []


def _errors(aot: Any, runtime: Any, atol: float, rtol: float) -> tuple[float, bool]:
    """(max |runtime - aot|, whether any element is above atol + rtol * |aot|) over every tensor of an output."""
    worst, departs = 0.0, False
    expected_leaves, actual_leaves = _flat(aot), _flat(runtime)
    if len(expected_leaves) != len(actual_leaves):
        return float("inf"), True
    for expected, actual in zip(expected_leaves, actual_leaves, strict=True):
        if expected.shape != actual.shape:
            return float("inf"), True
        diff = (actual.double() - expected.double()).abs()
        if diff.numel():
            worst = max(worst, float(diff.max()))
            departs = departs or bool((diff > atol + rtol * expected.double().abs()).any())
    return worst, departs


def _gaps(frame: Any, spec: BuildSpec, method: str, modules: dict[str, str]) -> list[OperatorGap]:
    import executorch
    import torch

    from prefect_executorch.validate.compare import limits_for

    limits = limits_for(spec.validation, method, "", "float32")
    atol, rtol = limits.atol or 0.0, limits.rtol or 0.0
    roots = (str(Path(torch.__file__).parent), *executorch.__path__)
    gaps = []
    for position, row in enumerate(frame.itertuples(index=False)):
        max_abs, departs = _errors(row.aot_intermediate_output, row.runtime_intermediate_output, atol, rtol)
        traces = row.stacktraces or {}
        first_op = next(iter(row.aot_ops), None)
        gaps.append(OperatorGap(
            position=position, operators=", ".join(row.aot_ops), module=modules.get(first_op or ""),
            runtime=", ".join(row.runtime_ops), mse=max(float(g) for g in row.gap) if len(row.gap) else 0.0,
            max_abs_error=max_abs, departs=departs,
            source=_source_line(traces.get(first_op) if first_op else None, roots),
        ))
    return gaps


def triage_in_child(request: dict[str, Any]) -> TriageReport:
    """Child side: replay the failing case on the program with an ETDump, compare each operator with the ETRecord."""
    import torch

    req = TriageRequest.model_validate(request)
    spec, bundle, work = req.spec, Path(req.bundle_dir), Path(req.work_dir)
    report = TriageReport(method=req.method, case=f"{req.shape_label}[{req.sample}]")
    target = get_target(spec.target_name)
    with torch.no_grad():
        inputs = tuple(target.prepare_input(t, spec) for t in _case_inputs(spec, req.method, req.shape_label, req.sample))
        data = bundle / req.data_files[0] if req.data_files else None
        skipped = run_with_etdump(bundle / PROGRAM_FILE, data, req.method, inputs, work)
        if skipped:
            return report.model_copy(update={"skipped": skipped})
        from executorch.devtools import Inspector

        program = _reference_etrecord(spec, req.method, inputs, work / "etrecord.bin")
        inspector = Inspector(etdump_path=str(work / "etdump.etdp"), etrecord=str(work / "etrecord.bin"),
                              debug_buffer_path=str(work / "debug.bin"))
        frame = inspector.calculate_numeric_gap("MSE")
    return report.model_copy(update={"operators": _gaps(frame, spec, req.method, _module_names(program))})


def triage_failure(
    spec: BuildSpec, report: ValidationReport, bundle_dir: Path, data_files: list[str], *, scratch_dir: Path
) -> TriageReport | None:
    """Triage the first failed case whose program call ran (None if none did, as for a pass); a triage that fails says why."""
    case = next((case for case in report.failures() if case.error is None), None)
    if case is None:
        return None
    triage = TriageReport(method=case.method, case=f"{case.shape_label}[{case.sample}]")
    if spec.target_name not in TRIAGE_TARGETS:
        return triage.model_copy(update={"skipped": f"target {spec.target_name!r}: triage covers {', '.join(TRIAGE_TARGETS)}"})
    if spec.quantization is not None:
        return triage.model_copy(update={"skipped": "quantized builds: their error is split into quantization and "
                                                    "lowering in the report instead"})
    target = get_target(spec.target_name)
    work = scratch_dir / f"triage-{case.method}-{case.shape_label}-{case.sample}"
    work.mkdir(parents=True, exist_ok=True)
    request = TriageRequest(spec=spec, bundle_dir=str(bundle_dir), data_files=data_files, method=case.method,
                            shape_label=case.shape_label, sample=case.sample, work_dir=str(work))
    try:
        return run_isolated("triage", request, TriageReport, timeout_s=spec.validation.timeout_s,
                            scratch_dir=scratch_dir, memory_limit=target.memory_limit("export", spec.export_memory_limit_mib),
                            what=f"triage of {spec.name} {spec.version} {case.method}")
    except PrefectExecutorchError as exc:
        # Triage explains a failure that is already certain: its own failure must not replace that one.
        return triage.model_copy(update={"skipped": f"triage failed: {str(exc).splitlines()[0]}"})
