"""How a build is judged against eager PyTorch: tolerances, samples and gates."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from prefect_executorch.spec.base import StrictModel
from prefect_executorch.spec.fields import Dim
from prefect_executorch.spec.modelref import ModelRef

#: Default tolerances per dtype (|program - eager| <= atol + rtol * |eager|); ints and bools are exact.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-4),
    "float16": (5e-3, 5e-3),
    "bfloat16": (1.6e-2, 1.6e-2),
    # float32 whose matmuls round their inputs to TF32 (target.precision: tf32): float16's 10 mantissa bits.
    "tfloat32": (5e-3, 5e-3),
}
DEFAULT_MIN_COSINE: dict[str, float] = {"float32": 0.999, "float16": 0.99, "bfloat16": 0.99, "tfloat32": 0.999}


class Tolerance(StrictModel):
    """Tolerances for float outputs; unset fields fall back to the next more general level."""

    atol: float | None = Field(default=None, ge=0, description="Absolute tolerance.")
    rtol: float | None = Field(default=None, ge=0, description="Relative tolerance (times |eager|).")
    min_cosine: float | None = Field(default=None, ge=-1, le=1, description="Cosine similarity floor.")
    max_rel_error: float | None = Field(
        default=None, gt=0, description="Limit on |program - eager| / |eager| (L2 norms); quantized builds' default gate."
    )


def check_function_reference(value: str | None) -> str | None:
    """``value`` if it reads 'package.module:function' or 'path/to/file.py:function'."""
    if value is not None:
        ModelRef.check(value)
    return value


class MethodValidation(StrictModel):
    """Validation settings of one method: user samples, extra shapes, tolerances per output."""

    samples_file: str | None = Field(default=None, description="A .pt file (torch.load weights_only=True) holding a list of input tuples."
    )
    dataset: str | None = Field(default=None, description="'package.module:function' or 'path/file.py:function' returning an iterable of input tuples."
    )
    max_dataset_samples: int = Field(default=32, ge=1, description="How many samples to take from the dataset at most.")
    extra_shapes: list[list[list[Dim]]] = Field(
        default_factory=list, description="More shapes to validate, each a list of one shape per input."
    )
    outputs: dict[str, Tolerance] = Field(
        default_factory=dict, description="Tolerances by output path of this method, e.g. \"['logits']\" or '[1]'."
    )

    _dataset_reference = field_validator("dataset")(lambda value: check_function_reference(value))


class ValidationSpec(StrictModel):
    """How the exported program is compared with eager PyTorch."""

    atol: float | None = Field(default=None, ge=0, description="Absolute tolerance; default per dtype.")
    rtol: float | None = Field(default=None, ge=0, description="Relative tolerance; default per dtype.")
    min_cosine: float | None = Field(default=None, ge=-1, le=1, description="Cosine floor; default per dtype.")
    dtypes: dict[Literal["float32", "float16", "bfloat16"], Tolerance] = Field(
        default_factory=dict, description="Tolerances per output dtype (over atol/rtol/min_cosine)."
    )
    outputs: dict[str, Tolerance] = Field(
        default_factory=dict, description="Tolerances by output path, in every method (over dtypes)."
    )
    methods: dict[str, MethodValidation] = Field(
        default_factory=dict, description="Per method: user samples, extra shapes, output tolerances."
    )
    samples: int = Field(default=2, ge=1, le=1000, description="Seeded random input draws per shape.")
    seed: int = Field(default=0, ge=0, le=2**63 - 1, description="Seed of the random inputs (torch.Generator).")
    latency_runs: int = Field(default=5, ge=0, le=100_000, description="Timed warm runs per latency window (at least); 0: no timing.")
    latency_max_s: float = Field(default=5, gt=0, le=3600, description="Time cap of the latency windows of one method (they stop earlier once stable).")
    latency_warmup: int = Field(default=2, ge=0, le=1000, description="Untimed runs before the timed ones.")
    max_latency_ratio: float | None = Field(default=None, gt=0, description="Gate: program median latency / eager median latency must not exceed this."
    )
    min_delegated_fraction: float | None = Field(default=None, ge=0, le=1, description="Gate: fraction of each method's operators that a delegate runs."
    )
    timeout_s: float = Field(default=600, gt=0, description="Wall-time limit of the validating child process.")
    memory_limit_mib: int | None = Field(
        default=None, ge=512, description="Memory bound of the validating child (MiB); default per target: CPU "
        "targets 8192 of address space, GPU targets 32768 of resident memory (CUDA cannot start under an "
        "address-space limit).")

    @model_validator(mode="after")
    def _latency_gate_needs_runs(self) -> ValidationSpec:
        if self.max_latency_ratio is not None and self.latency_runs == 0:
            raise ValueError("max_latency_ratio needs latency_runs >= 1")
        return self


