"""The ``cuda`` target without a GPU: its options against the real CudaBackend source, its refusals on machines
that cannot build it, its compat key, its attention rule on real exported graphs, and the forkserver that its
children fork from. What runs on the GPU is tests/targets/test_cuda_gpu.py."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from prefect_executorch.errors import ExportFailed, SpecError, ToolchainMismatch
from prefect_executorch.fleet.placement import MatrixCell
from prefect_executorch.isolation import FORKSERVER_ENV, PRELOAD, WARM_PRELOAD
from prefect_executorch.machine.compat import fit, parse_compat
from prefect_executorch.machine.toolchain import GpuInfo, Toolchain, probe
from prefect_executorch.spec.buildspec import BuildSpec, parse_spec
from prefect_executorch.spec.inputs import dynamic_shapes, example_inputs
from prefect_executorch.spec.methods import InputSpec, MethodSpec
from prefect_executorch.spec.options import CudaOptions
from prefect_executorch.targets import check_build, get_target
from prefect_executorch.targets.cuda import (
    attention_dtypes,
    compile_specs,
    for_precision,
    in_precision,
    tf32_kernels,
    triton_choice,
)
from prefect_executorch.validate.compare import compare_tensor, limits_for

from helpers import MODELS
from models import mlp, tiny_bert, wide_1024

FIXTURES = Path(__file__).parents[1] / "fixtures"
TARGET = get_target("cuda")


def cuda_spec(factory: str = "mlp", shape: list[int] | None = None, **target: Any) -> BuildSpec:
    return parse_spec({"name": "m", "version": "1", "model": f"{MODELS}:{factory}", "target": {"kind": "cuda", **target},
                       "methods": {"forward": {"inputs": [{"name": "x", "shape": shape or [2, 32]}]}}})


@pytest.fixture(scope="module")
def h200() -> Toolchain:
    """The probe of the H200 with the stack ../shared/gpu/stage installs (torch 2.14 cu130, ExecuTorch 1.4.1, the
    runtime wheel), taken there on 2026-12-04 by the run of records/gpu/2026-12-04-h200-5ca7cad/junit-cuda-h200.xml."""
    return Toolchain.model_validate_json((FIXTURES / "hostprobe_h200_staged.json").read_text())


# ---------------------------------------------------------------- the options, checked against CudaBackend's source

def _backend_keys() -> dict[str, set[str] | None]:
    """Compile-spec keys CudaBackend (1.4.1) reads, from its source: key -> accepted values (None: any)."""
    found = importlib.util.find_spec("executorch.backends.cuda.cuda_backend")
    assert found is not None and found.origin is not None
    tree = ast.parse(Path(found.origin).read_text())
    keys: dict[str, set[str] | None] = {}
    for node in ast.walk(tree):
        # `spec.key == "low_memory_mode"` and the keys of `bool_compile_options = {"max_autotune": ...}`
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "key":
            keys.update({c.value: None for c in node.comparators if isinstance(c, ast.Constant)})
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "bool_compile_options"
                                                for t in node.targets):
            assert isinstance(node.value, ast.Dict)
            keys.update({k.value: {"ON", "OFF"} for k in node.value.keys if isinstance(k, ast.Constant)})
    for mode in ("triton_kernel_mode", "low_memory_mode"):  # each compares its value with "ON"/"OFF"
        keys[mode] = {"ON", "OFF"}
    return keys


@pytest.mark.parametrize("options", [{}, {"low_memory": True}, {"triton_kernels": "off"}])
@pytest.mark.parametrize("triton", [True, False])
def test_every_compile_spec_is_one_the_backend_reads(options: dict[str, Any], triton: bool) -> None:
    read = _backend_keys()
    assert {"triton_kernel_mode", "low_memory_mode"} <= set(read)  # the source still reads them
    specs = compile_specs(CudaOptions(**options), "encode", triton)
    assert specs[0] == ("method_name", "encode")  # what CudaBackend.generate_method_name_compile_spec makes
    for key, value in specs[1:]:
        assert key in read, f"CudaBackend does not read {key!r}"
        accepted = read[key]
        assert accepted is None or value in accepted, (key, value)
    assert dict(specs)["triton_kernel_mode"] == ("ON" if triton else "OFF")
    assert ("low_memory_mode", "ON") in specs if options.get("low_memory") else "low_memory_mode" not in dict(specs)


def test_the_method_name_spec_is_what_the_backend_generates() -> None:
    # generate_method_name_compile_spec's body: CompileSpec(COMPILE_SPEC_KEYS.METHOD_NAME.value, name.encode()).
    found = importlib.util.find_spec("executorch.backends.aoti.aoti_backend")
    assert found is not None and found.origin is not None
    source = Path(found.origin).read_text()
    assert 'METHOD_NAME = "method_name"' in source and "method_name.encode(\"utf-8\")" in source


def test_options_are_strict() -> None:
    with pytest.raises(SpecError, match="triton_kernels"):
        cuda_spec(triton_kernels="sometimes")
    with pytest.raises(SpecError, match="precision"):
        cuda_spec(precision="fp8")
    with pytest.raises(SpecError, match="max_autotune"):  # the backend needs it on: no option to turn it off
        cuda_spec(max_autotune=False)


# ---------------------------------------------------------------- refusals before export

def test_this_cpu_machine_is_refused_before_export_naming_what_is_missing() -> None:
    here = probe()
    if here.cuda_available:
        pytest.skip("a CUDA GPU is visible here: tests/targets/test_cuda_gpu.py builds for real")
    with pytest.raises(ToolchainMismatch) as info:
        TARGET.check(cuda_spec(), here)
    message = str(info.value)
    assert message.startswith("this worker cannot build target cuda (")
    assert f"torch {here.torch} is a CPU build" in message and "no NVIDIA GPU is visible" in message
    assert ('pip install "prefect-executorch[cuda]" --extra-index-url https://download.pytorch.org/whl/cu130 '
            "--extra-index-url https://pypi.nvidia.com") in message


def test_the_h200_with_the_staged_stack_can_build_it(h200: Toolchain) -> None:
    assert TARGET.check(cuda_spec(), h200) == []
    assert "changes nothing" in TARGET.check(cuda_spec().model_copy(update={"external_weights": True}), h200)[0]


@pytest.mark.parametrize("update, words", [
    ({"runtime_backends": ["XnnpackBackend"]},
     "runtime has no CudaBackend (it registers XnnpackBackend), so the program could not be validated here; install "
     'the runtime wheel with: pip install "prefect-executorch[cuda]"'),
    ({"nvcc": None, "nvcc_version": None}, "nvcc is not on PATH"),
    ({"nvcc_version": "12.8"}, "nvcc 12.8 at /usr/local/cuda/bin/nvcc is not CUDA 13"),
    ({"triton": None}, "imports triton"),
    ({"executorch": None, "runtime_backends": None}, "executorch is not installed"),
    ({"torch": "2.14.0+cu128", "cuda_version": "12.8", "cuda_channel": "cu128"}, "CUDA 12 is not supported"),
    ({"arch": "armv7l"}, "runs on Linux x86_64 or aarch64; this worker is Linux armv7l"),
])
def test_toolchain_refusals(h200: Toolchain, update: dict[str, Any], words: str) -> None:
    with pytest.raises(ToolchainMismatch) as info:
        TARGET.check(cuda_spec(), h200.model_copy(update=update))
    assert words in str(info.value)


BAD_FORK = ("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use the "
            "'spawn' start method")


@pytest.mark.parametrize("error, words", [
    (BAD_FORK, "had initialised CUDA before forking, a prefect-executorch defect: report it with the --debug output, "
               "and meanwhile set PREFECT_EXECUTORCH_CHILD_START=spawn"),
    ("CUDA error: out of memory", "a memory limit on the probe (address space) or the driver"),
])
def test_a_gpu_that_cuda_did_not_start_is_refused_for_that_not_as_absent(
    h200: Toolchain, monkeypatch: pytest.MonkeyPatch, error: str, words: str,
) -> None:
    """NVML sees the GPU, CUDA does not start in the probe: the probe keeps why, and the refusal says it (a child
    forked from a process that had initialised CUDA once read "no NVIDIA GPU is visible ... run on a GPU worker")."""
    from prefect_executorch.machine.hostprobe import gather

    def fail(index: int) -> None:
        raise RuntimeError(error)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", fail)
    facts = gather()
    assert (facts["cuda_available"], facts["gpus"], facts["cuda_error"]) == (False, [], error)
    with pytest.raises(ToolchainMismatch) as info:
        TARGET.check(cuda_spec(), h200.model_copy(update={key: facts[key] for key in ("cuda_available", "gpus",
                                                                                        "cuda_error")}))
    message = str(info.value)
    assert f"an NVIDIA GPU is visible (NVML) but CUDA did not start in this worker's probe: {error}; " in message
    assert words in message
    assert "no NVIDIA GPU is visible" not in message


@pytest.mark.parametrize("scheme", ["int8-dynamic", "int8da4w", "int8"])
def test_quantized_builds_are_refused_with_the_precision_to_use(h200: Toolchain, scheme: str) -> None:
    spec = parse_spec({"name": "m", "version": "1", "model": f"{MODELS}:mlp", "target": "cuda",
                       "methods": {"forward": {"inputs": [{"name": "x", "shape": [2, 32]}]}},
                       "quantization": {"scheme": scheme}})
    with pytest.raises(SpecError, match="target 'cuda' cannot build .*use target.precision: bf16"):
        TARGET.check(spec, h200)


def test_a_matrix_cell_of_target_cuda_needs_a_cuda_channel() -> None:
    with pytest.raises(ValueError, match="target 'cuda' needs a CUDA channel"):
        MatrixCell.model_validate({"target": "cuda"})
    cell = MatrixCell.model_validate({"target": "cuda", "placement": {"channel": "cu130", "sm": "sm90"}})
    assert (cell.placement.pool, cell.placement.queue, cell.label) == ("gpu-cu130", "sm90", "cuda@cu130-sm90")


# ---------------------------------------------------------------- where the bundle runs

def test_the_compat_key_names_channel_and_exact_sm_and_no_tensorrt(h200: Toolchain) -> None:
    key = TARGET.compat(cuda_spec(), h200)
    assert key == "cu130-sm90-cuda-x86_64"
    parsed = parse_compat(key)
    assert (parsed.kind, parsed.backend, parsed.sm, parsed.sm_or_newer, parsed.tensorrt) == ("gpu", "cuda", 90, False, None)
    assert fit(key, h200).ok  # no TensorRT needed
    b200 = h200.model_copy(update={"gpus": [GpuInfo(index=0, name="B200", sm="sm100", total_memory_mib=180000)]})
    assert fit(key, b200).reason == "kernels built for sm90, this GPU is sm100"
    assert fit(key, h200.model_copy(update={"cuda_channel": "cu132"})).reason == "needs CUDA channel cu130, this machine has cu132"
    cpu = h200.model_copy(update={"cuda_channel": None, "gpus": [], "cuda_available": False})
    assert not fit(key, cpu).ok
    with pytest.raises(ToolchainMismatch, match="compat key of a CUDA bundle cannot be built"):
        TARGET.compat(cuda_spec(), cpu)


# ---------------------------------------------------------------- attention and precision on real exported graphs

class Attention(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_float32_attention_turns_the_triton_kernels_off_with_a_note() -> None:
    q = torch.randn(1, 2, 8, 16)
    program = torch.export.export(Attention(), (q, q, q))
    assert attention_dtypes(program) == {"float32"}
    triton, note = triton_choice(CudaOptions(), "forward", program)
    assert not triton and note is not None and "takes bfloat16 only" in note and "precision: bf16" in note
    with pytest.raises(ExportFailed, match="attention runs in float32 .* target.triton_kernels: auto"):
        triton_choice(CudaOptions(triton_kernels="on"), "forward", program)
    assert triton_choice(CudaOptions(triton_kernels="off"), "forward", program) == (False, None)


def test_bf16_precision_runs_attention_in_bfloat16_behind_float32_inputs_and_outputs() -> None:
    q = torch.randn(1, 2, 8, 16)
    wrapped = in_precision(Attention(), torch.bfloat16)
    program = torch.export.export(wrapped, (q, q, q))
    assert attention_dtypes(program) == {"bfloat16"}
    assert triton_choice(CudaOptions(precision="bf16"), "forward", program) == (True, None)
    out = wrapped(q, q, q)
    assert out.dtype == torch.float32
    reference = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert 0 < float((out - reference).abs().max()) < 5e-2  # computed in bf16, returned in fp32


@pytest.mark.parametrize("precision, attention", [("fp32", {"float32"}), ("bf16", {"bfloat16"})])
def test_a_transformers_bert_exports_behind_its_dynamic_sequence_in_each_precision(precision: str,
                                                                                  attention: set[str]) -> None:
    method = MethodSpec(inputs=[InputSpec(name="ids", shape=[1, 8], dtype="int64", high=64,
                                          dynamic={1: {"min": 2, "max": 16}})])
    module, shapes = for_precision(tiny_bert(), dynamic_shapes(method), precision)
    program = torch.export.export(module, example_inputs(method, seed=0), dynamic_shapes=shapes)
    assert attention_dtypes(program) == attention


def _tf32(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` rounded to TF32's 10 mantissa bits, to nearest (ties away), as a tensor core reads float32."""
    bits = tensor.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def test_tf32_keeps_float32_and_is_held_to_tolerances_a_tf32_matmul_meets_and_float32_s_do_not() -> None:
    spec = cuda_spec("wide_1024", [32, 1024], precision="tf32")
    model = wide_1024().eval()
    assert for_precision(model, None, "tf32")[0] is model  # no cast: the model stays in float32
    assert TARGET.compute_dtype(spec) == "tfloat32"
    x = torch.rand(32, 1024) * 2 - 1  # validation's default draw
    with torch.no_grad():
        expected = model(x)
        hidden = torch.relu(_tf32(x) @ _tf32(model.fc1.weight).T + model.fc1.bias)
        in_tf32 = _tf32(hidden) @ _tf32(model.fc2.weight).T + model.fc2.bias
    assert _tf32(torch.tensor([1 + 2**-11])) == 1 + 2**-10  # ten bits kept, rounded to nearest
    tf32 = compare_tensor("[0]", in_tf32, expected, limits_for(spec.validation, "forward", "[0]", "float32", "tfloat32"))
    fp32 = compare_tensor("[0]", in_tf32, expected, limits_for(spec.validation, "forward", "[0]", "float32"))
    assert tf32.passed and not fp32.passed, (tf32, fp32)
    assert tf32.tolerance_source == "default for float32 computed in tfloat32"


