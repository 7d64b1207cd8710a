"""NVIDIA GPU target: ExecuTorch's CUDA backend. AOTInductor compiles each method into a shared library of
Triton kernels, which the ``.pte`` carries; its weights go to ``aoti_cuda_blob.ptd`` beside it.

The compile specs are built as data (``compile_specs``) so that tests check them against the
backend's source without a GPU; only ``lower`` and ``runtime_setup`` import the backend, on a GPU worker.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_executorch.errors import ExportFailed, SpecError, ToolchainMismatch
from prefect_executorch.machine.compat import cuda_compat
from prefect_executorch.spec.kinds import FixedShapes, replayable_methods
from prefect_executorch.spec.options import CudaOptions
from prefect_executorch.spec.schemes import check_scheme
from prefect_executorch.targets.base import PROGRAM_FILE, Lowered
from prefect_executorch.targets.gpu import (
    LOW_PRECISION,
    RUNTIME_PACKAGE,
    GpuTarget,
    activate_runtime_wheel,
    cannot_build,
    configure_eager_cuda,
    cuda_backend_problems,
    platform_problems,
    set_cuda_pool_release_threshold,
)

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from prefect_executorch.machine.toolchain import Toolchain
    from prefect_executorch.spec.buildspec import BuildSpec

BACKEND = "CudaBackend"
#: The name the backend gives its external data (``aoti_<device>_blob``): every export needs a fresh directory.
DATA_FILE = "aoti_cuda_blob.ptd"
INSTALL = ('pip install "prefect-executorch[cuda]" --extra-index-url https://download.pytorch.org/whl/cu130 '
           "--extra-index-url https://pypi.nvidia.com (torch 2.14 cu130, ExecuTorch 1.4.1 and the runtime wheel with "
           "CudaBackend; docs/cuda.md)")


def _options(spec: BuildSpec) -> CudaOptions:
    if not isinstance(spec.target, CudaOptions):
        raise SpecError(f"target: expected kind 'cuda', got {spec.target.kind!r}")
    return spec.target


#: Inductor settings CudaBackend sets itself for every compile (``get_aoti_compile_options``): a spec cannot change them.
BACKEND_OWNED_INDUCTOR = {"max_autotune", "max_autotune_gemm_backends", "max_autotune_conv_backends",
                          "emulate_precision_casts", "loop_ordering_after_fusion", "triton.autotune_at_compile_time",
                          "triton.autotune_pointwise"}
#: What the backend's runtime names the methods it captures and replays (a comma-separated runtime option).
CUDA_GRAPH_OPTION = "enable_cuda_graph_for_method"
#: ``target.cuda_graphs``: a captured graph replays fixed sizes only (the runtime refuses an input of another size).
_GRAPH_REPLAY = FixedShapes("target.cuda_graphs", "a CUDA graph replays the sizes it captured")


def inductor_problems(settings: dict[str, Any]) -> list[str]:
    """What is wrong with ``target.inductor``: settings the backend owns, and names this torch's Inductor lacks."""
    import torch
    from torch._inductor import config

    known = set(config.get_config_copy())
    problems = []
    for key in settings:
        if key in BACKEND_OWNED_INDUCTOR or key.startswith("aot_inductor."):
            problems.append(f"target.inductor.{key}: ExecuTorch's CUDA backend sets this itself for every compile")
        elif key not in known:
            problems.append(f"target.inductor.{key}: torch {torch.__version__}'s Inductor has no such "
                            "setting (names as in torch._inductor.config, e.g. coordinate_descent_tuning)")
    return problems


def graph_methods(spec: BuildSpec) -> list[str]:
    """The methods the runtime captures as CUDA graphs: those the model kind replays, when ``target.cuda_graphs``
    is on."""
    return replayable_methods(spec) if _options(spec).cuda_graphs else []


def _on_off(flag: bool) -> str:
    return "ON" if flag else "OFF"


def compile_specs(options: CudaOptions, method: str, triton: bool) -> list[tuple[str, str]]:
    """``CudaBackend`` compile specs of one method as (key, value): its name, then the options it reads."""
    # max_autotune stays the backend's ON: without it Inductor calls cuBLAS through shims the backend lacks
    # (aoti_torch_cuda_mm_out, _addmm_out: "missing fallback kernels", seen on the H200), so every matmul fails.
    specs = [("method_name", method), ("triton_kernel_mode", _on_off(triton))]
    if options.low_memory:
        specs.append(("low_memory_mode", "ON"))
    return specs


