"""What the GPU targets share: the platform they build on, how their children are bounded, the eager
reference on CUDA, and the ExecuTorch runtime that has their delegates."""

from __future__ import annotations

import ctypes
import importlib
from typing import TYPE_CHECKING, ClassVar, Literal

from prefect_executorch.errors import SpecError, ToolchainMismatch
from prefect_executorch.isolation import START_METHOD_ENV, MemoryLimit
from prefect_executorch.machine.toolchain import channel_cuda_major
from prefect_executorch.machine.versions import minor_version
from prefect_executorch.targets.base import Device, Target

if TYPE_CHECKING:
    from prefect_executorch.machine.toolchain import Toolchain
    from prefect_executorch.spec.buildspec import BuildSpec

#: A runtime wheel of ExecuTorch 1.4.1 with TensorRTBackend, CudaBackend and XnnpackBackend built in; a
#: separate distribution, not part of torch-tensorrt.
RUNTIME_PACKAGE = "torch-tensorrt-executorch-runtime"
RUNTIME_MODULE = "torch_tensorrt_executorch_runtime"
SUPPORTED_ARCHES = ("x86_64", "aarch64")
#: Resident-memory bounds of GPU children when the spec sets none (MiB; None: unbounded). Export
#: compiles (engines, kernels) and may need the host's memory; validation holds one program and the model.
GPU_MEMORY_DEFAULTS_MIB: dict[str, int | None] = {"export": None, "validate": 32768}


#: The spec's lower precisions (``target.precision``) and the torch dtype a GPU program computes in.
LOW_PRECISION = {"fp16": "float16", "bf16": "bfloat16"}
#: What ``precision: tf32`` computes in: float32 tensors whose matmuls and convolutions round their inputs to TF32
#: (validation's tolerances for it).
TF32 = "tfloat32"


class GpuTarget(Target):
    """What the GPU targets share: eager runs on CUDA, the program computes in ``target.precision``, and their
    children are bounded by resident memory."""

    device: ClassVar[Device] = "cuda"

    def precision(self, spec: BuildSpec) -> str:
        """The spec's ``target.precision`` (``fp32``, ``tf32``, ``fp16``, ``bf16``)."""
        if not isinstance(spec.target, self.options):
            raise SpecError(f"target: expected kind {self.name!r}, got {spec.target.kind!r}")
        return str(getattr(spec.target, "precision"))  # noqa: B009 - every GPU target's options have it

    def eager_device(self, spec: BuildSpec) -> str:
        return "cuda"

    def compute_dtype(self, spec: BuildSpec) -> str | None:
        precision = self.precision(spec)
        return TF32 if precision == "tf32" else LOW_PRECISION.get(precision)

    def memory_limit(self, stage: Literal["export", "validate"], requested_mib: int | None) -> MemoryLimit | None:
        return gpu_memory_limit(stage, requested_mib)


def gpu_memory_limit(stage: Literal["export", "validate"], requested_mib: int | None) -> MemoryLimit | None:
    """The bound of a GPU build's ``stage`` child: the spec's value, else the GPU default, on resident memory.

    CUDA reserves huge virtual ranges: an address-space limit (even 16 GiB) makes ``cudaGetDeviceCount``
    fail, so children that initialise CUDA are bounded by resident memory instead.
    """
    mib = requested_mib if requested_mib is not None else GPU_MEMORY_DEFAULTS_MIB[stage]
    return MemoryLimit(mib=mib, kind="resident") if mib is not None else None


def platform_problems(toolchain: Toolchain, install: str, target: str) -> list[str]:
    """What keeps this machine from building any GPU target: OS/arch, a CPU or CUDA 12 torch, no GPU."""
    problems = []
    if toolchain.os != "Linux" or toolchain.arch not in SUPPORTED_ARCHES:
        problems.append(f"target {target!r} runs on Linux x86_64 or aarch64; this worker is {toolchain.os} {toolchain.arch}")
    major = channel_cuda_major(toolchain.cuda_channel)
    if toolchain.cuda_version is None:
        problems.append(f"torch {toolchain.torch} is a CPU build; install its CUDA 13 build with: {install}")
    elif major is not None and major < 13:
        problems.append(
            f"torch {toolchain.torch} is a CUDA {toolchain.cuda_version} build ({toolchain.cuda_channel}); CUDA 12 "
            f"is not supported (the delegate runtimes link CUDA 13); install a CUDA 13 channel with: {install}"
        )
    if toolchain.cuda_error is not None:
        problems.append(cuda_start_problem(toolchain.cuda_error))
    elif not toolchain.cuda_available or not toolchain.gpus:
        problems.append("no NVIDIA GPU is visible to torch (torch.cuda.is_available() is False); run on a GPU worker")
    return problems


