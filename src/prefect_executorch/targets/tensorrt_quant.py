"""TensorRT int8 / fp8: ModelOpt post-training quantization, then the ordinary TensorRT export.

Torch-TensorRT 2.14 and its nightly take no precision keyword for these (``enabled_precisions``
is gone; networks are strongly typed). A model quantized by NVIDIA ModelOpt carries
``tensorrt::quantize_op`` nodes (quantize-dequantize with a calibrated amax), which
``torch.export`` keeps inside ``export_torch_mode()``, and torch-tensorrt's converter turns each
into TensorRT Q/DQ layers of INT8 (``exponent_bits=0``) or FP8 e4m3 (``exponent_bits=4``). That
converter only registers if ``modelopt.torch.quantization`` imports before torch-tensorrt does.

As in ``targets/tensorrt.py``, the library calls are data (``quantize_steps``, ``EXPORT_MODE``),
checked against the real sources by the tests and against the installed ones on the worker.
"""

from __future__ import annotations

import contextlib
import copy
from typing import TYPE_CHECKING, Any

from prefect_executorch.errors import ToolchainMismatch
from prefect_executorch.machine.compat import probed_sm
from prefect_executorch.spec.inputs import calibration_inputs
from prefect_executorch.spec.schemes import is_tensorrt_scheme
from prefect_executorch.targets.calls import Call, Ref, Slot, Step, check_calls, materialize, run_steps

if TYPE_CHECKING:
    import torch

    from prefect_executorch.machine.toolchain import Toolchain
    from prefect_executorch.spec.buildspec import BuildSpec

MODELOPT_PACKAGE = "nvidia-modelopt"
#: The release whose sources the tests check the calls against.
MODELOPT_INSTALL = f'pip install "{MODELOPT_PACKAGE}>=0.47"'
#: ModelOpt's preset per scheme: per-channel int8 weights and per-tensor int8 activations; per-tensor fp8 e4m3.
MODELOPT_CONFIGS = {"int8": "INT8_DEFAULT_CFG", "fp8": "FP8_DEFAULT_CFG"}
#: TensorRT builds FP8 layers on Ada (sm89) and newer; Torch-TensorRT's own FP8 tests skip below 8.9.
FP8_MIN_SM = 89
EXPORT_MODE = Call("modelopt.torch.quantization.utils.export_torch_mode", "function")
QUANTIZE_OP = "torch.ops.tensorrt.quantize_op.default"


def quantize_steps(scheme: str) -> list[Step]:
    """``mtq.quantize(model, mtq.<PRESET>, forward_loop=...)``: replaces layers with quantized ones and calibrates."""
    return [Step(Call("modelopt.torch.quantization.quantize", "function",
                      args=(Slot("model"), Ref(f"modelopt.torch.quantization.{MODELOPT_CONFIGS[scheme]}")),
                      kwargs={"forward_loop": Slot("forward_loop")}), "quantized")]


def spec_problems(spec: BuildSpec, precision: str, hardware_compatible: bool) -> list[str]:
    """What in the spec (and the tensorrt target's ``precision``, ``hardware_compatible``) a ModelOpt scheme cannot take."""
    if not is_tensorrt_scheme(spec):
        return []
    assert spec.quantization is not None
    problems = []
    if precision != "fp32":
        problems.append(
            f"target.precision {precision!r} with quantization.scheme {spec.quantization.scheme!r}: autocast "
            "rewrites the types around ModelOpt's Q/DQ nodes, and Torch-TensorRT's quantization examples compile "
            "without it; set precision: fp32 (the quantized layers still run in int8/fp8)"
        )
    if spec.quantization.scheme == "fp8" and hardware_compatible:
        problems.append(
            "target.hardware_compatible with quantization.scheme 'fp8': hardware-compatible engines run on Ampere "
            f"(sm80), which has no FP8; FP8 needs sm{FP8_MIN_SM} or newer. Set hardware_compatible: false or use int8"
        )
    return problems


