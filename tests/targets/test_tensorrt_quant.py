"""TensorRT int8 / fp8 (ModelOpt PTQ) without a GPU: refusals, compat keys, and the calls against the real sources.

torch-tensorrt 2.14.0 and nvidia-modelopt 0.47.0 come from ``tests/wheels.py`` and are read with ``ast``;
the builds themselves run in ``tests/targets/test_tensorrt_quant_gpu.py`` on a GPU worker.
"""

from __future__ import annotations

import ast
from typing import Any

import pytest
from test_tensorrt_api import ready, refusal, sources, trt_wheel  # noqa: F401 - fixtures shared with the float checks

from prefect_executorch.artifacts.manifest import BundleKey
from prefect_executorch.errors import SpecError
from prefect_executorch.export.fingerprint import build_fingerprint
from prefect_executorch.machine.apisource import Sources, WheelRoot
from prefect_executorch.machine.compat import fit, parse_compat
from prefect_executorch.machine.toolchain import GpuInfo, Toolchain
from prefect_executorch.spec.buildspec import BuildSpec, parse_spec
from prefect_executorch.spec.schemes import CPU_SCHEMES, DEFAULT_GATES, TENSORRT_SCHEMES
from prefect_executorch.spec.validation import ValidationSpec
from prefect_executorch.targets import get_target
from prefect_executorch.targets.calls import Call, check_calls
from prefect_executorch.targets.tensorrt import build_steps
from prefect_executorch.targets.tensorrt_quant import (
    EXPORT_MODE,
    MODELOPT_CONFIGS,
    MODELOPT_INSTALL,
    QUANTIZE_OP,
    quantize_steps,
)
from prefect_executorch.validate.compare import limits_for

from helpers import MODELS
from wheels import MODELOPT, download_wheel

TARGET = get_target("tensorrt")
CPU = Toolchain(python="3.11", os="Linux", arch="x86_64", torch="2.13.0", executorch="1.4.1")


@pytest.fixture(scope="module")
def modelopt_wheel() -> WheelRoot:
    return WheelRoot(download_wheel(MODELOPT))


@pytest.fixture(scope="module")
def modelopt(modelopt_wheel: WheelRoot) -> Sources:
    return Sources({"modelopt": modelopt_wheel})


@pytest.fixture(scope="module")
def with_modelopt(ready: Toolchain) -> Toolchain:  # noqa: F811 - the imported fixture
    """The H200 release stack of test_tensorrt_api with nvidia-modelopt installed."""
    return ready.model_copy(update={"modelopt": "0.47.0"})


def quant_spec(scheme: str, kind: str = "tensorrt", calibration: dict[str, Any] | None = None, **target: Any) -> BuildSpec:
    quantization: dict[str, Any] = {"scheme": scheme, **({"calibration": calibration} if calibration else {})}
    return parse_spec({
        "name": "m", "version": "1", "model": f"{MODELS}:mlp",
        "methods": {"forward": {"inputs": [{"name": "x", "shape": [2, 32]}]}},
        "target": {"kind": kind, **target}, "quantization": quantization,
    })


def on_gpu(toolchain: Toolchain, sm: str, name: str) -> Toolchain:
    return toolchain.model_copy(update={"gpus": [GpuInfo(index=0, name=name, sm=sm, total_memory_mib=81920)]})


# ------------------------------------------------------------------- the spec and the targets' refusals


def test_the_tensorrt_schemes_parse_calibrate_and_are_named_by_an_unknown_scheme() -> None:
    spec = quant_spec("fp8", calibration={"dataset": "tests/quantized_models.py:calibration", "max_samples": 4})
    assert spec.quantization is not None and spec.quantization.calibration is not None
    assert spec.quantization.calibration.max_samples == 4
    with pytest.raises(SpecError) as info:
        quant_spec("int4")
    assert "int8-static, int8, fp8" in str(info.value)
    with pytest.raises(SpecError, match="calibration applies to int8-static, int8, fp8 only"):
        quant_spec("int8-dynamic", kind="xnnpack", calibration={"max_samples": 2})


@pytest.mark.parametrize("kind", ["xnnpack", "portable"])
@pytest.mark.parametrize("scheme", TENSORRT_SCHEMES)
def test_cpu_targets_refuse_the_tensorrt_schemes(kind: str, scheme: str) -> None:
    with pytest.raises(SpecError) as info:
        get_target(kind).check(quant_spec(scheme, kind=kind), CPU)
    assert f"target {kind!r} cannot build {scheme!r}" in str(info.value)
    assert "tensorrt::quantize_op has a TensorRT converter and no ExecuTorch CPU kernel" in str(info.value)