def cuda_start_problem(error: str) -> str:
    """The refusal where NVML sees a GPU that CUDA did not start in the probe's process (``Toolchain.cuda_error``)."""
    said = f"an NVIDIA GPU is visible (NVML) but CUDA did not start in this worker's probe: {error}"
    if "forked subprocess" in error:
        # The process that forked the probe had initialised CUDA: our defect, not the worker's (the forkserver
        # must not; forkserver_warm says why), and the way round it is the spawn start method.
        return (f"{said}; the process that started it had initialised CUDA before forking, a prefect-executorch "
                f"defect: report it with the --debug output, and meanwhile set {START_METHOD_ENV}=spawn")
    return f"{said}; a memory limit on the probe (address space) or the driver (`nvidia-smi` says which)"


def cuda_backend_problems(toolchain: Toolchain, field: str, alternative: str) -> list[str]:
    """What ExecuTorch's CUDA backend needs at export: nvcc (Inductor packs every kernel with the toolkit) and triton.

    ``field`` names the spec field that asked for the backend, ``alternative`` what to do instead.
    """
    problems = []
    nvcc_minor = minor_version(toolchain.nvcc_version)
    if toolchain.nvcc is None:
        problems.append(
            f"{field}: ExecuTorch's CUDA backend packs each compiled kernel (SASS and PTX) with the CUDA toolkit's "
            f"nvcc/fatbinary at export time, and nvcc is not on PATH (nor in $CUDA_HOME/bin); install the CUDA 13 "
            f"toolkit or {alternative}"
        )
    elif nvcc_minor is not None and nvcc_minor[0] != 13:
        problems.append(f"{field}: nvcc {toolchain.nvcc_version} at {toolchain.nvcc} is not CUDA 13; put a CUDA 13 "
                        "toolkit's nvcc first on PATH")
    if toolchain.triton is None:
        problems.append(f"{field}: the CUDA backend imports triton, which is not installed (torch's CUDA wheels bring "
                        "it): install torch from its CUDA channel")
    return problems


def configure_eager_cuda() -> None:
    """Turn TF32 off for eager CUDA: FP32 programs are built without it, so the reference must match."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


#: ``CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`` of the CUDA driver API (``CUmemPool_attribute``).
_RELEASE_THRESHOLD = 4
KEEP_ALL = 2**64 - 1


def set_cuda_pool_release_threshold(threshold: int = KEEP_ALL, device: int = 0) -> None:
    """Let the device's default memory pool keep up to ``threshold`` bytes across synchronisations.

    CudaBackend allocates every input, output and intermediate with ``cudaMallocAsync`` from that pool
    and synchronises each call; at the driver's default threshold (0) each synchronisation hands the
    memory back to the OS and the next call maps it again. Keeping it (``KEEP_ALL``) is what a serving
    process wants; the memory stays the program's peak, which the pool reuses.
    """
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise ToolchainMismatch(f"CUDA programs run on an NVIDIA GPU with its driver; this machine has no driver "
                                f"library ({exc}): run it on a GPU worker") from None
    handle, pool, value = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64(threshold)
    for call, args in (("cuInit", (0,)), ("cuDeviceGet", (ctypes.byref(handle), device)),
                       ("cuDeviceGetDefaultMemPool", (ctypes.byref(pool), handle)),
                       ("cuMemPoolSetAttribute", (pool, _RELEASE_THRESHOLD, ctypes.byref(value)))):
        status = getattr(driver, call)(*args)
        if status != 0:
            raise RuntimeError(f"{call} failed with CUDA driver error {status}")


def activate_runtime_wheel(backend: str, required: bool, hint: str, fix: str) -> bool:
    """Put the runtime wheel's ExecuTorch runtime in this process, before anything loads the stock one.

    The 0.1.0 wheel registers nothing on import: its ``activate()`` swaps in a runtime with the
    delegates built in, and refuses if ExecuTorch's stock runtime was imported first. Returns whether
    the wheel is installed; without it, ``required`` raises ``ToolchainMismatch`` with ``hint``, else
    the stock runtime (a CUDA build of ExecuTorch) is left to serve ``backend``. ``fix`` is the install line.
    """
    try:
        module = importlib.import_module(RUNTIME_MODULE)
    except ImportError as exc:
        if required:
            raise ToolchainMismatch(f"{hint} ({exc})") from None
        return False
    activate = getattr(module, "activate", None)
    if callable(activate):
        try:
            activate()
        except ImportError as exc:  # the wheel's DelegateCompatibilityError is an ImportError
            raise ToolchainMismatch(
                f"{RUNTIME_PACKAGE} is installed but cannot register {backend} ({type(exc).__name__}: {exc}); "
                f"torch, executorch, torch-tensorrt and the runtime must come from one channel: {fix}"
            ) from None
    return True


def cannot_build(target: str, problems: list[str], install: str) -> ToolchainMismatch:
    """One refusal listing every problem; the install line is written out once, the later problems point at it."""
    first = next((i for i, problem in enumerate(problems) if install in problem), len(problems))
    said = [problem if i <= first else problem.replace(install, "the pip line above") for i, problem in enumerate(problems)]
    return ToolchainMismatch(f"this worker cannot build target {target} ({len(problems)} problems):\n  - " + "\n  - ".join(said))
