"""Validation results: per output, per case, per gate, per program."""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from prefect_executorch.export.quantize import QuantizationFacts
from prefect_executorch.runtime.decoding import GenerationStats
from prefect_executorch.targets.delegation import DelegationFacts
from prefect_executorch.validate.latency import LatencyStats
from prefect_executorch.validate.replay import ReplayCheck


class OutputComparison(BaseModel):
    """One output of one call, program vs eager."""

    path: str = Field(description="Where the output sits in the method's result, e.g. '[0]' or \"['logits']\".")
    expected_shape: list[int]
    actual_shape: list[int]
    expected_dtype: str
    actual_dtype: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    mismatch_fraction: float = Field(default=0.0, description="Fraction of elements beyond atol + rtol * |eager|.")
    cosine: float | None = None
    rel_error: float | None = Field(default=None, description="|program - eager| / |eager| (L2 norms).")
    atol: float | None = Field(default=0.0, description="None: no element-wise check (quantized builds' default).")
    rtol: float | None = 0.0
    min_cosine: float | None = None
    max_rel_error: float | None = Field(default=None, description="Limit on rel_error, if any.")
    tolerance_source: str | None = Field(default=None, description="The spec field the tolerances came from.")
    passed: bool
    reason: str | None = Field(default=None, description="Why it failed, naming the broken tolerance.")


class CaseResult(BaseModel):
    """One call of one method on one input tuple."""

    method: str
    shape_label: str = Field(
        description="'static', 'min', 'opt', 'max', 'extra[i]' (random inputs) or 'samples_file', 'dataset'."
    )
    input_shapes: list[list[int]]
    input_ranges: list[list[float] | None] = Field(
        default_factory=list, description="[min, max] of each input's values (None for an empty input)."
    )
    sample: int
    outputs: list[OutputComparison] = Field(default_factory=list)
    error: str | None = Field(default=None, description="Why the call itself failed, if it did.")
    quantization_error: list[OutputComparison] = Field(
        default_factory=list, description="Quantized builds: quantized eager vs float eager (what rounding costs)."
    )
    lowering_error: list[OutputComparison] = Field(
        default_factory=list, description="Quantized builds: program vs quantized eager (what lowering adds)."
    )

    @property
    def passed(self) -> bool:
        """Whether the call ran and every output matched."""
        return self.error is None and all(o.passed for o in self.outputs)

    def error_split(self, path: str) -> str:
        """A quantized build's error at ``path`` split into quantization and lowering, in words ('' if float)."""
        parts = []
        for what, comparisons in (("quantization alone", self.quantization_error), ("lowering", self.lowering_error)):
            found = next((o for o in comparisons if o.path == path and o.rel_error is not None), None)
            if found is not None:
                parts.append(f"{what}: rel error {found.rel_error:.3g}, cosine {found.cosine or 0:.6f}")
        return f" ({'; '.join(parts)})" if parts else ""

    @property
    def where(self) -> str:
        """The method, shape label and input shapes of this case, in words."""
        return f"{self.method} at {self.shape_label} {self.input_shapes} (sample {self.sample})"


class LatencyResult(BaseModel):
    """Warm latency of one method, eager vs program, measured in the same process."""

    method: str
    shape_label: str
    input_shapes: list[list[int]]
    runs: int
    eager_median_ms: float
    eager_p90_ms: float
    program_median_ms: float
    program_p90_ms: float
    ratio: float = Field(description="Program median / eager median.")
    synchronized: bool = Field(False, description="Each timed CUDA call waited for the device (both sides).")
    stable: bool = Field(default=True, description="Whether both figures settled before the time cap.")
    eager: LatencyStats | None = Field(default=None, description="Eager's windows and percentiles.")
    program: LatencyStats | None = Field(default=None, description="The program's windows and percentiles.")


class GateResult(BaseModel):
    """One gate on one method: a measured figure against the spec's limit."""

    gate: str = Field(description="The spec field: 'min_delegated_fraction' or 'max_latency_ratio'.")
    section: str = Field("validation", description="The spec section the field is in.")
    method: str
    measured: float | None = Field(description="The figure; None when it could not be measured.")
    limit: float
    passed: bool
    detail: str = Field(description="What was measured and why it passed or failed, in words.")

    def describe(self) -> str:
        """One line naming the gate, the method and the figure."""
        return f"gate {self.section}.{self.gate} on {self.method}: {self.detail}"