def attention_dtypes(program: ExportedProgram) -> set[str]:
    """The query dtypes of every scaled-dot-product attention in ``program`` (``float32``, ``bfloat16``)."""
    found = set()
    for node in program.graph_module.graph.nodes:
        if node.op == "call_function" and "scaled_dot_product" in str(node.target):
            value = node.args[0].meta.get("val")
            found.add(str(getattr(value, "dtype", "unknown")).removeprefix("torch."))
    return found


def triton_choice(options: CudaOptions, method: str, program: ExportedProgram) -> tuple[bool, str | None]:
    """Whether ``method`` uses ExecuTorch's Triton kernels, and a note when ``auto`` turned them off.

    The backend's Triton attention kernel takes bfloat16 only ("Expected bfloat16 inputs" at export);
    without the Triton kernels, attention compiles through Inductor's math path, in any type.
    """
    other = sorted(attention_dtypes(program) - {"bfloat16"})
    if options.triton_kernels == "off":
        return False, None
    if not other:
        return True, None
    if options.triton_kernels == "on":
        raise ExportFailed(
            f"method {method!r}: attention runs in {', '.join(other)} and ExecuTorch's Triton attention kernel takes "
            "bfloat16 only; set target.precision: bf16, or target.triton_kernels: auto (attention then compiles "
            "through Inductor's math path)"
        )
    return False, (f"method {method!r}: attention in {', '.join(other)}: ExecuTorch's Triton attention kernel takes "
                   "bfloat16 only, so this method compiles without the backend's Triton kernels (Inductor's math "
                   "attention); target.precision: bf16 would use them")


def _split_as_slices(tensor: torch.Tensor, sizes: list[int], dim: int) -> list[torch.Tensor]:
    import torch

    return [torch.ops.aten.slice.Tensor(tensor, dim, end - size, end)
            for end, size in zip(accumulate(sizes), sizes, strict=True)]


def _split(tensor: torch.Tensor, split_size: int, dim: int = 0) -> Any:
    length = tensor.shape[dim]
    if not isinstance(length, int):  # a dynamic dim: the number of pieces is the graph's, not known here
        return NotImplemented
    return _split_as_slices(tensor, [min(split_size, length - start) for start in range(0, length, split_size)], dim)


def _split_with_sizes(tensor: torch.Tensor, split_sizes: list[int], dim: int = 0) -> list[torch.Tensor]:
    return _split_as_slices(tensor, list(split_sizes), dim)


