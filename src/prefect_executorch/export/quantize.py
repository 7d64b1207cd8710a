"""Quantizing a model for export: torchao ``quantize_`` (dynamic int8, 8da4w) and PT2E with the XNNPACK quantizer
(static int8); the TensorRT schemes (int8, fp8: ModelOpt's QDQ nodes, built into engines) go to
``targets/tensorrt_quant.py``. The schemes themselves, their gates and each target's refusals are
``spec/schemes.py``.

The same function quantizes the model in the export child and in the validation child, so the
validator can compare the program with the quantized eager model as well as with the float one.
Nothing here imports torch or torchao at module level.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from prefect_executorch.errors import ToolchainMismatch
from prefect_executorch.spec.inputs import calibration_inputs, dynamic_shapes, example_inputs
from prefect_executorch.spec.schemes import CALIBRATED_SCHEMES, TENSORRT_SCHEMES, is_tensorrt_scheme

if TYPE_CHECKING:
    import torch

    from prefect_executorch.spec.buildspec import BuildSpec
    from prefect_executorch.spec.quantization import QuantizationSpec

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
    embeddings: str | None = Field(None, description="The token embeddings' weight type (int8, int4); None: float.")


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
    if quantization.embeddings:
        # A Hugging Face model's token table only: a speech encoder reads its positions' table as a whole weight.
        tokens: torch.nn.Module = getattr(model, "get_input_embeddings", lambda: model)()
        _quantize_embeddings(tokens, quantization.embeddings)
    # Plain tensors for torch.export, as ExecuTorch's source-transform stage leaves them.
    unwrap_tensor_subclass(model)
    return model


#: ``quantization.embeddings`` as ExecuTorch's LLM export names it (``qembedding_config``).
EMBEDDING_CONFIGS = {"int8": "8w", "int4": "4w"}


def _quantize_embeddings(model: torch.nn.Module, weights: str) -> None:
    """The model's embedding tables in ``weights`` (int8, int4), by ExecuTorch's own LLM quantizer.

    The lowering fuses each into one quantized embedding kernel, whose pattern is ``embedding(weight, indices)``:
    a ``padding_idx`` (which changes gradients only, never what a lookup returns) would keep it from matching.
    """
    import torch
    from executorch.extension.llm.export.quantize import quantize_model_

    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            module.padding_idx = None
    quantize_model_(model, qembedding_config=EMBEDDING_CONFIGS[weights], skip_incompatible_shapes=True)


def linear_facts(model: torch.nn.Module, quantization: QuantizationSpec) -> tuple[int | None, list[str]]:
    """How many linears a torchao scheme quantizes and which ones it leaves in float."""
    import torch

    if quantization.scheme in CALIBRATED_SCHEMES:
        return None, []
    fits = _quantizable(quantization)
    linears = [(fqn, m) for fqn, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    left = [fqn for fqn, m in linears if not fits(m, fqn)]
    return len(linears) - len(left), left


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
        embeddings=spec.quantization.embeddings,
    )


def quantized_methods(
    model: torch.nn.Module, spec: BuildSpec
) -> tuple[dict[str, torch.nn.Module], QuantizationFacts | None]:
    """Each method of ``model`` as the (quantized) module to export or run, and the build's facts (None if float)."""
    from prefect_executorch.spec.modelref import method_module

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