class ShapeRow(BaseModel):
    """The cases of one method at one shape label, summed up (one row of the report tables)."""

    method: str
    shape: str
    input_shapes: str
    cases: int
    failed: int
    max_abs: float
    max_rel: float
    min_cosine: float | None
    mismatch_fraction: float
    result: str


class MethodRow(BaseModel):
    """What one method runs on and how fast, eager vs program (one row of the report tables)."""

    method: str
    delegates: str
    delegated: str = Field(description="Delegated operators of all, or 'unknown'.")
    first_call_ms: float | None
    eager_median_ms: float | None
    eager_p90_ms: float | None
    program_median_ms: float | None
    program_p90_ms: float | None
    latency_ratio: float | None


class TeacherForced(BaseModel):
    """The program fed a prompt and eager's continuation one token per call, against fp32 eager on the same tokens."""

    positions: int
    top1_agreement: float = Field(description="Share of positions where both predict the same next token.")
    logit_rel_error: float = Field(description="|program - eager| / |eager| over the logits of every position.")
    nll: float = Field(description="The program's mean negative log-likelihood of eager's continuation.")
    eager_nll: float = Field(description="fp32 eager's mean negative log-likelihood of its own continuation.")


class GenerationCase(BaseModel):
    """One validation prompt: eager's greedy tokens and the program's, each token as its text."""

    prompt: str
    prompt_tokens: int
    subject: str = Field("prompt", description="What ``prompt`` names: a prompt, or a speech model's clip.")
    expected: list[str] = Field(description="Eager PyTorch's tokens.")
    actual: list[str] = Field(description="The program's tokens (GenerationReport.generated_by made them).")
    first_divergence: int | None = Field(description="The first position where they differ (None: they agree).")
    reference: str = Field("eager", description="What generated the expected tokens.")
    forced: TeacherForced | None = Field(None, description="The program fed eager's tokens: how its next-token "
                                         "predictions compare with fp32 eager's.")

    @property
    def passed(self) -> bool:
        """Whether the program generated what eager did."""
        return self.first_divergence is None

    def describe(self) -> str:
        """Where the program departs from eager, in words."""
        if self.first_divergence is None:
            return f"{self.subject} {self.prompt!r}: {len(self.actual)} tokens, as {self.reference}'s"
        at = self.first_divergence
        ours = repr(self.actual[at]) if at < len(self.actual) else "nothing (it stopped)"
        theirs = repr(self.expected[at]) if at < len(self.expected) else f"nothing ({self.reference} stopped)"
        return f"{self.subject} {self.prompt!r}: new token {at} is {ours} where {self.reference} generates {theirs}"


class GenerationReport(BaseModel):
    """What validating a decoder LM by generation found."""

    new_tokens: int
    cases: list[GenerationCase]
    stats: list[GenerationStats] = Field(default_factory=list, description="The runner's timing per prompt.")
    exact: bool = Field(True, description="Whether every token must be eager's (float32 builds); quantized and "
                        "lower-precision builds are judged by their gates instead.")
    generated_by: str = Field("ExecuTorch's LLM runner", description="What ran the program to generate.")

    @property
    def passed(self) -> bool:
        """Whether every prompt generated what eager did (for a quantized build: always; its gates judge it)."""
        return not self.failed_cases()

    def failed_cases(self) -> list[GenerationCase]:
        """The prompts that fail a float build: their tokens departed from eager's."""
        return [case for case in self.cases if not case.passed] if self.exact else []

    def forced(self) -> list[TeacherForced]:
        """The teacher-forced figures of every prompt that has them."""
        return [case.forced for case in self.cases if case.forced is not None]

    def top1_agreement(self) -> float | None:
        """Teacher-forced top-1 agreement over every position of every prompt."""
        forced = self.forced()
        positions = sum(f.positions for f in forced)
        return sum(f.top1_agreement * f.positions for f in forced) / positions if positions else None

    def perplexity_ratio(self) -> float | None:
        """The program's perplexity of eager's continuations over fp32 eager's, over every position."""
        forced = self.forced()
        positions = sum(f.positions for f in forced)
        if not positions:
            return None
        return math.exp(sum((f.nll - f.eager_nll) * f.positions for f in forced) / positions)

    def agreement(self) -> float:
        """Share of eager's tokens the program generated the same, before each prompt's first divergence."""
        total = sum(len(case.expected) for case in self.cases)
        same = sum(len(case.expected) if case.passed else case.first_divergence or 0 for case in self.cases)
        return same / total if total else 1.0

    def describe(self) -> str:
        """The first failed prompt, or how many agreed (a quantized build: its first divergence and agreement)."""
        failed = self.failed_cases()
        if failed:
            return failed[0].describe()
        if self.exact:
            unit = self.cases[0].subject if self.cases else "prompt"
            return f"{len(self.cases)} {unit}{'s' * (len(self.cases) != 1)}, every token as eager's"
        departed = next((case for case in self.cases if not case.passed), None)
        agreement, ratio = self.top1_agreement(), self.perplexity_ratio()
        figures = (f"teacher-forced top-1 agreement {agreement:.1%}, perplexity {ratio:.3f}x fp32 eager's"
                   if agreement is not None and ratio is not None
                   else f"{self.agreement():.1%} of fp32 eager's tokens the same")
        first = f"; first departure: {departed.describe()}" if departed else "; every token as fp32 eager's"
        return figures + first