@pytest.mark.parametrize("scheme", CPU_SCHEMES)
def test_tensorrt_refuses_the_cpu_schemes_and_names_its_own(scheme: str, with_modelopt: Toolchain) -> None:
    with pytest.raises(SpecError) as info:
        TARGET.check(quant_spec(scheme), with_modelopt)
    assert "on target tensorrt use scheme int8 or fp8" in str(info.value)


@pytest.mark.parametrize("scheme", TENSORRT_SCHEMES)
def test_without_modelopt_the_scheme_is_refused_with_the_install_command(scheme: str, ready: Toolchain) -> None:  # noqa: F811
    message = refusal(quant_spec(scheme), ready)
    assert f"quantization.scheme {scheme!r} quantizes with NVIDIA ModelOpt, and nvidia-modelopt is not installed" in message
    assert MODELOPT_INSTALL in message and '"nvidia-modelopt>=0.47"' in message
    assert "(1 problems)" in message  # the rest of the release stack is fine
    assert TARGET.check(quant_spec(scheme, precision="fp32"), ready.model_copy(update={"modelopt": "0.47.0"})) == []


def test_fp8_needs_sm89_int8_does_not(with_modelopt: Toolchain) -> None:
    a100, l40s = on_gpu(with_modelopt, "sm80", "NVIDIA A100"), on_gpu(with_modelopt, "sm89", "NVIDIA L40S")
    message = refusal(quant_spec("fp8"), a100)
    assert "TensorRT builds FP8 layers on sm89 (Ada) or newer, this GPU is sm80; use scheme int8 here" in message
    assert TARGET.check(quant_spec("int8"), a100) == []
    assert TARGET.check(quant_spec("fp8"), l40s) == []


def test_an_old_torch_tensorrt_refuses_a_quantized_build_too(with_modelopt: Toolchain) -> None:
    message = refusal(quant_spec("int8"), with_modelopt.model_copy(update={"torch_tensorrt": "2.13.0"}))
    assert "torch-tensorrt 2.13.0 is older than 2.14" in message


@pytest.mark.parametrize(("scheme", "target", "words"), [
    ("int8", {"precision": "fp16"}, "target.precision 'fp16' with quantization.scheme 'int8'"),
    ("fp8", {"precision": "bf16"}, "set precision: fp32"),
    ("fp8", {"hardware_compatible": True}, "hardware-compatible engines run on Ampere (sm80), which has no FP8"),
])
def test_options_a_quantized_engine_cannot_take_are_spec_errors(
    scheme: str, target: dict[str, Any], words: str, with_modelopt: Toolchain
) -> None:
    with pytest.raises(SpecError) as info:
        TARGET.check(quant_spec(scheme, **target), with_modelopt)
    assert words in str(info.value)


def test_int8_with_hardware_compatible_engines_is_accepted(with_modelopt: Toolchain) -> None:
    spec = quant_spec("int8", hardware_compatible=True)
    assert TARGET.check(spec, with_modelopt) == []
    assert TARGET.compat(spec, with_modelopt) == "cu130-sm80plus-trt11.1-x86_64-int8"


# ------------------------------------------------------------------- compat keys, cache keys


def test_the_compat_key_names_the_scheme_and_a_float_engine_wins_a_fit(with_modelopt: Toolchain) -> None:
    assert TARGET.compat(quant_spec("int8"), with_modelopt) == "cu130-sm90-trt11.1-x86_64-int8"
    assert TARGET.compat(quant_spec("fp8"), with_modelopt) == "cu130-sm90-trt11.1-x86_64-fp8"
    key = BundleKey(name="m", version="1", target="tensorrt", compat=TARGET.compat(quant_spec("fp8"), with_modelopt))
    assert key.prefix == "m/1/tensorrt/cu130-sm90-trt11.1-x86_64-fp8"
    parsed = parse_compat("cu132-sm90plus-trt11.1plus-aarch64-fp8")
    assert (parsed.kind, parsed.arch, parsed.quantization, parsed.sm_or_newer) == ("gpu", "aarch64", "fp8", True)
    quantized, float_engine = fit("cu130-sm90-trt11.1-x86_64-int8", with_modelopt), fit("cu130-sm90-trt11.1-x86_64", with_modelopt)
    assert quantized.ok and float_engine.ok and quantized.rank < fit("cu130-sm80plus-trt11.1plus-x86_64", with_modelopt).rank
    assert not fit("cu130-sm89-trt11.1-x86_64-fp8", with_modelopt).ok
    for bad in ("cu130-sm90-trt11.1-x86_64-int8da4wg32", "cu130-sm90-trt11.1-x86_64-fp4"):
        with pytest.raises(SpecError):
            parse_compat(bad)


def test_the_default_gate_is_the_quantized_one() -> None:
    for scheme in TENSORRT_SCHEMES:
        assert limits_for(ValidationSpec(), "forward", "[0]", "float32", quantization=scheme) == (
            None, None, 0.99, f"default for {scheme} quantization", 0.1)