def test_tf32_kernels_set_what_inductor_reads_and_restore_it() -> None:
    # Inductor's GEMM and convolution templates read these (not the legacy allow_tf32 flags) for ALLOW_TF32.
    for module, read in (("torch._inductor.template_heuristics.triton", 'torch.backends.cuda.matmul.fp32_precision == "tf32"'),
                         ("torch._inductor.kernel.conv", 'torch.backends.cudnn.fp32_precision == "tf32"')):
        found = importlib.util.find_spec(module)
        assert found is not None and found.origin is not None and read in Path(found.origin).read_text(), module
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn

    def state() -> tuple[bool, str, bool, str]:
        # The legacy flags are read too: a read that raises ("mix of the legacy and new APIs") would break eager calls.
        return matmul.allow_tf32, matmul.fp32_precision, cudnn.allow_tf32, cudnn.fp32_precision

    before = state()
    with tf32_kernels(False):
        assert state() == before
    with pytest.raises(ExportFailed), tf32_kernels(True):
        assert state()[1] == "tf32" and state()[3] == "tf32" and state()[0] is True
        raise ExportFailed("the compile failed")
    after = state()
    assert (after[0], after[2], after[3]) == (before[0], before[2], before[3])
    assert after[1] == ("tf32" if before[0] else "ieee")  # matmul's precision follows its restored flag