class ValidationSummary(BaseModel):
    """What a manifest keeps of a validation."""

    passed: bool
    cases: int
    failed_cases: int
    shapes: dict[str, list[str]] = Field(description="Shape labels checked per method.")
    worst: str | None = Field(default=None, description="The worst output and its error, in words.")
    worst_max_abs: float = 0.0
    min_cosine_seen: float | None = None
    delegated_fraction: dict[str, float | None] = Field(
        default_factory=dict, description="Share of each method's operators that delegates run (None: unknown)."
    )
    latency_ratio: dict[str, float] = Field(default_factory=dict, description="Program / eager median latency.")
    gates_failed: list[str] = Field(default_factory=list)
    quantization: QuantizationFacts | None = Field(default=None, description="How the build was quantized.")
    quantization_rel_error: float | None = Field(
        default=None, description="Worst |quantized eager - float eager| / |float eager| over all outputs."
    )
    lowering_rel_error: float | None = Field(
        default=None, description="Worst |program - quantized eager| / |quantized eager| over all outputs."
    )
    generation_agreement: float | None = Field(
        default=None, description="A decoder LM's share of eager's greedy tokens its program generated the same."
    )
    generated_by: str | None = Field(default=None, description="What ran a decoder LM's program to generate.")
    replayed: list[str] = Field(default_factory=list, description="Methods validated on their CUDA-graph replays, "
                                "each shown captured and equal to a direct call first.")


