"""Quantized builds: torchao ``quantize_`` (dynamic int8, 8da4w) and PT2E with the XNNPACK quantizer (static int8).

The TensorRT schemes (int8, fp8: ModelOpt's QDQ nodes, built into engines) live in
``targets/tensorrt_quant.py``; this module names them, holds their gates and dispatches to it.

The same function quantizes the model in the export child and in the validation child, so the
validator can compare the program with the quantized eager model as well as with the float one.
Nothing here imports torch or torchao at module level: the spec and the compare code read the
schemes' facts and default gates without paying those imports.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic import BaseModel, Field

from prefect_executorch.errors import SpecError, ToolchainMismatch

if TYPE_CHECKING:
    import torch

    from prefect_executorch.spec import BuildSpec, QuantizationSpec

#: The CPU (torchao / PT2E) schemes and the TensorRT (ModelOpt) ones.
CPU_SCHEMES = ("int8-dynamic", "int8da4w", "int8-weight-only", "int8-static")
TENSORRT_SCHEMES = ("int8", "fp8")
#: The schemes a spec may name, in the order error messages list them.
SCHEMES = CPU_SCHEMES + TENSORRT_SCHEMES
#: Schemes that calibrate activation ranges (on the validation samples or ``calibration.dataset``).
CALIBRATED_SCHEMES = ("int8-static", *TENSORRT_SCHEMES)
DEFAULT_GROUP_SIZE = 32


class QuantizedGate(NamedTuple):
    """Default limits of a quantized build's outputs against the float eager model."""

    min_cosine: float
    max_rel_error: float


#: Defaults suited to each scheme: element-wise tolerances mean little once weights are rounded to
#: 8 or 4 bits, so the gate is a cosine floor and ||program - float|| / ||float||. The figures leave
#: about 2x room over what the benchmark's weight-heavy MLP measures (int8 ~0.01, 8da4w ~0.1).
DEFAULT_GATES: dict[str, QuantizedGate] = {
    "int8-dynamic": QuantizedGate(min_cosine=0.995, max_rel_error=0.05),
    "int8-weight-only": QuantizedGate(min_cosine=0.995, max_rel_error=0.05),
    "int8-static": QuantizedGate(min_cosine=0.99, max_rel_error=0.1),
    "int8da4w": QuantizedGate(min_cosine=0.98, max_rel_error=0.2),
    # ModelOpt's defaults: per-channel int8 weights with per-tensor int8 activations, and per-tensor
    # fp8 (e4m3, 3 mantissa bits) weights and activations; set like int8-static until a GPU run measures them.
    "int8": QuantizedGate(min_cosine=0.99, max_rel_error=0.1),
    "fp8": QuantizedGate(min_cosine=0.99, max_rel_error=0.1),
}

_NO_WEIGHT_ONLY = (
    "ExecuTorch 1.4.1's XNNPACK partitioner has no float-activation/int8-weight linear and "
    "torchao::dequantize_affine has no ExecuTorch kernel, so the program would not lower; "
    "use int8-dynamic (int8 weights too, activations quantized per call)"
)
_PORTABLE = (
    "the portable kernels cannot run the quantize/dequantize operators these schemes insert: torchao's "
    "*_affine operators have no ExecuTorch kernel, and PT2E's quantized_decomposed ones live in ExecuTorch's "
    "separate quantized kernel library, which a portable runtime does not load (the method fails with "
    "OperatorMissing); use target xnnpack, which runs them inside its delegate"
)
_TENSORRT = (
    "torchao and PT2E schemes produce CPU (XNNPACK) programs; on target tensorrt use scheme int8 or fp8 "
    "(ModelOpt post-training quantization built into the engines), or use target xnnpack"
)
_CPU_TARGETS = (
    "int8 and fp8 are TensorRT schemes: ModelOpt's tensorrt::quantize_op has a TensorRT converter and no "
    "ExecuTorch CPU kernel; on a CPU target use int8-dynamic, int8da4w or int8-static"
)
_CUDA = (
    "the cuda target builds float programs (target.precision: fp32, fp16 or bf16); torchao/PT2E schemes produce "
    "XNNPACK programs and int8/fp8 are TensorRT's: use target.precision: bf16, target xnnpack, or target tensorrt"
)
#: Why a target refuses a scheme; a (target, scheme) pair not listed is supported.
REFUSED: dict[str, dict[str, str]] = {
    "xnnpack": {"int8-weight-only": _NO_WEIGHT_ONLY, **{scheme: _CPU_TARGETS for scheme in TENSORRT_SCHEMES}},
    "portable": {**{scheme: _PORTABLE for scheme in CPU_SCHEMES}, **{scheme: _CPU_TARGETS for scheme in TENSORRT_SCHEMES}},
    "tensorrt": {scheme: _TENSORRT for scheme in CPU_SCHEMES},
    "cuda": {scheme: _CUDA for scheme in (*CPU_SCHEMES, *TENSORRT_SCHEMES)},
}


