"""What a CUDA GPU proves without TensorRT: the probe, CUDA children under the isolation bounds, eager on CUDA
with TF32 off, synchronised latency, the GPU slot, routing, and CUDA inputs up to the delegate runtime.

Runs on any NVIDIA GPU worker (``python -m pytest -m "cuda or tensorrt" -ra``); elsewhere every test is
skipped with the probe's reason. The record of a run on an H200 is in records/gpu/ (records/README.md).
"""

from __future__ import annotations

import socket
import statistics
from pathlib import Path
from typing import Any

import pytest

from prefect_executorch.isolation import MemoryLimit, run_isolated
from prefect_executorch.machine.toolchain import ProbeRequest, Toolchain, probe
from prefect_executorch.spec.buildspec import BuildSpec, parse_spec
from prefect_executorch.targets import get_target
from prefect_executorch.targets.gpu import configure_eager_cuda

from helpers import MODELS

pytestmark = pytest.mark.cuda
TARGET = get_target("tensorrt")


@pytest.fixture(scope="module")
def gpu() -> Toolchain:
    """This machine's probe; skips the module without a CUDA GPU."""
    found = probe()
    if not (found.cuda_available and found.gpus):
        pytest.skip(f"no CUDA GPU here (torch {found.torch}, cuda_available={found.cuda_available}); "
                    "run on an NVIDIA GPU worker")
    return found


def trt_spec(**target: Any) -> BuildSpec:
    return parse_spec({"name": "m", "version": "1", "model": f"{MODELS}:mlp", "target": {"kind": "tensorrt", **target},
                       "methods": {"forward": {"inputs": [{"name": "x", "shape": [4, 32]}]}}})


def probe_child(tmp_path: Path, bound: MemoryLimit | None) -> Toolchain:
    """The probe (which initialises CUDA) in an isolated child under ``bound``."""
    return run_isolated("probe", ProbeRequest(), Toolchain, timeout_s=300, scratch_dir=tmp_path, memory_limit=bound,
                        what="probe under a memory bound")


def test_the_probe_sees_this_gpu(gpu: Toolchain) -> None:
    import torch

    assert gpu.cuda_channel and gpu.cuda_channel.startswith("cu") and gpu.cuda_version == torch.version.cuda
    assert gpu.sm == f"sm{''.join(map(str, torch.cuda.get_device_capability(0)))}"
    assert gpu.gpus[0].name == torch.cuda.get_device_name(0) and gpu.gpus[0].total_memory_mib > 1024
    assert gpu.driver_version and gpu.driver_version.split(".")[0].isdigit()
    assert gpu.triton is not None  # torch's CUDA wheels bring triton: found by its module
    assert set(gpu.capabilities) == {"cuda_graphs", "cuda_graphs_several_methods", "shared_engines"}
    if gpu.torch_tensorrt is None:
        assert not any(gpu.capabilities.values())


@pytest.mark.parametrize("stage", ["export", "validate"])
def test_children_of_gpu_builds_start_cuda_under_their_bounds(gpu: Toolchain, stage: str, tmp_path: Path) -> None:
    bound = TARGET.memory_limit(stage, None if stage == "validate" else 65536)  # type: ignore[arg-type]
    assert bound is not None and bound.kind == "resident"
    child = probe_child(tmp_path, bound)
    assert child.cuda_available and [g.sm for g in child.gpus] == [g.sm for g in gpu.gpus]


def test_an_address_space_limit_would_stop_cuda(gpu: Toolchain, tmp_path: Path) -> None:
    # Why GPU children get no RLIMIT_AS: the CPU targets' 8 GiB bound leaves CUDA unable to start.
    child = probe_child(tmp_path, MemoryLimit(mib=8192, kind="address_space"))
    assert not child.cuda_available and child.gpus == []


def test_eager_reference_on_cuda_runs_without_tf32(gpu: Toolchain) -> None:
    import torch

    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(2048, 2048, dtype=torch.float64, generator=generator) for _ in range(2))
    reference = a @ b

    def relative_error() -> float:
        got = (a.float().cuda() @ b.float().cuda()).double().cpu()
        return float((got - reference).abs().max() / reference.abs().max())

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        with_tf32 = relative_error()
        configure_eager_cuda()
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        without = relative_error()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    assert without < 1e-5, without  # FP32 parity: what an FP32 engine (built with disable_tf32) is held to
    assert with_tf32 > 10 * without, (with_tf32, without)  # on Ampere and newer TF32 would be the reference's error


