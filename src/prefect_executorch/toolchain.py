"""What this machine is: library versions, CUDA channel, GPUs, OS and architecture."""

from __future__ import annotations

import getpass
import importlib.metadata
import platform
import re
import shutil
import socket
import subprocess
import sys

from pydantic import BaseModel, Field

_CHANNEL_RE = re.compile(r"\+(cu\d+|cpu|rocm[\d.]+)")

#: Distributions that may provide TensorRT's Python package, in the order they are tried.
TENSORRT_DISTRIBUTIONS = ("tensorrt", "tensorrt-cu13", "tensorrt-cu13-bindings", "tensorrt-cu12")


def dist_version(name: str) -> str | None:
    """Installed version of a distribution, or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def channel_of(version: str | None) -> str | None:
    """The build channel in a version's local tag: ``2.14.0+cu132`` -> ``cu132``."""
    if not version:
        return None
    match = _CHANNEL_RE.search(version)
    return match.group(1) if match else None


def cuda_channel(cuda_version: str | None) -> str | None:
    """``13.0`` -> ``cu130``; ``12.8`` -> ``cu128``."""
    if not cuda_version:
        return None
    major, _, minor = cuda_version.partition(".")
    return f"cu{major}{minor.split('.')[0] or '0'}"


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
    cuda_available: bool = False
    cuda_version: str | None = Field(None, description="CUDA version torch was built with (torch.version.cuda).")
    cuda_channel: str | None = Field(None, description="'cu130', 'cu132'... or None for a CPU build.")
    gpus: list[GpuInfo] = Field(default_factory=list)
    nvcc: str | None = Field(None, description="Path of nvcc, needed by the CUDA backend.")
    nvcc_version: str | None = None
    hostname: str = ""
    user: str = ""

    @property
    def sm(self) -> str | None:
        """SM of the first GPU, or None."""
        return self.gpus[0].sm if self.gpus else None

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


def _nvcc_version(path: str) -> str | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def probe() -> Toolchain:
    """Probe this process's environment (imports torch; never imports TensorRT)."""
    import torch

    gpus: list[GpuInfo] = []
    cuda_available = torch.cuda.is_available()
    if cuda_available:
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append(
                GpuInfo(
                    index=index,
                    name=props.name,
                    sm=f"sm{props.major}{props.minor}",
                    total_memory_mib=props.total_memory // 2**20,
                )
            )
    nvcc = shutil.which("nvcc")
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = ""
    return Toolchain(
        python=platform.python_version(),
        os=platform.system(),
        arch=platform.machine(),
        torch=torch.__version__,
        executorch=dist_version("executorch"),
        torch_tensorrt=dist_version("torch-tensorrt") or dist_version("torch_tensorrt"),
        tensorrt=next(filter(None, map(dist_version, TENSORRT_DISTRIBUTIONS)), None),
        tensorrt_executorch_runtime=dist_version("torch-tensorrt-executorch-runtime"),
        cuda_available=cuda_available,
        cuda_version=torch.version.cuda,
        cuda_channel=channel_of(torch.__version__) if "+cu" in torch.__version__ else cuda_channel(torch.version.cuda),
        gpus=gpus,
        nvcc=nvcc,
        nvcc_version=_nvcc_version(nvcc) if nvcc else None,
        hostname=socket.gethostname(),
        user=user,
    )


if __name__ == "__main__":  # used on GPU hosts that lack the package's dependencies
    print(probe().model_dump_json(indent=2))
    sys.exit(0)