class QuantizationFacts(BaseModel):
    """What a quantized build was made with; the manifest and the validation report record it."""

    scheme: str
    group_size: int | None = Field(None, description="Weights per scale (int8da4w only).")
    calibration: str | None = Field(None, description="Where int8-static, int8 or fp8 took its activation ranges from.")
    calibration_samples: int = Field(0, description="Input tuples the calibration ran (int8-static, int8, fp8).")
    torchao: str | None = Field(None, description="torchao version that quantized the model.")
    modelopt: str | None = Field(None, description="nvidia-modelopt version that quantized the model (int8, fp8).")
    quantized_linears: int | None = Field(
        None, description="Linear layers torchao quantized (None for calibrated schemes: PT2E annotates operators, "
        "ModelOpt inserts quantizers into every supported layer)."
    )
    float_linears: list[str] = Field(
        default_factory=list, description="Linear layers left in float: in_features not a multiple of group_size."
    )


def check_scheme(spec: BuildSpec, target: str) -> None:
    """Raise ``SpecError`` before any export if ``target`` cannot take the spec's quantization scheme."""
    if spec.quantization is None:
        return
    reason = REFUSED.get(target, {}).get(spec.quantization.scheme)
    if reason is not None:
        raise SpecError(f"quantization.scheme: target {target!r} cannot build {spec.quantization.scheme!r}: {reason}")


def compat_tag(quantization: QuantizationSpec | None) -> str | None:
    """The compat-key suffix of a quantized build (``int8da4wg32``), None for a float build."""
    if quantization is None:
        return None
    tag = quantization.scheme.replace("-", "")
    return f"{tag}g{quantization.effective_group_size}" if quantization.scheme == "int8da4w" else tag


def torchao_version() -> str | None:
    """The installed torchao's version (ExecuTorch installs it), or None."""
    try:
        return version("torchao")
    except PackageNotFoundError:
        return None


def modelopt_version() -> str | None:
    """The installed nvidia-modelopt's version (the TensorRT schemes need it), or None."""
    try:
        return version("nvidia-modelopt")
    except PackageNotFoundError:
        return None


def quantizer_versions(quantization: QuantizationSpec | None) -> dict[str, str | None]:
    """The version of the library that rounds a quantized build's weights (it decides the bundle too); {} if float."""
    if quantization is None:
        return {}
    if quantization.scheme in TENSORRT_SCHEMES:
        return {"modelopt": modelopt_version()}
    return {"torchao": torchao_version()}


def _require_torchao() -> None:
    if torchao_version() is None:
        raise ToolchainMismatch("quantization needs torchao, which ExecuTorch installs; reinstall executorch")


def _quantizable(quantization: QuantizationSpec) -> Callable[[torch.nn.Module, str], bool]:
    """torchao's filter: the linears a scheme quantizes.

    Grouped weights need in_features divisible by the group; other linears stay float, as in
    ExecuTorch's own 8da4w transform, and the facts name them.
    """
    import torch

    group = quantization.effective_group_size if quantization.scheme == "int8da4w" else None

    def fits(module: torch.nn.Module, fqn: str) -> bool:
        return isinstance(module, torch.nn.Linear) and (group is None or module.in_features % group == 0)

    return fits


def _torchao_config(quantization: QuantizationSpec) -> Any:
    """The torchao config of a ``quantize_`` scheme, as ExecuTorch's XNNPACK recipes and optimum-executorch build it."""
    import torch
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig

    if quantization.scheme == "int8da4w":
        return Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4,  # type: ignore[attr-defined]  # torch's stubs lack int4
            weight_granularity=PerGroup(quantization.effective_group_size),
        )
    if quantization.scheme == "int8-dynamic":
        return Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0))
    return IntxWeightOnlyConfig(weight_dtype=torch.int8, granularity=PerAxis(0))


def is_tensorrt_scheme(spec: BuildSpec) -> bool:
    """Whether the spec asks for a ModelOpt (TensorRT) scheme."""
    return spec.quantization is not None and spec.quantization.scheme in TENSORRT_SCHEMES


