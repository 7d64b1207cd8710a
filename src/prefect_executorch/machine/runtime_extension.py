"""ExecuTorch's runtime in this process, and what installs the delegates it lacks."""

from __future__ import annotations

from typing import Any

#: What registers each delegate that ExecuTorch's CPU wheel does not have built in.
BACKEND_PACKAGES = {
    "TensorRTBackend": "torch-tensorrt-executorch-runtime",
    "CudaBackend": "torch-tensorrt-executorch-runtime (prefect-executorch[cuda], docs/cuda.md) or an ExecuTorch built with "
                   "EXECUTORCH_BUILD_CUDA=ON",
}


def runtime_extension() -> Any:
    """ExecuTorch's runtime extension in this process (the runtime wheel's once a target activated it)."""
    from prefect_executorch.machine.hostprobe import stock_runtime

    return stock_runtime()


def backend_install_hint(backend: str, channel: str | None) -> str:
    """``bundle needs X: install Y on channel Z`` for a delegate this process has not registered."""
    package = BACKEND_PACKAGES.get(backend, "the package that registers it")
    where = (
        f"on channel {channel} (this machine's torch channel)"
        if channel else "on the CUDA 13 channel the bundle was built for (this machine's torch is a CPU build)"
    )
    hint = f"bundle needs {backend}: install {package} {where}"
    if backend == "TensorRTBackend":
        hint += " and import it before executorch's runtime"
    return hint
