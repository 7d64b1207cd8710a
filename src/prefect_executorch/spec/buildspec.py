"""The build spec: what to export, for which target, and how to validate it."""

from __future__ import annotations

import difflib
import hashlib
import json
import keyword
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from prefect_executorch.errors import SpecError
from prefect_executorch.spec.base import StrictModel, is_safe_name
from prefect_executorch.spec.llm import TextGenerationSpec, check_model_dir
from prefect_executorch.spec.modelref import ModelRef, check_factory
from prefect_executorch.spec.options import OPTIONS, TargetSpec, XnnpackOptions

#: The targets an `llm:` spec builds for (the runner's program with a static KV cache).
LLM_TARGETS = ("xnnpack", "portable", "cuda")
#: The quantization schemes of an `llm:` spec.
LLM_SCHEMES = ("int8da4w",)
Dtype = Literal["float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool"]
FLOAT_DTYPES = ("float32", "float16", "bfloat16")

#: Default tolerances per dtype (|program - eager| <= atol + rtol * |eager|); ints and bools are exact.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-4),
    "float16": (5e-3, 5e-3),
    "bfloat16": (1.6e-2, 1.6e-2),
}
DEFAULT_MIN_COSINE: dict[str, float] = {"float32": 0.999, "float16": 0.99, "bfloat16": 0.99}
#: Representable range of the integer dtypes, for checking low/high.
INT_RANGES: dict[str, tuple[int, int]] = {
    "int8": (-(2**7), 2**7 - 1),
    "uint8": (0, 2**8 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}
#: Largest finite value of the float dtypes, for checking low/high.
FLOAT_MAX: dict[str, float] = {
    "float32": 3.4028234663852886e38,
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
}
#: Bytes per element of each dtype, for the input-size budget.
DTYPE_SIZES: dict[str, int] = {
    "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int8": 1, "uint8": 1, "bool": 1,
}
#: Largest size of one dimension: torch.export and ExecuTorch hold sizes as 32-bit signed ints.
MAX_DIM = 2**31 - 1
#: A shape dimension or dynamic bound: [1, 2^31-1].
Dim = Annotated[int, Field(ge=1, le=MAX_DIM)]
#: Method, input and dynamic-dim names: ASCII identifiers. Methods become ExecuTorch method names and module
#: attributes, dim names (default ``<input>_dim<i>``) torch.export symbols, which must be identifiers; and
#: input names appear in reports (markdown tables) and error messages, where a plain word is safe.
_IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_DECIMAL_RE = re.compile(r"^(0|[1-9][0-9]{0,9})$")


NAME_RULE = (
    "is not a valid name; use 1-128 lowercase letters, digits, '-', '_' or '.', "
    "starting with a letter or digit, with no '/' and no '..'"
)


def check_name(value: str, field: str) -> str:
    """Return ``value`` if it is a safe path segment, else raise ``SpecError`` naming ``field``."""
    if not is_safe_name(value):
        raise SpecError(f"{field}: {value!r} {NAME_RULE}")
    return value


def check_identifier(value: str, what: str) -> str:
    """Return ``value`` if it is an ASCII identifier and no Python keyword, else raise ``ValueError``."""
    if not _IDENTIFIER_RE.fullmatch(value) or keyword.iskeyword(value):
        raise ValueError(
            f"{value!r} is not a valid {what}; use an ASCII identifier (letters, digits, '_', not starting "
            "with a digit, at most 64 characters) that is not a Python keyword"
        )
    return value


class DynamicDim(StrictModel):
    """Range of a dynamic dimension; dims sharing a ``name`` vary together."""

    min: Dim = Field(description="Smallest size the program must accept.")
    max: Dim = Field(description="Largest size the program must accept.")
    opt: Dim | None = Field(None, description="Typical size; defaults to the size in `shape`.")
    name: str | None = Field(None, description="Shared name: dims with the same name are one symbol.")

    @field_validator("name")
    @classmethod
    def _symbol(cls, value: str | None) -> str | None:
        return None if value is None else check_identifier(value, "dim name")

    @model_validator(mode="after")
    def _ordered(self) -> DynamicDim:
        if self.min >= self.max:
            # torch.export.Dim refuses min == max too: a size that cannot vary is not dynamic.
            raise ValueError(f"min ({self.min}) must be < max ({self.max}); for a fixed size, remove the dim from "
                             "dynamic")
        if self.opt is not None and not self.min <= self.opt <= self.max:
            raise ValueError(f"opt ({self.opt}) must lie within [min, max] = [{self.min}, {self.max}]")
        return self


class InputSpec(StrictModel):
    """One positional input of a method."""

    name: str = Field(description="Input name, used in reports and error messages.")
    shape: list[Dim] = Field(description="Example shape used for export (and the 'opt' shape).")
    dtype: Dtype = "float32"
    dynamic: dict[int, DynamicDim] = Field(default_factory=dict, description="Dynamic dims by index.")
    low: float | None = Field(None, description="Lower bound of random values (default -1, or 0 for ints).")
    high: float | None = Field(
        None, description="Upper bound of random values (default 1, or 10 for ints; exclusive for ints)."
    )
    distribution: Literal["uniform", "normal", "int_range"] | None = Field(
        None,
        description="How random values are drawn; defaults by dtype. 'normal' with low/high: mean at the "
        "midpoint, std (high - low) / 6, clipped to [low, high].",
    )

    @field_validator("name")
    @classmethod
    def _report_safe(cls, value: str) -> str:
        return check_identifier(value, "input name")

    @field_validator("dynamic", mode="before")
    @classmethod
    def _json_keys(cls, value: Any) -> Any:
        # JSON (a .json spec, a stored manifest) has only string keys: accept a dim index spelled in decimal.
        if isinstance(value, dict):
            return {int(k) if isinstance(k, str) and _DECIMAL_RE.fullmatch(k) else k: v for k, v in value.items()}
        return value

    @field_validator("dynamic")
    @classmethod
    def _dims_in_range(cls, dynamic: dict[int, DynamicDim], info: ValidationInfo) -> dict[int, DynamicDim]:
        shape = info.data.get("shape")
        if shape is None:
            return dynamic
        for index, dim in dynamic.items():
            if not 0 <= index < len(shape):
                raise ValueError(
                    f"dim {index} is outside the shape {shape}; use an index in [0, {len(shape) - 1}]"
                    if shape else f"dim {index}: the shape [] has no dims to make dynamic"
                )
            if not dim.min <= shape[index] <= dim.max:
                raise ValueError(
                    f"shape[{index}] = {shape[index]} must lie within the dynamic range [{dim.min}, {dim.max}]"
                )
            if shape[index] < 2:
                raise ValueError(
                    f"shape[{index}] = {shape[index]}: torch.export specializes sizes 0 and 1, "
                    "so the example size of a dynamic dim must be >= 2"
                )
        return dynamic

    @field_validator("low", "high")
    @classmethod
    def _within_dtype(cls, value: float | None, info: ValidationInfo) -> float | None:
        dtype = info.data.get("dtype")
        if value is None or dtype is None:
            return value
        if dtype in FLOAT_MAX and abs(value) > FLOAT_MAX[dtype]:
            raise ValueError(f"{value!r} is outside the finite range of {dtype} "
                             f"[{-FLOAT_MAX[dtype]:g}, {FLOAT_MAX[dtype]:g}]")
        if dtype in INT_RANGES:
            lowest, highest = INT_RANGES[dtype]
            # high is exclusive for integers: an int8 input may draw up to 127 with high 128.
            top = highest + 1 if info.field_name == "high" else highest
            if value != int(value) or not lowest <= int(value) <= top:
                found = int(value) if value == int(value) else value
                raise ValueError(f"{found!r} must be a whole number within [{lowest}, {top}] for {dtype}"
                                 + (" (high is exclusive)" if info.field_name == "high" else ""))
        low = info.data.get("low")
        if info.field_name == "high" and low is not None:
            if low >= value:
                raise ValueError(f"{value!r} must be > low ({low!r})")
            if dtype in FLOAT_MAX and value - low > FLOAT_MAX[dtype]:
                raise ValueError(f"high - low = {value - low:g} overflows {dtype} (largest {FLOAT_MAX[dtype]:g}), "
                                 "so drawn values would be infinite; narrow the range")
        return value

    @model_validator(mode="after")
    def _value_range(self) -> InputSpec:
        self._check_value_range()
        return self

    def _check_value_range(self) -> None:
        bounds = {"low": self.low, "high": self.high}
        if self.dtype == "bool":
            given = [k for k, v in {**bounds, "distribution": self.distribution}.items() if v is not None]
            if given:
                raise ValueError(f"{', '.join(given)} cannot be set for a bool input (values are 0 or 1); remove it")
            return
        integer = self.dtype not in FLOAT_DTYPES or self.distribution == "int_range"
        if integer:
            if self.distribution in ("uniform", "normal"):
                raise ValueError(
                    f"distribution {self.distribution!r} needs a float dtype, got {self.dtype}; use int_range"
                )
            for key, value in bounds.items():
                if value is not None and value != int(value):
                    raise ValueError(f"{key} ({value}) must be a whole number for integer values")
        # An unset bound takes its default (inputs.random_tensor), which can cross the one that is set.
        low = self.low if self.low is not None else (0 if integer else -1.0)
        high = self.high if self.high is not None else (10 if integer else 1.0)
        if low >= high and self.distribution != "normal":
            raise ValueError(f"low ({low}) must be < high ({high}) (unset, low is {0 if integer else -1} and high "
                             f"{10 if integer else 1}); set both")
        if self.distribution == "normal" and (self.low is None) != (self.high is None):
            raise ValueError(
                "distribution 'normal' needs both low and high (mean at the midpoint, clipped to the range) "
                "or neither (standard normal)"
            )

    def bounds(self) -> list[tuple[int, int]]:
        """Smallest and largest size of every dim (equal for a static dim)."""
        return [
            (self.dynamic[i].min, self.dynamic[i].max) if i in self.dynamic else (size, size)
            for i, size in enumerate(self.shape)
        ]

    def describe_shape(self) -> str:
        """The accepted shape in words, e.g. ``[1..8, 3]``."""
        return "[" + ", ".join(f"{lo}..{hi}" if lo != hi else str(lo) for lo, hi in self.bounds()) + "]"

    def accepts_shape(self, shape: list[int] | tuple[int, ...]) -> bool:
        """Whether ``shape`` has this input's rank and every size lies within its bounds."""
        return len(shape) == len(self.shape) and all(lo <= s <= hi for s, (lo, hi) in zip(shape, self.bounds(), strict=False))


class MethodSpec(StrictModel):
    """A method of the program: the module attribute it calls and its inputs."""

    inputs: list[InputSpec] = Field(min_length=1)
    attribute: str | None = Field(None, description="Module method to export; defaults to the method name.")

    @field_validator("inputs")
    @classmethod
    def _unique_names(cls, inputs: list[InputSpec]) -> list[InputSpec]:
        names = [spec.name for spec in inputs]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"input names must be unique within a method; {repeated} appear more than once")
        shared: dict[str, tuple[int, int, int]] = {}
        for spec in inputs:
            for index, dim in spec.dynamic.items():
                # One name is one torch.export symbol: one range (a second would be silently dropped) and
                # one example size (torch.export refuses two).
                seen = (dim.min, dim.max, spec.shape[index])
                first = shared.setdefault(dim.name or f"{spec.name}_dim{index}", seen)
                if first != seen:
                    raise ValueError(
                        f"dynamic dims named {dim.name!r} must share one range and one example size; found "
                        f"[{first[0]}, {first[1]}] at size {first[2]} and [{dim.min}, {dim.max}] at size "
                        f"{spec.shape[index]} (input {spec.name!r} dim {index}); make them equal or rename one")
        return inputs

    @field_validator("attribute")
    @classmethod
    def _attribute_name(cls, value: str | None) -> str | None:
        return None if value is None else check_identifier(value, "method name")


