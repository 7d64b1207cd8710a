"""The build spec: what to export, for which target, and how to validate it."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from prefect_executorch.errors import SpecError
from prefect_executorch.spec.asr import SpeechRecognitionSpec, check_speech_model_dir
from prefect_executorch.spec.base import StrictModel, is_safe_name
from prefect_executorch.spec.fields import DTYPE_SIZES, NAME_RULE, check_identifier
from prefect_executorch.spec.llm import TextGenerationSpec, check_model_dir
from prefect_executorch.spec.messages import format_validation_error
from prefect_executorch.spec.methods import MethodSpec
from prefect_executorch.spec.modelref import ModelRef, check_factory
from prefect_executorch.spec.options import OPTIONS, TargetSpec, XnnpackOptions
from prefect_executorch.spec.quantization import QuantizationSpec
from prefect_executorch.spec.validation import ValidationSpec
from prefect_executorch.spec.yamlfile import DuplicateKey, load_yaml

#: The targets an `llm:` spec builds for (the runner's program with a static KV cache).
LLM_TARGETS = ("xnnpack", "portable", "cuda")
#: The targets an `asr:` spec builds for: its encoder and decoder lowered to XNNPACK or portable kernels, or compiled
#: by ExecuTorch's CUDA backend.
ASR_TARGETS = ("xnnpack", "portable", "cuda")
#: The quantization schemes of an `llm:` or `asr:` spec.
LLM_SCHEMES = ("int8da4w",)

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
    asr: SpeechRecognitionSpec | None = Field(
        None, description="A speech recognition encoder-decoder (Whisper, Moonshine): `model` is its Hugging Face model "
        "directory (docs/asr.md).")
    model: str = Field(description="'package.module:factory' or 'path/to/file.py:factory'; with `llm` or `asr`, a "
                       "Hugging Face model directory.")
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
        section = next((name for name in ("llm", "asr") if info.data.get(name) is not None), None)
        if section is None:
            ModelRef.check(value, noun="factory")
        elif not value.strip() or ModelRef.split(value).function.isidentifier():
            raise ValueError(f"{value!r}: with `{section}`, model is the path of a Hugging Face model directory "
                             "(config.json, safetensors weights, tokenizer.json)")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> BuildSpec:
        if self.llm is not None and self.asr is not None:
            raise ValueError("llm, asr: a spec builds one model kind; keep one section")
        section = "llm" if self.llm is not None else "asr" if self.asr is not None else None
        if self.quantization is not None and self.quantization.embeddings is not None and section is None:
            raise ValueError("quantization.embeddings: applies to the token embeddings of an `llm:` or `asr:` spec's "
                             "model only; remove it")
        if section is None:
            if not self.methods:
                raise ValueError("methods: give at least one method (or an `llm:` or `asr:` section for a Hugging "
                                 "Face language or speech model)")
            return self
        given = [field for field in ("methods", "weights") if getattr(self, field)]
        given += ["external_weights"] if self.external_weights else []
        given += ["validation.methods"] if self.validation.methods else []
        if given:
            raise ValueError(f"{', '.join(given)}: not for an `{section}:` spec (its methods are made by the export, its "
                             "weights the model directory's); remove them")
        if self.quantization is not None and self.quantization.scheme not in LLM_SCHEMES:
            raise ValueError(f"quantization.scheme: an `{section}:` spec is quantized with {' or '.join(LLM_SCHEMES)} "
                             f"(linear layers, as ExecuTorch's LLM recipes), not {self.quantization.scheme!r}")
        targets = LLM_TARGETS if section == "llm" else ASR_TARGETS
        if self.target_name not in targets:
            raise ValueError(f"target: an `{section}:` spec builds for {', '.join(targets)}, not {self.target_name!r}"
                             f" (docs/{section}.md)")
        if self.target_name == "cuda" and self.quantization is not None:
            raise ValueError(f"quantization: an `{section}:` spec on target cuda is built in target.precision (bf16 is "
                             "the CUDA backend's precision for it); quantized builds are for xnnpack; remove one")
        return self

    @property
    def target_name(self) -> str:
        """The target's registry name (``xnnpack``, ``portable``...)."""
        return self.target.kind

    def canonical_json(self) -> str:
        """Key-sorted JSON of the spec, the basis of its hash."""
        data = self.model_dump(mode="json")
        # Specs keep the hash (and cache key) they had before these fields existed.
        for field in ("quantization", "llm", "asr"):
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
        if self.asr is not None:
            check_speech_model_dir(self.model)
            for index, clip in enumerate(self.asr.clips):
                if not Path(clip).is_file():
                    raise SpecError(f"asr.clips[{index}]: file {clip!r} does not exist")
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
        elif isinstance(model, str) and isinstance(data.get("asr"), dict):
            data["model"] = str((base_dir / model).resolve())
            clips = data["asr"].get("clips")
            if isinstance(clips, list):
                data["asr"] = {**data["asr"], "clips": [str((base_dir / clip).resolve()) if isinstance(clip, str)
                                                        else clip for clip in clips]}
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
        raise SpecError(format_validation_error(exc, BuildSpec)) from None


def load_spec(path: str | Path) -> BuildSpec:
    """Load a spec from a YAML or JSON file (JSON is YAML)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"spec: cannot read {str(path)!r}: {exc.strerror}") from None
    try:
        data = load_yaml(text)
    except DuplicateKey as exc:
        raise SpecError(f"spec: {str(path)!r} {exc}") from None
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        # PyYAML raises ValueError for an impossible date (2026-13-45) and RecursionError for deep nesting.
        raise SpecError(f"spec: {str(path)!r} is not valid YAML/JSON: {exc or type(exc).__name__}") from None
    return parse_spec(data, base_dir=path.parent)
