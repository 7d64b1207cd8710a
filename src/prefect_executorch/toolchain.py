"""What this machine is: library versions, CUDA channel, GPUs, OS and architecture."""

from __future__ import annotations

import getpass
import importlib.metadata
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel, Field

from prefect_executorch.apisource import ApiNotFound, Sources

_CHANNEL_RE = re.compile(r"\+(cu\d+|cpu|rocm[\d.]+)")
_RELEASE_RE = re.compile(r"^\s*v?(\d+(?:\.\d+)*)(?:\.?(a|b|rc|dev)(\d*))?")

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


def channel_cuda_major(channel: str | None) -> int | None:
    """``cu132`` -> 13, ``cu128`` -> 12 (the last digit is the minor version)."""
    if not channel or not channel.startswith("cu") or not channel[2:].isdigit() or len(channel) < 4:
        return None
    return int(channel[2:-1])


def version_key(version: str) -> tuple[tuple[int, ...], int, int]:
    """A sortable key for ``2.14.0``, ``2.15.0.dev20261007+cu132``, ``1.4.1rc2``: (release, stage, number).

    Pre-releases sort before their release, as in PEP 440; the local ``+cu…`` label is ignored.
    """
    match = _RELEASE_RE.match(version)
    if not match:
        return ((0,), 0, 0)
    release = tuple(int(p) for p in match.group(1).split("."))
    release = release + (0,) * (3 - len(release))
    stage = {"dev": 0, "a": 1, "b": 2, "rc": 3}.get(match.group(2) or "", 4)
    return (release, stage, int(match.group(3) or 0))


def minor_version(version: str | None) -> tuple[int, int] | None:
    """``2.14.0+cu130`` -> (2, 14)."""
    if not version:
        return None
    release = version_key(version)[0]
    return (release[0], release[1]) if release != (0, 0, 0) else None


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


def _keywords(sources: Sources, name: str) -> list[str]:
    try:
        return sorted(sources.params(sources.resolve(name)).keywords)
    except ApiNotFound:
        return []


def _constant(sources: Sources, name: str) -> str | None:
    try:
        value = sources.constant(name)
    except ApiNotFound:
        return None
    return value if isinstance(value, str) else None


def read_torch_tensorrt_api(sources: Sources) -> TorchTensorRTApi:
    """The torch-tensorrt API facts the checks need, from its source files."""
    return TorchTensorRTApi(
        version=_constant(sources, "torch_tensorrt._version.__version__"),
        cuda_version=_constant(sources, "torch_tensorrt._version.__cuda_version__"),
        tensorrt_version=_constant(sources, "torch_tensorrt._version.__tensorrt_version__"),
        save_keywords=_keywords(sources, "torch_tensorrt.save"),
        compile_keywords=_keywords(sources, "torch_tensorrt.dynamo.compile"),
        export_keywords=_keywords(sources, "torch_tensorrt.executorch.export"),
    )


def _executorch_has_cuda(version: str | None) -> bool | None:
    """Whether the installed ExecuTorch is a CUDA build: its ``+cu…`` label, else CUDA libraries it ships."""
    if version is None:
        return None
    channel = channel_of(version)
    if channel is not None:
        return channel.startswith("cu")
    files = importlib.metadata.files("executorch") or []
    return any("cuda" in f.name.lower() and ".so" in f.name for f in files)


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
    torch_tensorrt_api: TorchTensorRTApi | None = Field(None, description="What the installed torch-tensorrt accepts.")
    executorch_cuda: bool | None = Field(None, description="Whether ExecuTorch is a CUDA build (None: not installed).")
    triton: str | None = Field(None, description="triton version; the CUDA backend imports it at export.")
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


def _nvcc_version(path: str) -> str | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def find_nvcc() -> str | None:
    """nvcc on PATH, else under $CUDA_HOME or $CUDA_PATH (where the CUDA backend's compile finds it)."""
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return None


def local_cuda_channel() -> str | None:
    """The CUDA channel of this process's torch (``cu130``), or None for a CPU build."""
    import torch

    return channel_of(torch.__version__) if "+cu" in torch.__version__ else cuda_channel(torch.version.cuda)


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
    nvcc = find_nvcc()
    torch_tensorrt = dist_version("torch-tensorrt") or dist_version("torch_tensorrt")
    executorch = dist_version("executorch")
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = ""
    return Toolchain(
        python=platform.python_version(),
        os=platform.system(),
        arch=platform.machine(),
        torch=torch.__version__,
        executorch=executorch,
        torch_tensorrt=torch_tensorrt,
        tensorrt=next(filter(None, map(dist_version, TENSORRT_DISTRIBUTIONS)), None),
        tensorrt_executorch_runtime=dist_version("torch-tensorrt-executorch-runtime"),
        cuda_available=cuda_available,
        cuda_version=torch.version.cuda,
        cuda_channel=local_cuda_channel(),
        gpus=gpus,
        nvcc=nvcc,
        nvcc_version=_nvcc_version(nvcc) if nvcc else None,
        torch_tensorrt_api=read_torch_tensorrt_api(Sources.installed("torch_tensorrt")) if torch_tensorrt else None,
        executorch_cuda=_executorch_has_cuda(executorch),
        triton=dist_version("triton"),
        hostname=socket.gethostname(),
        user=user,
    )


if __name__ == "__main__":  # used on GPU hosts that lack the package's dependencies
    print(probe().model_dump_json(indent=2))
    sys.exit(0)
