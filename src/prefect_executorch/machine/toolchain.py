"""What this machine is: library versions, CUDA channel, GPUs, OS and architecture."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from prefect_executorch.machine.hostprobe import channel_of, cuda_channel, gather, torch_tensorrt_api_facts

if TYPE_CHECKING:
    from prefect_executorch.isolation import StartMethod


def channel_cuda_major(channel: str | None) -> int | None:
    """``cu132`` -> 13, ``cu128`` -> 12 (the last digit is the minor version)."""
    if not channel or not channel.startswith("cu") or not channel[2:].isdigit() or len(channel) < 4:
        return None
    return int(channel[2:-1])


class TorchTensorRTApi(BaseModel):
    """What the installed torch-tensorrt accepts, read from its source (importing it needs TensorRT)."""

    version: str | None = Field(None, description="torch_tensorrt._version.__version__.")
    cuda_version: str | None = Field(None, description="CUDA it was built for (__cuda_version__), e.g. '13.2'.")
    tensorrt_version: str | None = Field(None, description="TensorRT it was built against, e.g. '11.1.0'.")
    save_keywords: list[str] = Field(default_factory=list, description="Keywords torch_tensorrt.save takes for ExecuTorch output.")
    compile_keywords: list[str] = Field(default_factory=list, description="Keywords torch_tensorrt.dynamo.compile reads.")
    export_keywords: list[str] = Field(
        default_factory=list, description="Keywords torch_tensorrt.executorch.export takes (the several-methods path)."
    )

    @property
    def cuda_channel(self) -> str | None:
        """``cu132`` for a build against CUDA 13.2."""
        return cuda_channel(self.cuda_version)


def read_torch_tensorrt_api(sources: Any) -> TorchTensorRTApi:
    """The torch-tensorrt API facts the checks need, from its source files (an ``apisource.Sources``)."""
    return TorchTensorRTApi.model_validate(torch_tensorrt_api_facts(sources))


class GpuInfo(BaseModel):
    """One visible CUDA device."""

    index: int
    name: str
    sm: str = Field(description="Compute capability as 'sm90', 'sm100'...")
    total_memory_mib: int


class Toolchain(BaseModel):
    """Facts about the worker that decide what it can build and run."""

    python: str
    os: str = Field(description="platform.system(), e.g. 'Linux'.")
    arch: str = Field(description="platform.machine(), e.g. 'x86_64', 'aarch64'.")
    torch: str
    executorch: str | None = None
    torch_tensorrt: str | None = None
    tensorrt: str | None = None
    tensorrt_executorch_runtime: str | None = None
    modelopt: str | None = Field(None, description="nvidia-modelopt version (the TensorRT int8/fp8 schemes need it).")
    cuda_available: bool = False
    cuda_error: str | None = Field(None, description="Why CUDA did not start where NVML sees a GPU (None: it started, "
                                   "or no GPU is visible).")
    cuda_version: str | None = Field(None, description="CUDA version torch was built with (torch.version.cuda).")
    cuda_channel: str | None = Field(None, description="'cu130', 'cu132'... or None for a CPU build.")
    gpus: list[GpuInfo] = Field(default_factory=list)
    nvcc: str | None = Field(None, description="Path of nvcc, needed by the CUDA backend.")
    nvcc_version: str | None = None
    torch_tensorrt_api: TorchTensorRTApi | None = Field(None, description="What the installed torch-tensorrt accepts.")
    executorch_cuda: bool | None = Field(None, description="Whether ExecuTorch is a CUDA build (None: not installed).")
    triton: str | None = Field(None, description="triton version ('unknown' if only its module was found); the CUDA "
                               "backend imports it at export.")
    driver_version: str | None = Field(None, description="NVIDIA driver version, e.g. '580.95.05'.")
    runtime_backends: list[str] | None = Field(
        None, description="Delegates the ExecuTorch runtime this worker loads programs with has registered (the "
        "runtime wheel's when installed); None where ExecuTorch is absent or its runtime did not load.")
    capabilities: dict[str, bool] = Field(
        default_factory=dict, description="Delegate features this torch-tensorrt offers: cuda_graphs (save), "
        "cuda_graphs_several_methods (executorch.export), shared_engines.")
    hostname: str = ""
    user: str = ""

    @property
    def sm(self) -> str | None:
        """SM of the first GPU, or None."""
        return self.gpus[0].sm if self.gpus else None

    @property
    def torch_tensorrt_channel(self) -> str | None:
        """torch-tensorrt's CUDA channel: its ``+cu…`` label, else the CUDA version in its source."""
        label = channel_of(self.torch_tensorrt)
        if label is not None:
            return label
        return self.torch_tensorrt_api.cuda_channel if self.torch_tensorrt_api else None

    def versions(self) -> dict[str, str | None]:
        """The library versions that decide a build's output (for cache keys and manifests)."""
        return {
            "torch": self.torch,
            "executorch": self.executorch,
            "torch_tensorrt": self.torch_tensorrt,
            "tensorrt": self.tensorrt,
            "tensorrt_executorch_runtime": self.tensorrt_executorch_runtime,
            "cuda": self.cuda_version,
        }


def probe() -> Toolchain:
    """Probe this process's environment (imports torch; never imports TensorRT)."""
    return Toolchain.model_validate(gather())


class ProbeRequest(BaseModel):
    """The probe needs no input: it looks at the process it runs in."""


def probe_in_child(request: dict[str, Any]) -> Toolchain:
    """The ``probe`` command of an isolated child (``isolation.COMMANDS``)."""
    return probe()


def probe_isolated(timeout_s: float = 300, start: StartMethod | None = None) -> Toolchain:
    """``probe()`` in a child forked from the export server, which has imported torch already.

    A flow's own process then never imports torch: it neither competes with that server's imports
    on a small machine nor pays torch's teardown at exit (about 1.5 s together on 2 cores). ``start``
    overrides how the child starts (``run_isolated``).
    """
    import tempfile
    from pathlib import Path

    from prefect_executorch.isolation import run_isolated

    return run_isolated("probe", ProbeRequest(), Toolchain, timeout_s=timeout_s,
                        scratch_dir=Path(tempfile.gettempdir()), what="toolchain probe", start=start)


if __name__ == "__main__":  # on hosts with pydantic; `python -m prefect_executorch.machine.hostprobe` needs only torch
    print(probe().model_dump_json(indent=2))
    sys.exit(0)