def test_latency_of_cuda_calls_is_synchronised(gpu: Toolchain) -> None:
    import time

    import torch

    from prefect_executorch.spec.validation import ValidationSpec
    from prefect_executorch.validate.validator import measure_latency

    a = torch.randn(8192, 8192, device="cuda")

    def matmul() -> Any:
        return a @ a

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    kernel_ms, launch_ms = [], []
    for _ in range(5):
        start.record()
        started = time.perf_counter()
        matmul()
        launch_ms.append((time.perf_counter() - started) * 1000)
        end.record()
        torch.cuda.synchronize()
        kernel_ms.append(start.elapsed_time(end))
    device_ms = statistics.median(kernel_ms)
    # What an unsynchronised timer sees: the launch returns long before the work is done.
    assert statistics.median(launch_ms) < 0.5 * device_ms, (launch_ms, kernel_ms)
    settings = ValidationSpec(latency_runs=3, latency_warmup=2, latency_max_s=3)
    timed = measure_latency("forward", "opt", matmul, matmul, [[8192, 8192]], settings, device="cuda")
    assert timed.synchronized and timed.eager_median_ms >= 0.8 * device_ms, (timed, device_ms)
    assert timed.program_median_ms >= 0.8 * device_ms


def test_one_engine_build_per_gpu_holds_this_gpu(gpu: Toolchain, request: pytest.FixtureRequest,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect import get_client
    from prefect.concurrency.sync import concurrency

    from prefect_executorch.fleet.gpu_slots import GPU_ENV, gpu_limit_name, gpu_slot

    request.getfixturevalue("prefect_harness")
    monkeypatch.delenv(GPU_ENV, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", str(gpu.gpus[-1].index))
    with gpu_slot(True) as held:
        assert held == gpu_limit_name(socket.gethostname(), gpu.gpus[-1].index)
        with get_client(sync_client=True) as client:
            limit = client.read_global_concurrency_limit_by_name(held)
        assert (limit.limit, limit.active_slots) == (1, 1)
        with pytest.raises(TimeoutError):
            with concurrency(held, occupy=1, timeout_seconds=2, strict=True):
                pass  # a second engine build on this GPU would start here


def test_the_worker_routes_by_the_probe_of_this_machine(gpu: Toolchain) -> None:
    from prefect_executorch.fleet.placement import route

    assert gpu.cuda_channel is not None and gpu.sm is not None
    spec = {"name": "m", "version": "1", "model": "x.py:f", "methods": {}, "target": "tensorrt"}
    mine = route({"spec": spec}, {"cuda_channel": gpu.cuda_channel}, f"gpu-{gpu.cuda_channel}", gpu.sm, gpu)
    assert mine.accepted, mine.reason
    other_channel = "cu134" if gpu.cuda_channel != "cu134" else "cu132"
    other_sm = "sm100" if gpu.sm != "sm100" else "sm90"
    refused = route({"spec": spec}, {"cuda_channel": other_channel}, f"gpu-{other_channel}", other_sm, gpu)
    assert not refused.accepted
    assert f"needs CUDA channel {other_channel}" in refused.reason and f"needs GPU arch {other_sm}" in refused.reason
    assert gpu.cuda_channel in refused.reason and gpu.sm in refused.reason


def test_device_resident_inputs_reach_the_delegate_runtime_on_cuda(gpu: Toolchain, tmp_path: Path) -> None:
    import torch

    from prefect_executorch.errors import PrefectExecutorchError, ToolchainMismatch
    from prefect_executorch.validate.validator import validate_program

    spec = trt_spec(device_resident_io={"inputs": True, "outputs": False})
    prepared = TARGET.prepare_input(torch.ones(4, 32), spec)
    assert prepared.is_cuda and prepared.device.index == 0
    assert TARGET.runtime_hints(spec, gpu)["wants_cuda_tensors"] is True
    if gpu.tensorrt_executorch_runtime is not None:
        # The runtime wheel registers TensorRTBackend here (its engines need TensorRT, which such a host may lack):
        # the validating child gets past the delegate's registration and stops at the program, which this test
        # does not make.
        with pytest.raises(PrefectExecutorchError) as failed:
            validate_program(spec, tmp_path, [], scratch_dir=tmp_path)
        assert "model.pte" in str(failed.value) and "install torch-tensorrt-executorch-runtime" not in str(failed.value)
        return
    # The validating child (bounded by resident memory) gets as far as registering the delegate, and says what is missing.
    with pytest.raises(ToolchainMismatch) as info:
        validate_program(spec, tmp_path, [], scratch_dir=tmp_path)
    message = str(info.value)
    assert "bundle needs TensorRTBackend: install torch-tensorrt-executorch-runtime" in message
    assert f"on channel {gpu.cuda_channel}" in message