def test_the_cache_key_takes_the_modelopt_version_not_torchao(with_modelopt: Toolchain) -> None:
    toolchain = with_modelopt.model_copy(update={"modelopt": None})
    print_ = build_fingerprint(quant_spec("int8"), toolchain, "cu130-sm90-trt11.1-x86_64-int8", "/s")
    assert "modelopt" in print_.toolchain and "torchao" not in print_.toolchain
    assert print_.spec["quantization"]["scheme"] == "int8"
    assert print_.key() != build_fingerprint(quant_spec("fp8"), toolchain, "cu130-sm90-trt11.1-x86_64-int8", "/s").key()


#: Run in a child: importing ModelOpt takes ~30 s and registers torch ops and patches for the whole process.
CALIBRATE = """
import json, sys, torch
from prefect_executorch.machine.apisource import Sources
from prefect_executorch.targets.calls import LiveSources, check_calls
from prefect_executorch.spec.modelref import load_model
from prefect_executorch.spec.buildspec import parse_spec
from prefect_executorch.targets.tensorrt_quant import EXPORT_MODE, quantize_steps, quantize_with_modelopt
results = {}
for scheme, spec in json.loads(sys.argv[1]).items():
    spec = parse_spec(spec)
    model = load_model(spec)
    quantized, source, samples = quantize_with_modelopt(model, spec, device="cpu")
    x = torch.rand(16, 64, generator=torch.Generator().manual_seed(9)) * 2 - 1
    with torch.no_grad():
        want, got = model(x), quantized(x)
    results[scheme] = {
        "source": source, "samples": samples,
        "cosine": torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0).item(),
        "rel_error": ((got - want).norm() / want.norm()).item(),
        "quantizers": sorted({type(m).__name__ for m in quantized.modules()} - {type(m).__name__ for m in model.modules()}),
        "untouched": sorted(type(m).__name__ for m in model.modules()),
        "problems": check_calls([*quantize_steps(spec.quantization.scheme), EXPORT_MODE],
                                LiveSources(Sources.installed("modelopt"))),
    }
print("RESULT " + json.dumps(results))
"""