def quantize_model(model: torch.nn.Module, spec: BuildSpec) -> torch.nn.Module:
    """A copy of ``model`` with its linear layers quantized by torchao; ``model`` itself for the calibrated
    schemes, which quantize per method (int8-static) or in the TensorRT target (int8, fp8)."""
    quantization = spec.quantization
    if quantization is None or quantization.scheme in CALIBRATED_SCHEMES:
        return model
    _require_torchao()
    from torchao.quantization import quantize_
    from torchao.utils import unwrap_tensor_subclass

    model = copy.deepcopy(model)
    quantize_(model, _torchao_config(quantization), filter_fn=_quantizable(quantization))
    # Plain tensors for torch.export, as ExecuTorch's source-transform stage leaves them.
    unwrap_tensor_subclass(model)
    return model


def linear_facts(model: torch.nn.Module, quantization: QuantizationSpec) -> tuple[int | None, list[str]]:
    """How many linears a torchao scheme quantizes and which ones it leaves in float."""
    import torch

    if quantization.scheme in CALIBRATED_SCHEMES:
        return None, []
    fits = _quantizable(quantization)
    linears = [(fqn, m) for fqn, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    left = [fqn for fqn, m in linears if not fits(m, fqn)]
    return len(linears) - len(left), left


def calibration_inputs(spec: BuildSpec, name: str) -> tuple[str, list[tuple[Any, ...]]]:
    """The input tuples a calibrated scheme calibrates ``name`` on, and their source in words."""
    from prefect_executorch.inputs import load_dataset
    from prefect_executorch.validator import case_inputs

    assert spec.quantization is not None
    method = spec.methods[name]
    calibration = spec.quantization.calibration
    if calibration is not None and calibration.dataset is not None:
        samples = load_dataset(calibration.dataset, method, "quantization.calibration.dataset", calibration.max_samples)
        return f"dataset {calibration.dataset}", samples
    return "validation samples", [inputs for _, _, inputs in case_inputs(spec, name, method)]


def quantize_method(
    module: torch.nn.Module, name: str, args: tuple[Any, ...], dynamic_shapes: Any, spec: BuildSpec
) -> tuple[torch.nn.Module, str | None, int]:
    """int8-static: PT2E with the XNNPACK quantizer, calibrated; other schemes return ``module`` unchanged.

    Returns the module to export, the calibration source and the number of calibration samples.
    """
    if spec.quantization is None or spec.quantization.scheme != "int8-static":
        return module, None, 0
    import torch
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    _require_torchao()
    source, samples = calibration_inputs(spec, name)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False))
    captured = torch.export.export(module, args, dynamic_shapes=dynamic_shapes).module()
    prepared = prepare_pt2e(captured, quantizer)
    for sample in samples:
        prepared(*sample)
    return convert_pt2e(prepared), source, len(samples)


def build_facts(spec: BuildSpec, model: torch.nn.Module, calibration: str | None, samples: int) -> QuantizationFacts:
    """The facts of the spec's quantization, for the manifest and the report."""
    assert spec.quantization is not None
    quantized, left = linear_facts(model, spec.quantization)
    return QuantizationFacts(
        scheme=spec.quantization.scheme,
        group_size=spec.quantization.effective_group_size if spec.quantization.scheme == "int8da4w" else None,
        calibration=None if calibration is None else f"{calibration} ({samples} samples)",
        calibration_samples=samples,
        **quantizer_versions(spec.quantization),
        quantized_linears=quantized,
        float_linears=left,
    )


def quantized_methods(
    model: torch.nn.Module, spec: BuildSpec
) -> tuple[dict[str, torch.nn.Module], QuantizationFacts | None]:
    """Each method of ``model`` as the (quantized) module to export or run, and the build's facts (None if float)."""
    from prefect_executorch.inputs import dynamic_shapes, example_inputs
    from prefect_executorch.modelref import method_module

    source: str | None
    if is_tensorrt_scheme(spec):
        from prefect_executorch.targets.tensorrt_quant import quantize_with_modelopt

        quantized, source, samples = quantize_with_modelopt(model, spec)
    else:
        quantized, source, samples = quantize_model(model, spec), None, 0
    modules: dict[str, torch.nn.Module] = {}
    for name, method in spec.methods.items():
        module = method_module(quantized, name, method.attribute)
        args = example_inputs(method, seed=spec.validation.seed)
        modules[name], method_source, method_samples = quantize_method(module, name, args, dynamic_shapes(method), spec)
        source, samples = method_source or source, method_samples or samples
    return modules, build_facts(spec, model, source, samples) if spec.quantization else None
