"""What this machine is, gathered with the standard library and torch alone.

GPU hosts may have torch and nothing else of ours (the H200 workers lack even pydantic), so this
module imports no third-party package but torch; ``python -m prefect_executorch.machine.hostprobe``
prints the facts as JSON, and ``toolchain.probe()`` validates the same facts into a Toolchain.
Never imports TensorRT or torch-tensorrt: what torch-tensorrt accepts is read from its source.
"""

from __future__ import annotations

import getpass
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

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


def local_cuda_channel() -> str | None:
    """The CUDA channel of this process's torch (``cu130``), or None for a CPU build."""
    import torch

    return channel_of(torch.__version__) if "+cu" in torch.__version__ else cuda_channel(torch.version.cuda)


def find_nvcc() -> str | None:
    """nvcc on PATH, else under $CUDA_HOME or $CUDA_PATH (where the CUDA backend's compile finds it)."""
    found = shutil.which("nvcc")
    if found:
        return found
    # The CUDA toolkit's variables, not our settings (and this module runs with torch alone, without pydantic).
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return None


def _nvcc_version(path: str) -> str | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def executorch_has_cuda(version: str | None) -> bool | None:
    """Whether the installed ExecuTorch is a CUDA build: its ``+cu…`` label, else CUDA libraries it ships."""
    if version is None:
        return None
    channel = channel_of(version)
    if channel is not None:
        return channel.startswith("cu")
    files = importlib.metadata.files("executorch") or []
    return any("cuda" in f.name.lower() and ".so" in f.name for f in files)


def driver_version() -> str | None:
    """The NVIDIA kernel driver's version (``580.95.05``), from /proc without running anything, else nvidia-smi."""
    try:
        match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)",
                          Path("/proc/driver/nvidia/version").read_text())
        if match:
            return match.group(1)
    except OSError:
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out[0].strip() if out else None


def triton_version() -> str | None:
    """triton's version if its module is importable: stable torch brings ``triton``, nightlies ``pytorch-triton``."""
    try:
        if importlib.util.find_spec("triton") is None:
            return None
    except (ImportError, ValueError):
        return None
    return dist_version("triton") or dist_version("pytorch-triton") or "unknown"


def stock_runtime() -> Any:
    """ExecuTorch's own runtime extension (its ``portable_lib`` wrapper would import all of executorch.exir)."""
    import torch  # noqa: F401 - loads libtorch, which the runtime extension links against

    try:
        from executorch.extension.pybindings import _portable_lib as extension
    except ImportError:  # ExecuTorch 1.5 renamed the extension to _C
        from executorch.extension.pybindings import _C as extension  # type: ignore[attr-defined,no-redef,unused-ignore]
    # Its quantized kernels (quantized embeddings: quantization.embeddings) come with the wheel's quantized-ops
    # library, which registers them in the runtime every extension of this process shares (the LLM runner's too).
    import executorch.kernels.quantized  # noqa: F401
    return extension


def runtime_backends() -> list[str] | None:
    """Delegates registered by the runtime validation would load programs with (imports it: a child's work).

    The runtime wheel's when it is installed: its ``activate()`` refuses once ExecuTorch's stock runtime
    is loaded, so that one is never imported beside it.
    """
    try:
        try:
            from torch_tensorrt_executorch_runtime import activate  # type: ignore[import-not-found]
        except ImportError:
            runtime = stock_runtime()
        else:
            runtime = activate()
        return sorted(runtime._get_registered_backend_names())
    except Exception:  # noqa: BLE001 - a runtime that cannot load registers nothing here; the targets say why
        return None


def tensorrt_capabilities(api: dict[str, Any] | None) -> dict[str, bool]:
    """Delegate features this torch-tensorrt build offers, as data for checks and manifests."""
    save = set(api["save_keywords"]) if api else set()
    export = set(api["export_keywords"]) if api else set()
    return {
        "cuda_graphs": "use_cuda_graphs" in save,
        "cuda_graphs_several_methods": "use_cuda_graphs" in export,
        # Shared engines have no keyword to read; the backend page ships them in the same builds as
        # use_cuda_graphs (newer than the 2026-10-06 nightly), so that is the evidence we have.
        "shared_engines": "use_cuda_graphs" in save,
    }


def torch_tensorrt_api_facts(sources: Any) -> dict[str, Any]:
    """What torch-tensorrt accepts, from ``sources`` (an ``apisource.Sources``): versions and keywords."""
    from prefect_executorch.machine.apisource import ApiNotFound

    def keywords(name: str) -> list[str]:
        try:
            return sorted(sources.params(sources.resolve(name)).keywords)
        except ApiNotFound:
            return []

    def constant(name: str) -> str | None:
        try:
            value = sources.constant(name)
        except ApiNotFound:
            return None
        return value if isinstance(value, str) else None

    return {
        "version": constant("torch_tensorrt._version.__version__"),
        "cuda_version": constant("torch_tensorrt._version.__cuda_version__"),
        "tensorrt_version": constant("torch_tensorrt._version.__tensorrt_version__"),
        "save_keywords": keywords("torch_tensorrt.save"),
        "compile_keywords": keywords("torch_tensorrt.dynamo.compile"),
        "export_keywords": keywords("torch_tensorrt.executorch.export"),
    }


def gather() -> dict[str, Any]:
    """The facts ``toolchain.Toolchain`` is made of, as plain JSON-able values (imports torch)."""
    import torch

    gpus = []
    cuda_error = None
    cuda_available = torch.cuda.is_available()
    if cuda_available:
        try:
            for index in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(index)
                gpus.append({"index": index, "name": props.name, "sm": f"sm{props.major}{props.minor}",
                             "total_memory_mib": props.total_memory // 2**20})
        except RuntimeError as exc:
            # NVML's check (our forkserver's children use it) sees a GPU that the CUDA runtime cannot start
            # (an address-space limit; a parent that initialised CUDA before it forked): not available here,
            # and why is kept, so that the refusal does not send the operator looking for a GPU that is there.
            cuda_available, gpus, cuda_error = False, [], str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    nvcc = find_nvcc()
    torch_tensorrt = dist_version("torch-tensorrt") or dist_version("torch_tensorrt")
    executorch = dist_version("executorch")
    api = None
    if torch_tensorrt:
        from prefect_executorch.machine.apisource import Sources

        api = torch_tensorrt_api_facts(Sources.installed("torch_tensorrt"))
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = ""
    return {
        "python": platform.python_version(),
        "os": platform.system(),
        "arch": platform.machine(),
        "torch": torch.__version__,
        "executorch": executorch,
        "torch_tensorrt": torch_tensorrt,
        "tensorrt": next(filter(None, map(dist_version, TENSORRT_DISTRIBUTIONS)), None),
        "tensorrt_executorch_runtime": dist_version("torch-tensorrt-executorch-runtime"),
        "modelopt": dist_version("nvidia-modelopt"),
        "cuda_available": cuda_available,
        "cuda_error": cuda_error,
        "cuda_version": torch.version.cuda,
        "cuda_channel": local_cuda_channel(),
        "gpus": gpus,
        "nvcc": nvcc,
        "nvcc_version": _nvcc_version(nvcc) if nvcc else None,
        "torch_tensorrt_api": api,
        "capabilities": tensorrt_capabilities(api),
        "executorch_cuda": executorch_has_cuda(executorch),
        "triton": triton_version(),
        "driver_version": driver_version() if cuda_available else None,
        "runtime_backends": runtime_backends() if executorch else None,
        "hostname": socket.gethostname(),
        "user": user,
    }


if __name__ == "__main__":
    print(json.dumps(gather(), indent=2))