def toolchain_problems(spec: BuildSpec, toolchain: Toolchain) -> list[str]:
    """What this worker lacks for the spec's ModelOpt scheme (ModelOpt itself, an FP8-capable GPU)."""
    if not is_tensorrt_scheme(spec):
        return []
    assert spec.quantization is not None
    scheme = spec.quantization.scheme
    problems = []
    if toolchain.modelopt is None:
        problems.append(
            f"quantization.scheme {scheme!r} quantizes with NVIDIA ModelOpt, and {MODELOPT_PACKAGE} is not installed "
            f"(torch-tensorrt converts its tensorrt::quantize_op only when it is); install it with: {MODELOPT_INSTALL}"
        )
    sm = toolchain.sm
    if scheme == "fp8" and (number := probed_sm(sm)) is not None and number < FP8_MIN_SM:
        problems.append(
            f"quantization.scheme 'fp8': TensorRT builds FP8 layers on sm{FP8_MIN_SM} (Ada) or newer, this GPU is {sm}; "
            "use scheme int8 here, or run on an Ada/Hopper/Blackwell worker"
        )
    return problems


def _forward_loop(spec: BuildSpec, device: str) -> tuple[Any, str, int]:
    """ModelOpt's calibration callback over every method's calibration samples, their source and their count."""
    from prefect_executorch.spec.modelref import method_module

    batches = []
    source = ""
    for name, method in spec.methods.items():
        source, samples = calibration_inputs(spec, name)
        batches += [(name, method.attribute, sample) for sample in samples]

    def forward_loop(model: torch.nn.Module) -> None:
        for name, attribute, sample in batches:
            method_module(model, name, attribute)(*(t.to(device) for t in sample))

    return forward_loop, source, len(batches)


def quantize_with_modelopt(
    model: torch.nn.Module, spec: BuildSpec, device: str = "cuda"
) -> tuple[torch.nn.Module, str, int]:
    """A copy of ``model`` quantized by ModelOpt and calibrated on ``device``, on ``model``'s device again.

    Returns the quantized model, the calibration source and the number of calibration samples.
    ModelOpt's quantizers also run on the CPU (its reference path), so the export child's eager run
    works wherever the model lives; only torch.export needs them on CUDA, where they become
    ``tensorrt::quantize_op`` (on the CPU they trace data-dependent Python and export fails).
    """
    import importlib.util

    import torch

    assert spec.quantization is not None
    if importlib.util.find_spec("modelopt") is None:
        raise ToolchainMismatch(f"quantization.scheme {spec.quantization.scheme!r} needs {MODELOPT_PACKAGE}, which "
                                f"is not installed here; install it with: {MODELOPT_INSTALL}")
    home = next((p.device for p in model.parameters()), torch.device("cpu"))
    quantized = copy.deepcopy(model).to(device)
    forward_loop, source, samples = _forward_loop(spec, device)
    run_steps(quantize_steps(spec.quantization.scheme), {"model": quantized, "forward_loop": forward_loop})
    return quantized.to(home), source, samples


def export_context(spec: BuildSpec) -> contextlib.AbstractContextManager[Any]:
    """ModelOpt's export mode for a quantized model (torch.export keeps its quantize ops), else nothing."""
    return materialize(EXPORT_MODE, {}) if is_tensorrt_scheme(spec) else contextlib.nullcontext()


def require_quantize_converter(spec: BuildSpec) -> None:
    """Before lowering a ModelOpt model: the installed calls fit, and torch-tensorrt has its quantize converter."""
    if not is_tensorrt_scheme(spec):
        return
    assert spec.quantization is not None
    from prefect_executorch.machine.apisource import Sources
    from prefect_executorch.targets.calls import LiveSources, import_object

    problems = check_calls([*quantize_steps(spec.quantization.scheme), EXPORT_MODE],
                           LiveSources(Sources.installed("modelopt")))
    if problems:
        raise ToolchainMismatch(f"the installed {MODELOPT_PACKAGE} does not accept our calls:\n  - "
                                + "\n  - ".join(problems))
    registry = import_object("torch_tensorrt.dynamo.conversion._ConverterRegistry.DYNAMO_CONVERTERS")
    if import_object(QUANTIZE_OP) not in registry:
        # Engines would leave the quantize ops to ExecuTorch, which has no kernel for them.
        raise ToolchainMismatch(
            f"torch-tensorrt has no converter for {QUANTIZE_OP}: it registers one only if modelopt.torch.quantization "
            f"imports before torch_tensorrt does (is {MODELOPT_PACKAGE} installed and importable?); {MODELOPT_INSTALL}"
        )
