"""Quantizing a model before lowering: the scheme and its calibration."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_serializer,
    model_validator,
)

from prefect_executorch.spec.base import StrictModel
from prefect_executorch.spec.validation import check_function_reference


class CalibrationSpec(StrictModel):
    """Where a calibrated scheme (int8-static; int8 and fp8 on TensorRT) takes its activation ranges from."""

    dataset: str | None = Field(
        None, description="'package.module:function' or 'path/file.py:function' returning input tuples; "
        "default: the validation samples."
    )
    max_samples: int = Field(32, ge=1, description="How many dataset samples to calibrate on at most.")

    _dataset_reference = field_validator("dataset")(lambda value: check_function_reference(value))


class QuantizationSpec(StrictModel):
    """Quantize the model before lowering: torchao (dynamic schemes), PT2E (int8-static), ModelOpt (int8, fp8 on TensorRT)."""

    scheme: str = Field(description="int8-dynamic | int8da4w | int8-weight-only | int8-static (CPU); int8 | fp8 (tensorrt).")
    group_size: int | None = Field(None, ge=2, description="Weights per scale of int8da4w (default 32).")
    calibration: CalibrationSpec | None = Field(None, description="int8-static, int8, fp8; default: the validation samples.")
    embeddings: Literal["int8", "int4"] | None = Field(
        None, description="`llm:` and `asr:` specs: the token embedding table in 8 or 4 bits (ExecuTorch's quantized "
        "embedding kernels); default float.")

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