def test_a_model_without_attention_keeps_the_triton_kernels() -> None:
    program = torch.export.export(mlp(), (torch.randn(2, 32),))
    assert attention_dtypes(program) == set()
    assert triton_choice(CudaOptions(), "forward", program) == (True, None)


# ---------------------------------------------------------------- the forkserver its children fork from

def test_the_forkserver_preload_makes_no_fork_poisoning_cuda_call() -> None:
    # A child forked from a process that asked the CUDA runtime anything fails "Cannot re-initialize CUDA in forked
    # subprocess". torch.cuda.is_available() asks it (cudaGetDeviceCount) unless PYTORCH_NVML_BASED_CUDA_CHECK=1,
    # and CUDA's initialisation always does. The script counts both kinds of call the preload makes.
    script = (
        "import importlib, json, os, sys, torch, torch.cuda\n"
        "calls = []\n"
        "def counted(name, call, poisons):\n"
        "    def run(*args, **kwargs):\n"
        "        if poisons():\n            calls.append(name)\n"
        "        return call(*args, **kwargs)\n"
        "    return run\n"
        "visible = (lambda: True) if os.environ.get('GPU_VISIBLE') else torch.cuda.is_available\n"
        "torch.cuda.is_available = counted('is_available', visible,\n"
        "                                  lambda: os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK') != '1')\n"
        # Seen by its code, not its name: torch.cuda's submodules hold their own references to it.
        "def initialising(frame, event, arg):\n"
        "    if event == 'call' and frame.f_code is torch.cuda._lazy_init.__code__:\n"
        "        calls.append('_lazy_init')\n"
        "sys.setprofile(initialising)\n"
        "for name in json.loads(os.environ['PRELOAD_UNDER_TEST']):\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(calls))\n"
    )

    def calls(preload: list[str], gpu_visible: bool = False) -> list[str]:
        # The caller's own setting, "0", is what the forkserver's first preload must override.
        env = {**os.environ, "PYTORCH_NVML_BASED_CUDA_CHECK": "0", "PRELOAD_UNDER_TEST": json.dumps(preload),
               "GPU_VISIBLE": "1" if gpu_visible else ""}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        return list(json.loads(done.stdout.strip().splitlines()[-1]))

    first, *imports = PRELOAD
    assert first == "prefect_executorch.forkserver_env" and FORKSERVER_ENV == {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    assert "is_available" in calls(imports), "the preload no longer asks CUDA: drop FORKSERVER_ENV"
    # A building process's: where torch sees a GPU, the warm-up's export would save CUDA's RNG state (CUDA's
    # initialisation) had it run; this machine has none, so torch is told it has one.
    assert calls([*PRELOAD, WARM_PRELOAD], gpu_visible=True) == []


def test_the_cuda_extra_admits_what_the_runtime_wheel_requires() -> None:
    import tomllib
    import zipfile

    from packaging.requirements import Requirement

    from wheels import DELEGATE_RUNTIME, download_wheel

    extra = {Requirement(r).name: Requirement(r) for r in
             tomllib.loads((FIXTURES.parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cuda"]}
    with zipfile.ZipFile(download_wheel(DELEGATE_RUNTIME)) as wheel:
        metadata = next(wheel.read(n).decode() for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    required = {r.name: r for r in (Requirement(line.split(":", 1)[1]) for line in metadata.splitlines()
                                    if line.startswith("Requires-Dist:"))}
    assert extra["executorch"].specifier.contains(next(iter(required["executorch"].specifier)).version)
    assert all(extra["torch"].specifier.contains(v) == required["torch"].specifier.contains(v)
               for v in ("2.13.9", "2.14.0", "2.14.5", "2.15.0"))
    assert extra["torch-tensorrt-executorch-runtime"].specifier.contains(DELEGATE_RUNTIME.split("==")[1])
    assert "tensorrt-cu13" in required  # why the install line names NVIDIA's index


def test_the_pool_setting_names_the_missing_driver() -> None:
    import ctypes

    from prefect_executorch.targets.gpu import set_cuda_pool_release_threshold

    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("this machine has the NVIDIA driver library")
    except OSError:
        pass
    with pytest.raises(ToolchainMismatch, match="no driver library .*libcuda.so.1.*GPU worker"):
        set_cuda_pool_release_threshold()


# ---------------------------------------------------------------- CUDA-graph replay and Inductor settings

def test_cuda_graphs_are_refused_for_dynamic_inputs_naming_them(h200: Toolchain) -> None:
    dynamic = parse_spec({"name": "m", "version": "1", "model": f"{MODELS}:mlp",
                          "target": {"kind": "cuda", "cuda_graphs": True},
                          "methods": {"forward": {"inputs": [{"name": "x", "shape": [2, 32],
                                                              "dynamic": {0: {"min": 1, "max": 8}}}]}}})
    with pytest.raises(SpecError, match=r"target.cuda_graphs: .* dynamic: forward.x; remove their dynamic dims"):
        check_build(dynamic, h200)
    assert check_build(cuda_spec(cuda_graphs=True), h200) == []


def test_the_manifest_names_the_methods_to_replay_and_the_inductor_settings() -> None:
    hints = TARGET.runtime_hints(cuda_spec(cuda_graphs=True, inductor={"coordinate_descent_tuning": True}))
    assert hints["cuda_graph_methods"] == ["forward"] and hints["inductor"] == {"coordinate_descent_tuning": True}
    assert TARGET.runtime_hints(cuda_spec())["cuda_graph_methods"] == []


@pytest.mark.parametrize("settings, words", [
    ({"max_autotune_gemm_backends": "ATEN"}, "target.inductor.max_autotune_gemm_backends: ExecuTorch's CUDA backend "
                                             "sets this itself"),
    ({"aot_inductor.package": False}, "target.inductor.aot_inductor.package: ExecuTorch's CUDA backend sets this"),
    ({"coordinate_decent_tuning": True}, "target.inductor.coordinate_decent_tuning: torch 2."),
])
def test_inductor_settings_the_backend_owns_or_inductor_lacks_are_refused(h200: Toolchain, settings: dict[str, Any],
                                                                          words: str) -> None:
    with pytest.raises(SpecError) as info:
        TARGET.check(cuda_spec(inductor=settings), h200)
    assert words in str(info.value)
    assert TARGET.check(cuda_spec(inductor={"coordinate_descent_tuning": True,
                                            "max_autotune_gemm_search_space": "EXHAUSTIVE"}), h200) == []



def test_every_inductor_setting_the_backend_sets_is_refused_in_target_inductor() -> None:
    from prefect_executorch.targets.cuda import BACKEND_OWNED_INDUCTOR

    found = importlib.util.find_spec("executorch.backends.cuda.cuda_backend")
    assert found is not None and found.origin is not None
    tree = ast.parse(Path(found.origin).read_text())
    method = next(node for node in ast.walk(tree)
                  if isinstance(node, ast.FunctionDef) and node.name == "get_aoti_compile_options")
    literal = next(node for node in ast.walk(method) if isinstance(node, ast.Dict) and len(node.keys) > 5)
    set_keys = {key.value for key in literal.keys if isinstance(key, ast.Constant)}
    assert "max_autotune_gemm_backends" in set_keys  # the dict of options the backend compiles with
    assert {key for key in set_keys if not key.startswith("aot_inductor.")} <= BACKEND_OWNED_INDUCTOR


# ---------------------------------------------------------------- how a replay is judged (the GPU test runs the real one)

def _calls(log_on: int | None, drift_on: int | None) -> Callable[[], list[torch.Tensor]]:
    """A method's calls: the runtime's capture line logged (to fd 2, as C++ writes it) on call ``log_on``, and the
    outputs changed from call ``drift_on``."""
    count = [0]

    def call() -> list[torch.Tensor]:
        count[0] += 1
        if count[0] == log_on:
            os.write(2, b"[cuda_backend.cpp:753] CUDA graph: captured and instantiated for 'forward'\n")
        return [torch.full((2,), 1.0 if drift_on is None or count[0] < drift_on else 1.0 + 2**-20)]

    return call


@pytest.mark.parametrize("log_on, drift_on, problem", [
    (4, None, None),
    (None, None, "the runtime did not report capturing it after 5 calls"),
    (4, 5, "the replayed CUDA graph's outputs differ from the direct call's"),
])
def test_a_replay_passes_only_when_the_runtime_captured_it_and_its_outputs_equal_the_direct_ones(
        log_on: int | None, drift_on: int | None, problem: str | None) -> None:
    from prefect_executorch.validate.replay import check_replay

    check = check_replay("forward", _calls(log_on, drift_on))
    assert check.calls == 5
    assert (check.problem is None) if problem is None else (problem in (check.problem or ""))


def test_a_speech_spec_builds_for_cuda_without_graph_replay(h200: Toolchain) -> None:
    def asr(cuda_graphs: bool) -> BuildSpec:
        return parse_spec({"name": "w", "version": "1", "model": "/models/whisper", "asr": {},
                           "target": {"kind": "cuda", "precision": "bf16", "cuda_graphs": cuda_graphs}})

    assert TARGET.check(asr(False), h200) == [] and TARGET.compute_dtype(asr(False)) == "bfloat16"
    with pytest.raises(SpecError, match="target.cuda_graphs with asr: a speech program's decoder is not run at fixed "
                                        "sizes yet"):
        check_build(asr(True), h200)


def test_a_decoder_lm_replays_a_one_token_forward_and_a_one_call_prefill_is_refused_beside_graphs(
        h200: Toolchain, tmp_path: Path) -> None:
    from prefect_executorch.testing.tiny_llm import write_tiny_llm

    model_dir = write_tiny_llm(tmp_path / "llama", "llama")

    def llm(prefill: str, cuda_graphs: bool) -> BuildSpec:
        return parse_spec({"name": "m", "version": "1", "model": str(model_dir),
                           "target": {"kind": "cuda", "precision": "bf16", "cuda_graphs": cuda_graphs},
                           "llm": {"max_seq_len": 40, "new_tokens": 4, "prefill": prefill}})

    per_call = TARGET.token_per_call
    assert per_call(llm("auto", True)) and not per_call(llm("auto", False)) and per_call(llm("token_by_token", False))
    assert TARGET.runtime_hints(llm("auto", True))["cuda_graph_methods"] == ["forward"]
    assert check_build(llm("auto", True), h200) == []
    with pytest.raises(SpecError, match="target.cuda_graphs with llm.prefill: one_call: a CUDA graph replays the "
                                        "sizes it captured, and the prompt comes in calls of other sizes"):
        check_build(llm("one_call", True), h200)


def test_splits_reach_the_cuda_backend_as_slices_that_compute_the_same() -> None:
    """The CUDA backend cannot compile the edge dialect's ``split_copy`` (a Moonshine decoder's ``chunk`` failed its
    build, twice: a strict export keeps ``chunk`` itself): the edge programs it compiles have their splits and chunks,
    even and uneven, as slices, from either export; a dynamic dim stays dynamic."""
    from executorch.exir import EdgeCompileConfig, to_edge

    from prefect_executorch.targets.cuda import splits_as_slices

    class Gated(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            value, gate = x.chunk(2, dim=-1)
            first, second, third = torch.split(x, [3, 5, 8], dim=-1)
            return value * torch.nn.functional.silu(gate), first.sum(-1) - second.sum(-1) * third.sum(-1), \
                x.split(6, dim=-1)[2], x.chunk(3, dim=-1)[2]

    class ChunkOnly(torch.nn.Module):  # Moonshine's gated MLP: its one split is a chunk
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            value, gate = x.chunk(2, dim=-1)
            return value * torch.nn.functional.silu(gate)

    def operators(program: Any) -> set[str]:
        return {str(node.target) for node in program.graph.nodes if node.op == "call_function"}

    steps = torch.export.Dim("steps", min=2, max=64)
    for model, strict in [(Gated(), False), (Gated(), True), (ChunkOnly(), True)]:
        program = torch.export.export(model, (torch.randn(2, 5, 16),), dynamic_shapes=({1: steps},), strict=strict)
        assert any("split" in name or "chunk" in name for name in operators(program))
        sliced = splits_as_slices(program)
        edge = to_edge(sliced, compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True))
        assert not any("split" in name or "chunk" in name for name in operators(edge.exported_program())), model
        assert "aten.slice.Tensor" in operators(sliced)
        for length in (5, 9):
            x = torch.randn(2, length, 16)
            for want, got in zip(torch.utils._pytree.tree_leaves(program.module()(x)),
                                 torch.utils._pytree.tree_leaves(sliced.module()(x)), strict=True):
                assert torch.equal(want, got)
    plain = torch.export.export(torch.nn.Linear(4, 4), (torch.randn(1, 4),))
    assert splits_as_slices(plain) is plain