class ValidationReport(BaseModel):
    """Everything one validation found."""

    passed: bool
    cases: list[CaseResult]
    delegates: dict[str, list[str]]
    load_seconds: float
    first_call_seconds: dict[str, float] = Field(
        default_factory=dict, description="First call of each method, which loads it and initialises its delegates."
    )
    used_data_file: bool = Field(description="Whether the program was loaded with its .ptd.")
    quantization: QuantizationFacts | None = Field(default=None, description="How the build was quantized (None: float).")
    file_sizes: dict[str, int] = Field(default_factory=dict, description="Bytes of the program and data files validated.")
    delegation: dict[str, DelegationFacts] = Field(
        default_factory=dict, description="Operators delegated per method, as recorded at export."
    )
    latency: list[LatencyResult] = Field(default_factory=list)
    gates: list[GateResult] = Field(default_factory=list)
    memory_bound: str = Field("none", description="How the validating child was bounded: address space, a watch on "
                              "its resident memory (children that initialise CUDA), or none.")
    generation: GenerationReport | None = Field(default=None, description="A decoder LM's validation by generation.")
    replay: list[ReplayCheck] = Field(default_factory=list, description="Each CUDA-graph method's capture and replay "
                                      "(target.cuda_graphs), checked before the cases ran on the replays.")

    def failures(self) -> list[CaseResult]:
        """The cases that failed."""
        return [case for case in self.cases if not case.passed]

    def failed_gates(self) -> list[GateResult]:
        """The gates that failed."""
        return [gate for gate in self.gates if not gate.passed]

    def worst_output(self) -> tuple[CaseResult, OutputComparison] | None:
        """The output with the largest error, preferring failed ones."""
        pairs = [(case, out) for case in self.cases for out in case.outputs]
        if not pairs:
            return None
        return max(pairs, key=lambda pair: (not pair[1].passed, pair[1].mismatch_fraction, pair[1].max_abs))

    def describe_worst(self) -> str | None:
        """One line on the worst failure: a failed call, else a failed output, else a failed gate (an LLM: its prompts)."""
        if self.generation is not None:
            # An exact build: its first failed prompt; a quantized or lower-precision one: its figures and first
            # departure (its gates are listed on their own).
            return self.generation.describe()
        failed_call = next((case for case in self.cases if case.error), None)
        if failed_call is not None:
            return f"{failed_call.where}: {failed_call.error}"
        worst = self.worst_output()
        gates = self.failed_gates()
        if gates and (worst is None or worst[1].passed):
            return gates[0].describe()
        if worst is None:
            return None
        case, out = worst
        where = f"{case.method}{out.path} at {case.shape_label} {case.input_shapes} (sample {case.sample})"
        if out.reason:
            return f"{where}: {out.reason}{case.error_split(out.path)}"
        cosine = f", cosine {out.cosine:.6f}" if out.cosine is not None else ""
        return f"{where}: max abs error {out.max_abs:.3g}{cosine}"

    def shape_rows(self) -> list[ShapeRow]:
        """One row per method x shape label: worst errors over its samples and outputs."""
        groups: dict[tuple[str, str], list[CaseResult]] = {}
        for case in self.cases:
            groups.setdefault((case.method, case.shape_label), []).append(case)
        rows = []
        for (method, label), cases in groups.items():
            outputs = [o for c in cases for o in c.outputs]
            shapes = {str(c.input_shapes) for c in cases}
            failed = [c for c in cases if not c.passed]
            first_failure = next((c.error or next((o.reason for o in c.outputs if o.reason), None) for c in failed), None)
            cosines = [o.cosine for o in outputs if o.cosine is not None]
            rows.append(ShapeRow(
                method=method,
                shape=label,
                input_shapes=shapes.pop() if len(shapes) == 1 else f"{len(shapes)} shapes",
                cases=len(cases),
                failed=len(failed),
                max_abs=max((o.max_abs for o in outputs), default=0.0),
                max_rel=max((o.max_rel for o in outputs), default=0.0),
                min_cosine=min(cosines) if cosines else None,
                mismatch_fraction=max((o.mismatch_fraction for o in outputs), default=0.0),
                result="pass" if not failed else f"FAIL: {(first_failure or '').splitlines()[0]}",
            ))
        return rows

    def method_rows(self) -> list[MethodRow]:
        """One row per method: delegates, delegated fraction, first call and warm latency."""
        latency = {result.method: result for result in self.latency}
        rows = []
        for method, delegates in self.delegates.items():
            facts, timing = self.delegation.get(method), latency.get(method)
            first_call = self.first_call_seconds.get(method)
            rows.append(MethodRow(
                method=method,
                delegates=", ".join(delegates) or "none (portable kernels)",
                delegated="unknown" if facts is None or facts.fraction is None
                else f"{facts.delegated_ops}/{facts.total_ops} ({facts.fraction:.0%})",
                first_call_ms=None if first_call is None else first_call * 1000,
                eager_median_ms=timing.eager_median_ms if timing else None,
                eager_p90_ms=timing.eager_p90_ms if timing else None,
                program_median_ms=timing.program_median_ms if timing else None,
                program_p90_ms=timing.program_p90_ms if timing else None,
                latency_ratio=timing.ratio if timing else None,
            ))
        return rows

    def summary(self) -> ValidationSummary:
        """The manifest's view of this report."""
        shapes: dict[str, list[str]] = {}
        for case in self.cases:
            labels = shapes.setdefault(case.method, [])
            if case.shape_label not in labels:
                labels.append(case.shape_label)
        cosines = [o.cosine for c in self.cases for o in c.outputs if o.cosine is not None]
        return ValidationSummary(
            passed=self.passed,
            # A decoder LM's cases are its prompts.
            cases=len(self.generation.cases) if self.generation else len(self.cases),
            failed_cases=len(self.generation.failed_cases()) if self.generation else len(self.failures()),
            shapes=shapes,
            worst=self.describe_worst(),
            worst_max_abs=max((o.max_abs for c in self.cases for o in c.outputs), default=0.0),
            min_cosine_seen=min(cosines) if cosines else None,
            delegated_fraction={name: facts.fraction for name, facts in self.delegation.items()},
            latency_ratio={result.method: result.ratio for result in self.latency},
            gates_failed=[gate.describe() for gate in self.failed_gates()],
            quantization=self.quantization,
            quantization_rel_error=self._worst_rel_error("quantization_error"),
            lowering_rel_error=self._worst_rel_error("lowering_error"),
            generation_agreement=self.generation.agreement() if self.generation else None,
            generated_by=self.generation.generated_by if self.generation else None,
            replayed=[check.method for check in self.replay if check.problem is None],
        )

    def _worst_rel_error(self, field: str) -> float | None:
        errors = [o.rel_error for c in self.cases for o in getattr(c, field) if o.rel_error is not None]
        return max(errors) if errors else None
