"""Validation results: per output, per case, per program."""

from __future__ import annotations

from pydantic import BaseModel, Field


class OutputComparison(BaseModel):
    """One output of one call, program vs eager."""

    path: str = Field(description="Where the output sits in the method's result, e.g. '[0]' or \"['logits']\".")
    expected_shape: list[int]
    actual_shape: list[int]
    expected_dtype: str
    actual_dtype: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    mismatch_fraction: float = Field(0.0, description="Fraction of elements beyond atol + rtol * |eager|.")
    cosine: float | None = None
    atol: float = 0.0
    rtol: float = 0.0
    min_cosine: float | None = None
    passed: bool
    reason: str | None = Field(None, description="Why it failed, naming the broken tolerance.")


class CaseResult(BaseModel):
    """One call of one method at one shape with one sample."""

    method: str
    shape_label: str = Field(description="'static', 'min', 'opt', 'max' or 'sample'.")
    input_shapes: list[list[int]]
    sample: int
    outputs: list[OutputComparison] = Field(default_factory=list)
    error: str | None = Field(None, description="Why the call itself failed, if it did.")

    @property
    def passed(self) -> bool:
        """Whether the call ran and every output matched."""
        return self.error is None and all(o.passed for o in self.outputs)


class ValidationSummary(BaseModel):
    """What a manifest keeps of a validation."""

    passed: bool
    cases: int
    failed_cases: int
    shapes: dict[str, list[str]] = Field(description="Shape labels checked per method.")
    worst: str | None = Field(None, description="The worst output and its error, in words.")
    worst_max_abs: float = 0.0
    min_cosine_seen: float | None = None


class ValidationReport(BaseModel):
    """Everything one validation found."""

    passed: bool
    cases: list[CaseResult]
    delegates: dict[str, list[str]]
    load_seconds: float
    used_data_file: bool = Field(description="Whether the program was loaded with its .ptd.")

    def failures(self) -> list[CaseResult]:
        """The cases that failed."""
        return [case for case in self.cases if not case.passed]

    def worst_output(self) -> tuple[CaseResult, OutputComparison] | None:
        """The output with the largest error, preferring failed ones."""
        pairs = [(case, out) for case in self.cases for out in case.outputs]
        if not pairs:
            return None
        return max(pairs, key=lambda pair: (not pair[1].passed, pair[1].mismatch_fraction, pair[1].max_abs))

    def describe_worst(self) -> str | None:
        """One line on the worst failure (or the worst output when all passed)."""
        failed_call = next((case for case in self.cases if case.error), None)
        if failed_call is not None:
            return f"{failed_call.method} at {failed_call.shape_label} {failed_call.input_shapes}: {failed_call.error}"
        worst = self.worst_output()
        if worst is None:
            return None
        case, out = worst
        where = f"{case.method}{out.path} at {case.shape_label} {case.input_shapes} (sample {case.sample})"
        if out.reason:
            return f"{where}: {out.reason}"
        cosine = f", cosine {out.cosine:.6f}" if out.cosine is not None else ""
        return f"{where}: max abs error {out.max_abs:.3g}{cosine}"

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
            cases=len(self.cases),
            failed_cases=len(self.failures()),
            shapes=shapes,
            worst=self.describe_worst(),
            worst_max_abs=max((o.max_abs for c in self.cases for o in c.outputs), default=0.0),
            min_cosine_seen=min(cosines) if cosines else None,
        )