def _chunk(tensor: torch.Tensor, chunks: int, dim: int = 0) -> Any:
    length = tensor.shape[dim]
    if not isinstance(length, int):
        return NotImplemented
    return _split(tensor, -(-length // chunks), dim)  # torch.chunk's pieces: ceil(length / chunks) each, the last less


def splits_as_slices(program: ExportedProgram) -> ExportedProgram:
    """``program`` with its splits (``chunk`` in a model's code) as slices of their input.

    The CUDA backend has no kernel for the ``split_copy`` that the edge dialect makes of a split (ExecuTorch
    1.4.1: "missing fallback kernels: aten::split_copy.Tensor", seen on Moonshine's gated MLP); slices are
    views Inductor compiles. A strict export keeps ``chunk`` itself, which the edge dialect makes a split too. Only
    these operators are decomposed; a program without them is returned as is.
    """
    import torch

    table = {torch.ops.aten.split.Tensor: _split, torch.ops.aten.split_with_sizes.default: _split_with_sizes,
             torch.ops.aten.chunk.default: _chunk}
    if not any(node.op == "call_function" and node.target in table for node in program.graph_module.graph.nodes):
        return program
    return program.run_decompositions(table)


def in_precision(inner: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``inner`` computing in ``dtype`` behind float32 inputs and outputs (the spec's interface stays)."""
    import torch
    from torch.utils._pytree import tree_map_only

    class InPrecision(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner.to(dtype)

        def forward(self, *args: Any) -> Any:
            cast = tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
            return tree_map_only(torch.Tensor, lambda t: t.float() if t.is_floating_point() else t, self.inner(*cast))

    return InPrecision()


@contextmanager
def tf32_kernels(on: bool) -> Iterator[None]:
    """While ``on`` (``precision: tf32``), Inductor compiles float32 matmuls and convolutions for TF32 tensor cores.

    Inductor's templates read ``torch.backends.cuda.matmul.fp32_precision`` and ``torch.backends.cudnn.fp32_precision``
    for their ``ALLOW_TF32``, and take TF32 only for GEMMs of at least 16 rows whose other two sizes are at least 512.
    The matmul setting is made through the legacy ``allow_tf32`` flag, which sets ``fp32_precision`` with it: set
    through the new API, every later read of the legacy flag in this process (cuBLAS's eager calls) would raise
    ("mix of the legacy and new APIs"). The settings are the process's: restored after the compile.
    """
    if not on:
        yield
        return
    import torch

    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = matmul.allow_tf32, cudnn.fp32_precision
    try:
        matmul.allow_tf32 = True
        cudnn.fp32_precision = "tf32"
        yield
    finally:
        matmul.allow_tf32, cudnn.fp32_precision = saved


def for_precision(module: torch.nn.Module, dynamic_shapes: Any, precision: str) -> tuple[torch.nn.Module, Any]:
    """The module to export for ``precision``, and the dynamic shapes that fit its ``forward``."""
    import torch

    dtype = LOW_PRECISION.get(precision)
    if dtype is None:
        return module, dynamic_shapes
    # The wrapper's forward takes ``*args``: torch.export matches dynamic shapes to that one tuple.
    return in_precision(module, getattr(torch, dtype)), None if dynamic_shapes is None else (dynamic_shapes,)


def _toolchain_problems(toolchain: Toolchain) -> list[str]:
    problems = platform_problems(toolchain, INSTALL, "cuda")
    if toolchain.executorch is None:
        problems.append(f"executorch is not installed; install it with: {INSTALL}")
    if toolchain.runtime_backends is not None and BACKEND not in toolchain.runtime_backends:
        problems.append(
            f"this worker's ExecuTorch runtime has no {BACKEND} (it registers {', '.join(toolchain.runtime_backends) or 'none'}), "
            f"so the program could not be validated here; install the runtime wheel with: {INSTALL}, or use an ExecuTorch "
            "built with EXECUTORCH_BUILD_CUDA=ON"
        )
    return problems + cuda_backend_problems(toolchain, "target cuda", "build target xnnpack on this worker")


class CudaTarget(GpuTarget):
    """ExecuTorch's CUDA backend: every method compiled by AOTInductor (Triton kernels), weights in the ``.ptd``."""

    name = "cuda"
    options = CudaOptions
    # ExecuTorch 1.4.1's CudaBackend writes each program's kernel library to /tmp/<sha256>_so_blob<pid>.so and
    # loads it from there: a second program with the same kernels (a rebuild, new weights) rewrites the library
    # the first has loaded. Two such programs in one side-by-side child died of SIGSEGV on the H200.
    one_program_per_process = True
    # Its programs run in the runtime wheel that registers CudaBackend (no LLM runner: a decoder LM is driven here).
    runs_in_executorch_runtime = False

    def check(self, spec: BuildSpec, toolchain: Toolchain) -> list[str]:
        check_scheme(spec, self.name)
        _options(spec)
        problems = _toolchain_problems(toolchain)
        if problems:
            raise cannot_build("cuda", problems, INSTALL)
        if _options(spec).inductor and (wrong := inductor_problems(_options(spec).inductor)):
            raise SpecError("; ".join(wrong))
        if spec.external_weights:
            return ["external_weights: the CUDA backend always writes the weights to aoti_cuda_blob.ptd; the setting "
                    "changes nothing for target cuda"]
        return []

    def compat(self, spec: BuildSpec, toolchain: Toolchain) -> str:
        # The kernels are SASS and PTX for the exporting GPU's arch-specific target (sm_90a on an H100/H200:
        # docs/cuda.md), which no other arch runs: the key names that SM exactly, and no TensorRT.
        try:
            return cuda_compat(toolchain.cuda_channel, toolchain.sm, toolchain.arch)
        except SpecError as exc:
            raise ToolchainMismatch(f"the compat key of a CUDA bundle cannot be built on this worker: {exc}") from None

    def export_method(
        self, module: torch.nn.Module, args: tuple[Any, ...], dynamic_shapes: Any, spec: BuildSpec
    ) -> ExportedProgram:
        module, dynamic_shapes = for_precision(module, dynamic_shapes, _options(spec).precision)
        # Inductor compiles for the device the program was exported on.
        return super().export_method(module.to("cuda"), tuple(a.to("cuda") for a in args), dynamic_shapes, spec)

    def fixed_shapes(self, spec: BuildSpec) -> FixedShapes | None:
        return _GRAPH_REPLAY if _options(spec).cuda_graphs else None

    def placed_model(self, model: torch.nn.Module, spec: BuildSpec) -> torch.nn.Module:
        import torch

        # The whole model in the program's type, its static KV cache included (made in the model's dtype).
        dtype = LOW_PRECISION.get(_options(spec).precision)
        return model.to(device="cuda", dtype=getattr(torch, dtype) if dtype else torch.float32)

    def lower(self, programs: dict[str, ExportedProgram], spec: BuildSpec, out_dir: Path,
              constant_methods: dict[str, Any] | None = None) -> Lowered:
        from executorch.backends.cuda.cuda_backend import CudaBackend
        from executorch.backends.cuda.cuda_partitioner import CudaPartitioner
        from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
        from executorch.exir.backend.compile_spec_schema import CompileSpec
        from executorch.exir.passes import MemoryPlanningPass
        from torch._inductor import config as inductor_config

        from prefect_executorch.targets.delegation import delegation_facts

        options = _options(spec)
        partitioners, notes = {}, []
        for name, program in programs.items():
            triton, note = triton_choice(options, name, program)
            notes += [note] if note else []
            method_spec, *rest = compile_specs(options, name, triton)
            partitioners[name] = [CudaPartitioner([CudaBackend.generate_method_name_compile_spec(method_spec[1]),
                                                   *(CompileSpec(key, value.encode()) for key, value in rest)])]
        # As the backend's own exports do: its partitioner keeps every ATen op for Inductor (no IR check),
        # delegate blobs go to segments, and inputs stay unplanned (the backend copies them to the device).
        # The spec's Inductor settings hold for the whole compile; the backend's own options still win over them.
        with inductor_config.patch(options.inductor), tf32_kernels(options.precision == "tf32"):
            edge = to_edge_transform_and_lower(
                {name: splits_as_slices(program) for name, program in programs.items()}, partitioner=partitioners,
                compile_config=EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True),
                constant_methods=constant_methods,
            )
        delegation = delegation_facts(edge)
        program = edge.to_executorch(ExecutorchBackendConfig(
            extract_delegate_segments=True, do_quant_fusion_and_const_prop=True,
            memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False),
        ))
        with open(out_dir / PROGRAM_FILE, "wb") as file:
            program.write_to_file(file)
        program.write_tensor_data_to_file(str(out_dir))
        return Lowered(delegation=delegation, notes=notes)

    def runtime_setup(self, hints: Mapping[str, Any] | None = None) -> None:
        configure_eager_cuda()
        # The runtime wheel's runtime has CudaBackend; without the wheel, ExecuTorch's own runtime must be a
        # CUDA build, and LoadedProgram names what to install when it is not.
        activate_runtime_wheel(BACKEND, False, "", INSTALL)
        set_cuda_pool_release_threshold()
        methods = list((hints or {}).get("cuda_graph_methods") or [])
        if methods:
            from prefect_executorch.machine.backend_options import set_backend_options
            from prefect_executorch.machine.runtime_extension import runtime_extension

            # Read when a method loads: set before any program of this process is loaded.
            set_backend_options(runtime_extension(), BACKEND, {CUDA_GRAPH_OPTION: ",".join(methods)})

    def runtime_hints(self, spec: BuildSpec, toolchain: Toolchain | None = None) -> dict[str, Any]:
        options = _options(spec)
        return {
            # The Python runtime's boundary is the host: inputs are copied to the GPU, outputs back.
            "input_device": "cpu",
            "output_device": "cpu",
            # CudaBackend allocates from the default CUDA memory pool each call: a pool that keeps its memory
            # across synchronisations (what validation timed) avoids mapping it again every call.
            "cuda_mempool_release_threshold": "max",
            "backend": BACKEND,
            "data_file": DATA_FILE,
            "precision": options.precision,
            "triton_kernels": options.triton_kernels,
            # Set CudaBackend's enable_cuda_graph_for_method to these (comma-separated) before loading: each is
            # captured on its fourth call and replayed after, for the sizes it was exported at.
            "cuda_graph_methods": graph_methods(spec),
            "inductor": dict(options.inductor),
            "delegate_runtime": f"{RUNTIME_PACKAGE}, or an ExecuTorch built with EXECUTORCH_BUILD_CUDA=ON",
            "delegate_runtime_version": toolchain.tensorrt_executorch_runtime if toolchain else None,
            "executorch": toolchain.executorch if toolchain else None,
            "cuda_channel": toolchain.cuda_channel if toolchain else None,
            "gpu": toolchain.gpus[0].name if toolchain and toolchain.gpus else None,
        }
