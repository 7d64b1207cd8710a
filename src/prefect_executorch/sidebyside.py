"""Run a candidate program beside the one an alias serves now: same inputs, same process, same timing.

The child loads both programs, feeds both the same seeded inputs at every declared shape, compares
the candidate's outputs with the current program's at the spec's tolerances, and times both with
their latency windows interleaved (``latency.measure_together``), so the load of a shared machine
falls on both alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from prefect_executorch.compare import compare_outputs
from prefect_executorch.errors import ValidationFailed
from prefect_executorch.inputs import random_inputs, shape_points
from prefect_executorch.latency import LatencyStats, measure_together
from prefect_executorch.placement import needs_cuda
from prefect_executorch.runtime import LoadedProgram
from prefect_executorch.spec import MethodSpec, ValidationSpec
from prefect_executorch.targets import get_target
from prefect_executorch.validator import synchronized


class ProgramFiles(BaseModel):
    """A local bundle directory: its program and the .ptd files it loads with."""

    dir: str
    program: str
    data_files: list[str] = Field(default_factory=list)

    def load(self) -> LoadedProgram:
        """The loaded program (with its first .ptd, as validation loads it)."""
        bundle = Path(self.dir)
        return LoadedProgram(bundle / self.program, bundle / self.data_files[0] if self.data_files else None)


class SideBySideRequest(BaseModel):
    """What the side-by-side child gets."""

    current: ProgramFiles
    candidate: ProgramFiles
    methods: dict[str, MethodSpec] = Field(description="The candidate's methods and inputs.")
    validation: ValidationSpec
    target: str = Field("xnnpack", description="The bundles' target: its runtime is set up before either loads.")
    input_device: str = Field("cpu", description="Where the programs want their inputs (the manifest's runtime hint).")


class MethodComparison(BaseModel):
    """One method, candidate against current: output agreement and latency of both."""

    method: str
    cases: int
    disagreeing: int
    worst: str | None = Field(default=None, description="The first disagreement, in words.")
    shape_label: str | None = Field(default=None, description="The shape the latency was measured at.")
    current: LatencyStats | None = None
    candidate: LatencyStats | None = None

    @property
    def regression(self) -> float | None:
        """Candidate p50 / current p50 - 1 (0.25: 25% slower); None if not timed."""
        if self.current is None or self.candidate is None or self.current.p50_ms <= 0:
            return None
        return self.candidate.p50_ms / self.current.p50_ms - 1


class ComparisonRow(BaseModel):
    """One method of a side-by-side (a row of the Prefect table artifact and of the CLI's table)."""

    method: str
    inputs: int
    disagreeing: int
    current_p50_ms: float | None
    candidate_p50_ms: float | None
    current_p99_ms: float | None
    candidate_p99_ms: float | None
    regression: float | None = Field(description="Candidate p50 / current p50 - 1.")
    stable: bool = Field(description="Whether both latency figures settled before the time cap.")
    worst: str


class SideBySide(BaseModel):
    """Every method of the candidate, compared with the current program."""

    methods: list[MethodComparison]

    def disagreements(self) -> list[str]:
        """One line per method whose outputs differ from the current program's."""
        return [f"{m.method}: {m.disagreeing} of {m.cases} inputs disagree; {m.worst}" for m in self.methods
                if m.disagreeing]

    def regressions(self, limit: float) -> list[str]:
        """One line per method whose candidate p50 is more than ``limit`` slower than the current one."""
        lines = []
        for m in self.methods:
            regression = m.regression
            if regression is not None and regression > limit and m.current and m.candidate:
                lines.append(f"{m.method}: p50 {m.candidate.p50_ms:.3g} ms vs {m.current.p50_ms:.3g} ms now "
                             f"(+{regression:.0%}, limit +{limit:.0%}; candidate {m.candidate.describe()})")
        return lines

    def rows(self) -> list[ComparisonRow]:
        """One table row per method."""
        return [ComparisonRow(
            method=m.method, inputs=m.cases, disagreeing=m.disagreeing,
            current_p50_ms=m.current.p50_ms if m.current else None,
            candidate_p50_ms=m.candidate.p50_ms if m.candidate else None,
            current_p99_ms=m.current.p99_ms if m.current else None,
            candidate_p99_ms=m.candidate.p99_ms if m.candidate else None,
            regression=m.regression,
            stable=bool(m.current and m.candidate and m.current.stable and m.candidate.stable),
            worst=m.worst or "-",
        ) for m in self.methods]


def _compare_method(req: SideBySideRequest, name: str, current: LoadedProgram, candidate: LoadedProgram) -> MethodComparison:
    import torch

    method = req.methods[name]
    if name not in current.facts:
        return MethodComparison(method=name, cases=1, disagreeing=1,
                                worst=f"the current program has no method {name!r} (it has {sorted(current.facts)})")
    generator = torch.Generator().manual_seed(req.validation.seed)
    result = MethodComparison(method=name, cases=0, disagreeing=0)
    timing: tuple[str, tuple[torch.Tensor, ...]] | None = None
    for label, shapes in shape_points(method, req.validation.methods[name].extra_shapes
                                      if name in req.validation.methods else None):
        for _ in range(req.validation.samples):
            inputs = tuple(t.to(req.input_device) for t in random_inputs(method, shapes, generator))
            result.cases += 1
            try:
                expected = current.run(name, inputs, method.inputs)
                actual = candidate.run(name, inputs, method.inputs)
            except ValidationFailed as exc:
                result.disagreeing += 1
                result.worst = result.worst or f"at {label} {shapes}: {exc}"
                continue
            failed = [o for o in compare_outputs(actual, expected, req.validation, name) if not o.passed]
            if failed:
                result.disagreeing += 1
                result.worst = result.worst or f"output {failed[0].path} at {label} {shapes}: {failed[0].reason}"
            if timing is None or (label == "opt" and timing[0] != "opt"):
                timing = (label, inputs)
    if timing is not None and req.validation.latency_runs:
        label, inputs = timing
        result.shape_label = label
        # GPU programs return before the device is done: both sides wait for it, as in validation.
        device = "cuda" if needs_cuda(req.target) else "cpu"
        result.current, result.candidate = measure_together(
            [synchronized(lambda: current.execute(name, inputs), device),
             synchronized(lambda: candidate.execute(name, inputs), device)],
            min_runs=req.validation.latency_runs, warmup=req.validation.latency_warmup,
            max_seconds=req.validation.latency_max_s,
        )
    return result


def side_by_side_in_child(request: dict[str, Any]) -> SideBySide:
    """Child side: load both programs, compare every method on the same inputs, time both alike."""
    import torch

    req = SideBySideRequest.model_validate(request)
    # TensorRT: TF32 off and the delegate runtime registered before ExecuTorch's own runtime loads.
    get_target(req.target).runtime_setup()
    current, candidate = req.current.load(), req.candidate.load()
    with torch.no_grad():
        return SideBySide(methods=[_compare_method(req, name, current, candidate) for name in req.methods])