def test_modelopt_calibrates_on_the_validation_samples_or_a_dataset_within_the_gate() -> None:
    """Real ModelOpt on the CPU (its reference quantizers): the calibration, the copy and the error, not TensorRT."""
    import importlib.util
    import json
    import subprocess
    import sys

    if importlib.util.find_spec("modelopt") is None:
        pytest.fail(f"nvidia-modelopt is in the dev extra; install it: {MODELOPT_INSTALL}")
    dataset = f"{MODELS.parent / 'quantized_models.py'}:calibration"
    specs = {scheme: {"name": "m", "version": "1", "model": f"{MODELS.parent / 'quantized_models.py'}:two_linears",
                      "methods": {"forward": {"inputs": [{"name": "x", "shape": [4, 64]}]}},
                      "target": {"kind": "tensorrt"}, "validation": {"samples": 3},
                      "quantization": {"scheme": scheme, **({"calibration": {"dataset": dataset}} if scheme == "fp8" else {})}}
             for scheme in TENSORRT_SCHEMES}
    done = subprocess.run([sys.executable, "-c", CALIBRATE, json.dumps(specs)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert (results["int8"]["source"], results["int8"]["samples"]) == ("validation samples", 3)
    assert (results["fp8"]["source"], results["fp8"]["samples"]) == (f"dataset {dataset}", 5)
    for scheme, result in results.items():
        gate = DEFAULT_GATES[scheme]
        assert result["cosine"] >= gate.min_cosine and result["rel_error"] <= gate.max_rel_error, (scheme, result)
        assert result["rel_error"] > 0  # the weights were really rounded
        assert {"QuantLinear", "TensorQuantizer"} <= set(result["quantizers"])
        assert result["untouched"] == ["Linear", "Linear", "TwoLinears"]  # the float model is left as it was
        assert result["problems"] == []


# ------------------------------------------------------------------- the calls against the real sources


@pytest.mark.parametrize("scheme", TENSORRT_SCHEMES)
def test_the_modelopt_calls_fit_its_sources(scheme: str, modelopt: Sources) -> None:
    assert check_calls([*quantize_steps(scheme), EXPORT_MODE], modelopt) == []
    renamed = [Call("modelopt.torch.quantization.quantize", "function", kwargs={"calibrate_loop": None}),
               Call("modelopt.torch.quantization.utils.export_torch_mode", "function", args=(True,))]
    assert check_calls(renamed, modelopt) == [
        "modelopt.torch.quantization.quantize does not accept the keyword 'calibrate_loop'",
        "modelopt.torch.quantization.utils.export_torch_mode takes 0 positional arguments, we pass 1",
    ]


def recipe_imports(wheel: WheelRoot, recipe: str, depth: int) -> set[str]:
    """The recipes a ModelOpt YAML recipe imports (``name: configs/...`` under ``imports:``), ``depth`` levels deep."""
    text = wheel.read(f"modelopt_recipes/{recipe}.yaml")
    assert text is not None, f"{recipe}.yaml is not in the wheel"
    found = {line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("  ")
             and line.split(":", 1)[-1].strip().startswith("configs/")}
    return found.union(*(recipe_imports(wheel, r, depth - 1) for r in found)) if depth > 1 else found


def test_the_presets_exist_and_are_the_formats_the_converter_takes(modelopt: Sources, modelopt_wheel: WheelRoot) -> None:
    config = modelopt.module("modelopt.torch.quantization.config")
    assert config is not None
    assigned = {s.target.id: s.value for s in config.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value is not None}
    # config.py has no __all__: its star import exports every public name; `choices` lists the presets.
    assert not any(isinstance(s, ast.Assign) and "__all__" in ast.unparse(s) for s in config.body)
    exported = ast.literal_eval(assigned["choices"])
    package = modelopt.module("modelopt.torch.quantization")
    assert package is not None and any(isinstance(s, ast.ImportFrom) and s.module == "config"
                                       and s.names[0].name == "*" for s in package.body)
    numerics = {"int8": "num_bits: 8", "fp8": "num_bits: e4m3"}  # the converter's exponent_bits 0 and 4
    for scheme, name in MODELOPT_CONFIGS.items():
        assert name in exported
        loader = assigned[name]  # _load_quantize_config_dict("configs/ptq/presets/model/int8")
        assert isinstance(loader, ast.Call) and isinstance(loader.args[0], ast.Constant)
        preset = loader.args[0].value
        # The preset imports its numerics directly (int8) or through a unit (fp8: w8a8_fp8_fp8).
        assert f"configs/numerics/{scheme}" in recipe_imports(modelopt_wheel, preset, depth=2)
        assert numerics[scheme] in (modelopt_wheel.read(f"modelopt_recipes/configs/numerics/{scheme}.yaml") or "")


def test_torch_tensorrt_converts_modelopts_quantize_op_to_int8_and_fp8(sources: Sources, modelopt_wheel: WheelRoot) -> None:  # noqa: F811
    converters = sources.module("torch_tensorrt.dynamo.conversion.aten_ops_converters")
    assert converters is not None
    guarded = [s for s in converters.body if isinstance(s, ast.Try) and any(
        isinstance(i, ast.Import) and i.names[0].name == "modelopt.torch.quantization" for i in s.body)]
    registered = {ast.unparse(d.args[0]) for s in guarded for f in s.orelse if isinstance(f, ast.FunctionDef)
                  for d in f.decorator_list if isinstance(d, ast.Call)}
    # Registered only in the else of `try: import modelopt.torch.quantization`: ModelOpt must import first.
    assert QUANTIZE_OP in registered
    quantize = sources.resolve("torch_tensorrt.dynamo.conversion.impl.quantize.quantize")
    assert sources.params(quantize).positional[-4:] == ["input_tensor", "amax", "num_bits", "exponent_bits"]
    impl = sources.module("torch_tensorrt.dynamo.conversion.impl.quantize")
    assert impl is not None and {"trt.DataType.INT8", "trt.DataType.FP8"} <= {
        ast.unparse(n) for n in ast.walk(impl) if isinstance(n, ast.Attribute)}
    schema = modelopt_wheel.read("modelopt/torch/quantization/tensor_quant.py") or ""
    assert '"tensorrt::quantize_op",\n        "(Tensor input, Tensor amax, int num_bits, int exponent_bits, "' in schema
    registry = sources.module("torch_tensorrt.dynamo.conversion._ConverterRegistry")
    assert registry is not None and any(isinstance(s, ast.AnnAssign) and ast.unparse(s.target) == "DYNAMO_CONVERTERS"
                                        for s in registry.body)


def test_the_compile_call_of_a_quantized_build_is_the_float_one(sources: Sources) -> None:  # noqa: F811
    float_steps = build_steps(quant_spec("int8").model_copy(update={"quantization": None}))
    for scheme in TENSORRT_SCHEMES:
        steps = build_steps(quant_spec(scheme))
        assert steps == float_steps and check_calls(steps, sources) == []
    # 2.14 has no precision keyword: the Q/DQ nodes in the graph set int8/fp8.
    compile_params = sources.params(sources.resolve("torch_tensorrt.dynamo.compile"))
    assert not {"enabled_precisions", "use_explicit_typing"} & compile_params.keywords
    tracer = sources.module("torch_tensorrt.dynamo._tracer")
    assert tracer is not None and "export_torch_mode" in ast.unparse(tracer)