class Tolerance(StrictModel):
    """Tolerances for float outputs; unset fields fall back to the next more general level."""

    atol: float | None = Field(default=None, ge=0, description="Absolute tolerance.")
    rtol: float | None = Field(default=None, ge=0, description="Relative tolerance (times |eager|).")
    min_cosine: float | None = Field(default=None, ge=-1, le=1, description="Cosine similarity floor.")
    max_rel_error: float | None = Field(
        default=None, gt=0, description="Limit on |program - eager| / |eager| (L2 norms); quantized builds' default gate."
    )


def _function_reference(value: str | None) -> str | None:
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

    _dataset_reference = field_validator("dataset")(lambda value: _function_reference(value))


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


class CalibrationSpec(StrictModel):
    """Where a calibrated scheme (int8-static; int8 and fp8 on TensorRT) takes its activation ranges from."""

    dataset: str | None = Field(
        None, description="'package.module:function' or 'path/file.py:function' returning input tuples; "
        "default: the validation samples."
    )
    max_samples: int = Field(32, ge=1, description="How many dataset samples to calibrate on at most.")

    _dataset_reference = field_validator("dataset")(lambda value: _function_reference(value))


class QuantizationSpec(StrictModel):
    """Quantize the model before lowering: torchao (dynamic schemes), PT2E (int8-static), ModelOpt (int8, fp8 on TensorRT)."""

    scheme: str = Field(description="int8-dynamic | int8da4w | int8-weight-only | int8-static (CPU); int8 | fp8 (tensorrt).")
    group_size: int | None = Field(None, ge=2, description="Weights per scale of int8da4w (default 32).")
    calibration: CalibrationSpec | None = Field(None, description="int8-static, int8, fp8; default: the validation samples.")
    embeddings: Literal["int8", "int4"] | None = Field(
        None, description="`llm:` specs: the token embedding table in 8 or 4 bits (ExecuTorch's quantized embedding "
        "kernels); default float.")

    @field_validator("scheme")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        from prefect_executorch.spec.schemes import SCHEMES

        if value not in SCHEMES:
            raise ValueError(f"unknown scheme {value!r}; choose one of {', '.join(SCHEMES)}")
        return value

    @model_validator(mode="after")
    def _options_fit_scheme(self) -> QuantizationSpec:
        if self.group_size is not None and self.scheme != "int8da4w":
            raise ValueError(f"group_size applies to int8da4w only, not {self.scheme!r}; remove it")
        from prefect_executorch.spec.schemes import CALIBRATED_SCHEMES

        if self.calibration is not None and self.scheme not in CALIBRATED_SCHEMES:
            raise ValueError(f"calibration applies to {', '.join(CALIBRATED_SCHEMES)} only ({self.scheme!r} needs none); "
                             "remove it")
        return self

    @model_serializer(mode="wrap")
    def _without_float_embeddings(self, handler: Any) -> Any:
        # Quantized specs keep the hash and cache key they had before `embeddings` existed.
        data = handler(self)
        if isinstance(data, dict) and data.get("embeddings") is None:
            data.pop("embeddings", None)
        return data

    @property
    def effective_group_size(self) -> int:
        """``group_size``, or the default 32."""
        from prefect_executorch.spec.schemes import DEFAULT_GROUP_SIZE

        return self.group_size or DEFAULT_GROUP_SIZE


