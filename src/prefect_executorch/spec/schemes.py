"""The quantization schemes a spec can name: their default gates and which targets refuse which.

Data and checks only (no torch, no torchao): the spec, the targets and the comparison read them; the
quantizing itself is ``export/quantize.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from prefect_executorch.errors import SpecError

if TYPE_CHECKING:
    from prefect_executorch.spec.buildspec import BuildSpec
    from prefect_executorch.spec.quantization import QuantizationSpec

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
    "the cuda target builds float programs (target.precision: fp32, tf32, fp16 or bf16); torchao/PT2E schemes produce "
    "XNNPACK programs and int8/fp8 are TensorRT's: use target.precision: bf16, target xnnpack, or target tensorrt"
)
#: Why a target refuses a scheme; a (target, scheme) pair not listed is supported.
REFUSED: dict[str, dict[str, str]] = {
    "xnnpack": {"int8-weight-only": _NO_WEIGHT_ONLY, **{scheme: _CPU_TARGETS for scheme in TENSORRT_SCHEMES}},
    "portable": {**{scheme: _PORTABLE for scheme in CPU_SCHEMES}, **{scheme: _CPU_TARGETS for scheme in TENSORRT_SCHEMES}},
    "tensorrt": {scheme: _TENSORRT for scheme in CPU_SCHEMES},
    "cuda": {scheme: _CUDA for scheme in (*CPU_SCHEMES, *TENSORRT_SCHEMES)},
}


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


def is_tensorrt_scheme(spec: BuildSpec) -> bool:
    """Whether the spec asks for a ModelOpt (TensorRT) scheme."""
    return spec.quantization is not None and spec.quantization.scheme in TENSORRT_SCHEMES
