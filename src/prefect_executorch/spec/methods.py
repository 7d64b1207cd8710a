"""The methods a program exports: their inputs, shapes and dynamic dims."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from prefect_executorch.spec.base import StrictModel
from prefect_executorch.spec.fields import (
    _DECIMAL_RE,
    FLOAT_DTYPES,
    FLOAT_MAX,
    INT_RANGES,
    Dim,
    Dtype,
    check_identifier,
)


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

