"""A TensorRT program on a machine that cannot run it: clear messages, never a bare ``0x20``.

The program is made here on the CPU with ExecuTorch's real serialization: a backend whose id is
``TensorRTBackend`` takes the whole graph, exactly as the real delegate's id appears in a .pte.
The delegate runtime is the real 0.1.0 wheel, unpacked but unable to load its CUDA libraries.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest
import torch

from prefect_executorch.errors import ToolchainMismatch
from prefect_executorch.program import read_program
from prefect_executorch.runtime.loaded_program import LoadedProgram, describe_runtime_error
from prefect_executorch.spec.buildspec import parse_spec
from prefect_executorch.validate.validator import validate_program

from helpers import MODELS
from wheels import DELEGATE_RUNTIME, download_wheel

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trt_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle directory whose model.pte delegates x + 1 to ``TensorRTBackend``."""
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
    from executorch.exir.backend.canonical_partitioners.all_node_partitioner import AllNodePartitioner

    from models import add_one

    class TensorRTBackend(BackendDetails):  # the class name is the delegate id in the .pte
        @staticmethod
        def preprocess(edge_program, compile_specs):  # type: ignore[no-untyped-def]
            return PreprocessResult(processed_bytes=b"NOT_A_TENSORRT_ENGINE" + bytes(43))

    program = torch.export.export(add_one(), (torch.randn(2, 3),))
    lowered = to_edge_transform_and_lower(program, partitioner=[AllNodePartitioner("TensorRTBackend", [])])
    bundle = tmp_path_factory.mktemp("trt-bundle")
    (bundle / "model.pte").write_bytes(lowered.to_executorch().buffer)
    assert read_program(bundle / "model.pte")["forward"].delegates == ["TensorRTBackend"]
    return bundle


def test_loading_without_the_delegate_names_the_package_and_channel(trt_bundle: Path) -> None:
    with pytest.raises(ToolchainMismatch) as info:
        LoadedProgram(trt_bundle / "model.pte", channel="cu132")
    assert str(info.value) == (
        "cannot run model.pte: bundle needs TensorRTBackend: install torch-tensorrt-executorch-runtime on channel "
        "cu132 (this machine's torch channel) and import it before executorch's runtime"
    )
    with pytest.raises(ToolchainMismatch) as info:
        LoadedProgram(trt_bundle / "model.pte")
    assert "on the CUDA 13 channel the bundle was built for (this machine's torch is a CPU build)" in str(info.value)


def test_the_raw_0x20_gets_its_name(trt_bundle: Path) -> None:
    from executorch.extension.pybindings.portable_lib import _load_for_executorch

    module = _load_for_executorch(str(trt_bundle / "model.pte"))
    with pytest.raises(RuntimeError) as info:
        module.run_method("forward", (torch.randn(2, 3),))
    assert "0x20" in str(info.value)
    assert describe_runtime_error(info.value).endswith(
        "[ExecuTorch error 0x20: NotFound: a backend or a named datum (.ptd) is missing]")


def test_validation_of_a_tensorrt_spec_refuses_before_loading(trt_bundle: Path, tmp_path: Path) -> None:
    spec = parse_spec({
        "name": "add-one", "version": "1", "model": f"{MODELS}:add_one", "target": "tensorrt",
        "methods": {"forward": {"inputs": [{"name": "x", "shape": [2, 3]}]}},
    })
    with pytest.raises(ToolchainMismatch) as info:
        validate_program(spec, trt_bundle, [], scratch_dir=tmp_path)
    message = str(info.value)
    assert message.startswith("bundle needs TensorRTBackend: install torch-tensorrt-executorch-runtime on ")
    assert "No module named 'torch_tensorrt_executorch_runtime'" in message


def _setup_with_real_runtime_wheel(tmp_path: Path, stock_runtime_first: bool) -> str:
    """Run the target's runtime setup in a child that has the real 0.1.0 delegate runtime on its path."""
    if not version("executorch").startswith("1.4."):
        # The wheel replaces ExecuTorch 1.4's _portable_lib; 1.5 renamed its runtime (_C), which it does not know.
        pytest.skip(f"the runtime wheel 0.1.0 pins executorch 1.4.1, this is {version('executorch')} (.ci/run runs "
                    "these tests on 1.4.1 too: constraints-cpu-et141.txt)")
    with zipfile.ZipFile(download_wheel(DELEGATE_RUNTIME)) as wheel:
        wheel.extractall(tmp_path / "site")
    code = (
        "import sys\n"
        "from prefect_executorch.errors import ToolchainMismatch\n"
        "from prefect_executorch.targets import get_target\n"
        + ("import executorch.extension.pybindings._portable_lib\n" if stock_runtime_first else "")
        + "try:\n    get_target('tensorrt').runtime_setup()\n"
        "except ToolchainMismatch as exc:\n    print('REFUSED', exc)\nelse:\n    print('ACTIVATED')\n"
    )
    env = {"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_the_real_runtime_wheel_is_activated_and_its_failure_explained(tmp_path: Path) -> None:
    # activate() exists in 0.1.0 (import alone registers nothing); it fails here for want of CUDA and TensorRT.
    out = _setup_with_real_runtime_wheel(tmp_path, stock_runtime_first=False)
    assert out.startswith("REFUSED torch-tensorrt-executorch-runtime is installed but cannot register TensorRTBackend")
    assert "DelegateCompatibilityError: Could not load the prebuilt Torch-TensorRT ExecuTorch runtime" in out
    # This torch is a CPU release: the fix is the release stack's install line, on its default channel.
    assert "torch-tensorrt-executorch-runtime>=0.1.0,<0.2" in out and "https://download.pytorch.org/whl/cu130" in out


def test_the_real_runtime_wheel_refuses_when_executorchs_runtime_came_first(tmp_path: Path) -> None:
    out = _setup_with_real_runtime_wheel(tmp_path, stock_runtime_first=True)
    assert "ExecuTorch's stock runtime was imported first" in out