class ModelCard(StrictModel):
    """A model card: copied into the bundle's manifest and rendered in its validation report."""

    description: str = Field(description="What the model does, in a sentence or two.")
    license: str | None = Field(default=None, description="The weights' license, e.g. 'Apache-2.0'.")
    intended_use: str | None = Field(default=None, description="What the model is meant (and not meant) for.")
    limitations: str | None = Field(default=None, description="Known failure modes and gaps.")


def _target_names_too(schema: dict[str, Any]) -> None:
    """The target's JSON schema also takes a bare target name (``"xnnpack"``), as a spec file may write it.

    Prefect checks a deployment's parameters against this schema before the flow runs: without it,
    ``{"target": "xnnpack"}`` was refused there although the spec itself accepts it.
    """
    options = dict(schema)
    schema.clear()
    schema["anyOf"] = [options, {"type": "string", "enum": sorted(OPTIONS)}]


class BuildSpec(StrictModel):
    """Everything one build needs; loadable from YAML or JSON."""

    name: str = Field(description="Model name (a path segment of the bundle key).")
    version: str = Field(description="Model version (a path segment of the bundle key).")
    # Before `model`: the model's validator reads it (an LLM's model is a directory, not a factory).
    llm: TextGenerationSpec | None = Field(
        None, description="A decoder language model: `model` is its Hugging Face model directory (docs/llm.md)."
    )
    model: str = Field(description="'package.module:factory' or 'path/to/file.py:factory'; with `llm`, a Hugging "
                       "Face model directory.")
    weights: str | None = Field(None, description="State dict loaded with torch.load(weights_only=True).")
    methods: dict[str, MethodSpec] = Field(
        default_factory=dict, description="Methods of the program by name (none with `llm`: the runner's own)."
    )
    target: TargetSpec = Field(default_factory=XnnpackOptions, json_schema_extra=_target_names_too)
    validation: ValidationSpec = Field(default_factory=ValidationSpec)
    external_weights: bool = Field(False, description="Store weights in a .ptd beside the .pte.")
    quantization: QuantizationSpec | None = Field(None, description="Quantize before lowering (docs/quantization.md).")
    card: ModelCard | None = Field(None, description="Optional model card, copied into the manifest.")
    export_timeout_s: float = Field(1800, gt=0, description="Wall-time limit of the export child process.")
    export_memory_limit_mib: int | None = Field(
        None, ge=1024, description="Memory bound of the export child (MiB): address space on CPU targets, resident "
        "memory on GPU targets; none by default."
    )

    @field_validator("name", "version")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not is_safe_name(value):
            raise ValueError(f"{value!r} {NAME_RULE}")
        return value

    @field_validator("target", mode="before")
    @classmethod
    def _target_shorthand(cls, value: Any) -> Any:
        return {"kind": value} if isinstance(value, str) else value

    @field_validator("methods")
    @classmethod
    def _method_names(cls, methods: dict[str, MethodSpec]) -> dict[str, MethodSpec]:
        for name in methods:
            check_identifier(name, "method name")
        return methods

    @model_validator(mode="after")
    def _validation_methods(self) -> BuildSpec:
        for name, settings in self.validation.methods.items():
            if name not in self.methods:
                raise ValueError(f"validation.methods.{name}: no such method; the spec's methods are {sorted(self.methods)}")
            inputs = self.methods[name].inputs
            for index, shapes in enumerate(settings.extra_shapes):
                where = f"validation.methods.{name}.extra_shapes[{index}]"
                if len(shapes) != len(inputs):
                    raise ValueError(f"{where}: {len(shapes)} shapes for {len(inputs)} inputs; give one shape per input")
                for shape, spec in zip(shapes, inputs, strict=False):
                    if not spec.accepts_shape(shape):
                        raise ValueError(
                            f"{where}: input {spec.name!r} shape {shape} is outside {spec.describe_shape()}; "
                            f"widen methods.{name}.inputs or drop the shape"
                        )
        return self

    @field_validator("model")
    @classmethod
    def _model_reference(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("llm") is None:
            ModelRef.check(value, noun="factory")
        elif not value.strip() or ModelRef.split(value).function.isidentifier():
            raise ValueError(f"{value!r}: with `llm`, model is the path of a Hugging Face model directory "
                             "(config.json, safetensors weights, tokenizer.json)")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> BuildSpec:
        if self.llm is None:
            if self.quantization is not None and self.quantization.embeddings is not None:
                raise ValueError("quantization.embeddings: applies to an `llm:` spec's token embeddings only; remove it")
            if not self.methods:
                raise ValueError("methods: give at least one method (or an `llm:` section for a decoder language "
                                 "model)")
            return self
        given = [field for field in ("methods", "weights") if getattr(self, field)]
        given += ["external_weights"] if self.external_weights else []
        given += ["validation.methods"] if self.validation.methods else []
        if given:
            raise ValueError(f"{', '.join(given)}: not for an `llm:` spec (its methods are the runner's, its weights "
                             "the model directory's); remove them")
        if self.quantization is not None and self.quantization.scheme not in LLM_SCHEMES:
            raise ValueError(f"quantization.scheme: an `llm:` spec is quantized with {' or '.join(LLM_SCHEMES)} (linear "
                             f"layers, as ExecuTorch's LLM recipes), not {self.quantization.scheme!r}")
        if self.target_name not in LLM_TARGETS:
            raise ValueError(f"target: an `llm:` spec builds for {', '.join(LLM_TARGETS)}, not {self.target_name!r}"
                             " (docs/llm.md)")
        if self.target_name == "cuda" and self.quantization is not None:
            raise ValueError("quantization: an `llm:` spec on target cuda is built in target.precision (bf16 is the "
                             "CUDA backend's LLM precision); quantized decoder LMs build for xnnpack; remove one")
        return self

    @property
    def target_name(self) -> str:
        """The target's registry name (``xnnpack``, ``portable``...)."""
        return self.target.kind

    def canonical_json(self) -> str:
        """Key-sorted JSON of the spec, the basis of its hash."""
        data = self.model_dump(mode="json")
        # Specs keep the hash (and cache key) they had before these fields existed.
        for field in ("quantization", "llm"):
            if data[field] is None:
                del data[field]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def sha256(self) -> str:
        """sha256 of the canonical JSON."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def check_model_reference(self) -> None:
        """Check, without running user code, that the factory (an LLM's model directory) can be found."""
        if self.llm is not None:
            check_model_dir(self.model, self.llm.tokenizer_path(self.model))
            return
        check_factory(self.model)
        if self.weights is not None and not Path(self.weights).is_file():
            raise SpecError(f"weights: file {self.weights!r} does not exist")


def check_input_budget(spec: BuildSpec, limit_bytes: int | None, limit_field: str) -> None:
    """Raise ``SpecError`` if an input at its largest shape exceeds a child's memory limit (None: no limit)."""
    if limit_bytes is None:
        return
    for method_name, method in spec.methods.items():
        for index, spec_input in enumerate(method.inputs):
            largest = [hi for _, hi in spec_input.bounds()]
            size = math.prod(largest) * DTYPE_SIZES[spec_input.dtype]
            if size > limit_bytes:
                raise SpecError(
                    f"methods.{method_name}.inputs.{index}: input {spec_input.name!r} at its largest shape {largest} "
                    f"({spec_input.dtype}, every dynamic dim at its max) takes {size / 2**20:,.0f} MiB, more than the "
                    f"{limit_bytes / 2**20:,.0f} MiB of {limit_field}; lower the shape or its dynamic max, or raise "
                    f"{limit_field}"
                )


def _spec_fields(model: Any = None, seen: set[type] | None = None) -> set[str]:
    """Every field name a spec can have, at any depth: what a misspelt field is matched against."""
    model, seen = model or BuildSpec, seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    names = set(model.model_fields)
    for field in model.model_fields.values():
        for part in _types_within(field.annotation):
            names |= _spec_fields(part, seen)
    return names


def _types_within(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (through unions, lists, dicts and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _types_within(arg)]


def _nearest(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or nothing."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        location = ".".join(str(part) for part in err["loc"]) or "spec"
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = f"unknown field{_nearest(str(err['loc'][-1]), _spec_fields())}; remove it or check its spelling"
        elif err["type"] == "union_tag_invalid":
            # The spec's own words: `target: xnnpak` names no `kind`, though that is the field the union reads.
            tag, expected = str(err["ctx"]["tag"]), [t.strip(" '") for t in str(err["ctx"]["expected_tags"]).split(",")]
            what = "target" if err["loc"][-1:] == ("target",) else "kind"
            message = f"unknown {what} {tag!r}{_nearest(tag, expected)}; expected one of: {', '.join(expected)}"
        elif err["type"] != "value_error" and isinstance(err.get("input"), (bool, int, float, str)):
            # A strict refusal ("Input should be a valid integer") is only clear next to what was given.
            found = repr(err["input"])
            message = f"{message} (got {found if len(found) <= 80 else found[:77] + '...'})"
        lines.append(f"{location}: {message}")
    return "invalid build spec:\n  " + "\n  ".join(lines)


def _resolve_sample_paths(validation: Any, base_dir: Path) -> Any:
    """Resolve the validation samples' files (``samples_file``, ``.py`` datasets) against ``base_dir``."""
    if not isinstance(validation, dict) or not isinstance(validation.get("methods"), dict):
        return validation
    methods = {}
    for name, settings in validation["methods"].items():
        if isinstance(settings, dict):
            settings = dict(settings)
            if isinstance(settings.get("samples_file"), str):
                settings["samples_file"] = str((base_dir / settings["samples_file"]).resolve())
            dataset = settings.get("dataset")
            if isinstance(dataset, str) and ModelRef.split(dataset).is_file:
                settings["dataset"] = _resolve_file_reference(dataset, base_dir)
        methods[name] = settings
    return {**validation, "methods": methods}


def _resolve_calibration_path(quantization: Any, base_dir: Path) -> Any:
    """Resolve a ``.py`` calibration dataset against ``base_dir``."""
    calibration = quantization.get("calibration") if isinstance(quantization, dict) else None
    dataset = calibration.get("dataset") if isinstance(calibration, dict) else None
    if not isinstance(calibration, dict) or not isinstance(dataset, str) or not ModelRef.split(dataset).is_file:
        return quantization
    return {**quantization, "calibration": {**calibration, "dataset": _resolve_file_reference(dataset, base_dir)}}


def _resolve_file_reference(reference: str, base_dir: Path) -> str:
    """'path/file.py:function' with the path made absolute against ``base_dir``."""
    path, function = ModelRef.split(reference)
    return f"{(base_dir / path).resolve()}:{function}"


def parse_spec(data: Any, base_dir: Path | None = None) -> BuildSpec:
    """Validate a mapping as a ``BuildSpec``; relative model/weights paths resolve against ``base_dir``."""
    if not isinstance(data, dict):
        raise SpecError(f"spec: expected a mapping of fields, got {type(data).__name__}")
    if base_dir is not None:
        data = dict(data)
        model = data.get("model")
        if isinstance(model, str) and isinstance(data.get("llm"), dict):
            data["model"] = str((base_dir / model).resolve())
            tokenizer = data["llm"].get("tokenizer")
            if isinstance(tokenizer, str):
                data["llm"] = {**data["llm"], "tokenizer": str((base_dir / tokenizer).resolve())}
        elif isinstance(model, str) and ModelRef.split(model).is_file:
            data["model"] = _resolve_file_reference(model, base_dir)
        weights = data.get("weights")
        if isinstance(weights, str):
            data["weights"] = str((base_dir / weights).resolve())
        if "validation" in data:
            data["validation"] = _resolve_sample_paths(data["validation"], base_dir)
        data["quantization"] = _resolve_calibration_path(data.get("quantization"), base_dir)
    try:
        return BuildSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_format_validation_error(exc)) from None


def load_spec(path: str | Path) -> BuildSpec:
    """Load a spec from a YAML or JSON file (JSON is YAML)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"spec: cannot read {str(path)!r}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        # PyYAML raises ValueError for an impossible date (2026-13-45) and RecursionError for deep nesting.
        raise SpecError(f"spec: {str(path)!r} is not valid YAML/JSON: {exc or type(exc).__name__}") from None
    return parse_spec(data, base_dir=path.parent)
