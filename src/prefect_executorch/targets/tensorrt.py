"""NVIDIA GPU target: torch.export -> torch_tensorrt.dynamo.compile -> torch_tensorrt.save (ExecuTorch).

The calls into torch-tensorrt and ExecuTorch are described as data by pure functions
(``build_steps`` and its parts), so tests can assert them for every option combination and
check them against the real wheel's source without TensorRT. Only ``lower`` and
``runtime_setup`` import the GPU libraries, and only on a GPU worker.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from prefect_executorch.errors import SpecError, ToolchainMismatch
from prefect_executorch.machine.compat import gpu_compat, probed_sm
from prefect_executorch.machine.hostprobe import channel_of
from prefect_executorch.machine.toolchain import channel_cuda_major
from prefect_executorch.machine.versions import minor_version, older_than
from prefect_executorch.spec.options import TensorRTOptions
from prefect_executorch.spec.schemes import check_scheme, compat_tag
from prefect_executorch.targets import tensorrt_quant
from prefect_executorch.targets.base import PROGRAM_FILE, Lowered
from prefect_executorch.targets.calls import Call, LiveSources, Ref, Slot, Step, check_calls, run_steps
from prefect_executorch.targets.gpu import (
    LOW_PRECISION,
    RUNTIME_PACKAGE,
    GpuTarget,
    activate_runtime_wheel,
    cannot_build,
    configure_eager_cuda,
    cuda_backend_problems,
    platform_problems,
)

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from prefect_executorch.machine.toolchain import Toolchain
    from prefect_executorch.spec.buildspec import BuildSpec
    from prefect_executorch.spec.methods import InputSpec, MethodSpec

#: torch-tensorrt 2.13 silently ignores backend_config and unknown save() keywords and drops the .ptd.
MIN_TORCH_TENSORRT = (2, 14)
CUDA_GRAPHS_BUILD = "a Torch-TensorRT build newer than the 2026-10-06 nightly (its main or 2.15 release branch)"
#: First ExecuTorch whose Python bindings return device-resident outputs (and caller-provided ones)
#: correctly; before it they wrap the device pointer as a CPU tensor and the clone segfaults.
DEVICE_OUTPUTS_EXECUTORCH = "1.6.0.dev20261008"

#: The two stacks the delegate ships in: PyPI releases (torch-tensorrt 2.14 + CPU ExecuTorch 1.4.1 +
#: the runtime wheel) and the backend page's nightly channel (CUDA builds of all three).
Stack = Literal["release", "nightly"]
#: The channel suggested when this machine's torch has no CUDA 13 one, per stack.
DEFAULT_CHANNEL: dict[Stack, str] = {"release": "cu130", "nightly": "cu132"}
RELEASE_PACKAGES = '"torch-tensorrt[executorch]>=2.14,<2.15" "torch-tensorrt-executorch-runtime>=0.1.0,<0.2"'
NIGHTLY_PACKAGES = '"torch-tensorrt[executorch]"'


def stack_of(toolchain: Toolchain) -> Stack:
    """The nightly stack if torch, torch-tensorrt or ExecuTorch is a dev build, else the release stack."""
    versions = (toolchain.torch, toolchain.torch_tensorrt, toolchain.executorch)
    return "nightly" if any(v and ".dev" in v for v in versions) else "release"


def install_command(channel: str | None, stack: Stack = "nightly", packages: str | None = None) -> str:
    """The install line of ``stack`` for ``channel`` (this machine's if it is CUDA 13, else the stack's default)."""
    channel = channel if channel is not None and channel_cuda_major(channel) == 13 else DEFAULT_CHANNEL[stack]
    if stack == "release":
        return (f"pip install {packages or RELEASE_PACKAGES} --extra-index-url https://download.pytorch.org/whl/{channel} "
                "--extra-index-url https://pypi.nvidia.com")
    # The backend page's line: --pre and all three indexes matter.
    return (
        f"pip install --pre {packages or NIGHTLY_PACKAGES} --index-url https://download.pytorch.org/whl/nightly/{channel} "
        "--extra-index-url https://pypi.org/simple --extra-index-url https://pypi.nvidia.com"
    )


def worker_install(toolchain: Toolchain, packages: str | None = None) -> str:
    """The install line for the stack and channel this worker is on."""
    return install_command(toolchain.cuda_channel, stack_of(toolchain), packages)


def _options(spec: BuildSpec) -> TensorRTOptions:
    if not isinstance(spec.target, TensorRTOptions):
        raise SpecError(f"target: expected kind 'tensorrt', got {spec.target.kind!r}")
    return spec.target


# ---------------------------------------------------------------- call construction (pure)


def _dtype(name: str) -> Ref:
    return Ref(f"torch.{name}")


def input_call(spec: InputSpec) -> Call:
    """``torch_tensorrt.Input`` for one input: a static shape, or min/opt/max for dynamic dims."""
    if not spec.dynamic:
        return Call("torch_tensorrt.Input", "class", kwargs={"shape": list(spec.shape), "dtype": _dtype(spec.dtype),
                                                             "name": spec.name})
    shapes = {"min_shape": list(spec.shape), "opt_shape": list(spec.shape), "max_shape": list(spec.shape)}
    for index, dim in spec.dynamic.items():
        shapes["min_shape"][index] = dim.min
        shapes["opt_shape"][index] = dim.opt or spec.shape[index]
        shapes["max_shape"][index] = dim.max
    return Call("torch_tensorrt.Input", "class", kwargs={**shapes, "dtype": _dtype(spec.dtype), "name": spec.name})


def build_compile_call(options: TensorRTOptions, method_name: str, method: MethodSpec) -> Call:
    """``torch_tensorrt.dynamo.compile(exported, arg_inputs=..., ...)`` for one method."""
    kwargs: dict[str, Any] = {
        "arg_inputs": [input_call(i) for i in method.inputs],
        "min_block_size": options.min_block_size,
        "hardware_compatible": options.hardware_compatible,
        "version_compatible": options.version_compatible,
        # FP32 engines match eager only without TF32 (validation turns it off in eager too).
        "disable_tf32": options.precision == "fp32",
    }
    if options.precision in LOW_PRECISION:
        # 2.14 has no enabled_precisions: networks are strongly typed, lower precision is autocast.
        kwargs["enable_autocast"] = True
        kwargs["autocast_low_precision_type"] = _dtype(LOW_PRECISION[options.precision])
    kwargs.update(options.compile_options)
    return Call("torch_tensorrt.dynamo.compile", "function", args=(Slot(f"exported.{method_name}"),), kwargs=kwargs)


def build_partitioners(options: TensorRTOptions, method_name: str) -> list[Call]:
    """Partitioners that run after TensorRT's: the CUDA backend for what it rejects, if asked."""
    if not options.coalesce_cuda:
        return []
    method_spec = Call("executorch.backends.cuda.cuda_backend.CudaBackend.generate_method_name_compile_spec",
                       "classmethod", args=(method_name,))
    return [Call("executorch.backends.cuda.cuda_partitioner.CudaPartitioner", "class", args=([method_spec],))]


def build_backend_config(options: TensorRTOptions) -> Call | None:
    """``ExecutorchBackendConfig`` for device-resident I/O (the three settings the page requires together)."""
    io = options.device_resident_io
    if io is None:
        return None
    return Call("executorch.exir.ExecutorchBackendConfig", "class", kwargs={
        "propagate_device_config": Call(
            "executorch.exir.passes.propagate_device_config.PropagateDeviceConfig", "class",
            kwargs={"skip_h2d_for_method_inputs": io.inputs, "skip_d2h_for_method_outputs": io.outputs},
        ),
        # Copy insertion happens in device-aware memory planning; the skip flags need it.
        "enable_non_cpu_memory_planning": True,
        # An input the program plans itself is copied into, which puts the copy straight back.
        "memory_planning_pass": Call(
            "executorch.exir.passes.MemoryPlanningPass", "class",
            kwargs={"alloc_graph_input": not io.inputs, "alloc_graph_output": io.planned_outputs},
        ),
    })


def build_save_call(options: TensorRTOptions, method_name: str) -> Call:
    """``torch_tensorrt.save(compiled, path, output_format="executorch", retrace=False, ...)``."""
    kwargs: dict[str, Any] = {
        "output_format": "executorch",
        "arg_inputs": Slot(f"example_inputs.{method_name}"),
        "retrace": False,
    }
    partitioners = build_partitioners(options, method_name)
    if partitioners:
        kwargs["partitioners"] = partitioners
    config = build_backend_config(options)
    if config is not None:
        kwargs["backend_config"] = config
    if options.cuda_graphs:
        kwargs["use_cuda_graphs"] = True
    return Call("torch_tensorrt.save", "function", args=(Slot(f"compiled.{method_name}"), Slot("pte_path")),
                kwargs=kwargs)


def build_steps(spec: BuildSpec) -> list[Step]:
    """Every library call of a TensorRT export, in order, as data.

    A lone ``forward`` goes through ``torch_tensorrt.save``, which always names its one method
    ``forward``. Any other method set goes through ``torch_tensorrt.executorch.export`` with a
    mapping of engine-bearing programs (each from ``torch_tensorrt.dynamo.export`` with the legacy
    exporter, as ``save(retrace=False)`` does: a re-trace drops the engines), then
    ``to_executorch``; the caller writes the result as ``save`` would.
    """
    options = _options(spec)
    steps = [Step(build_compile_call(options, name, method), f"compiled.{name}") for name, method in spec.methods.items()]
    if list(spec.methods) == ["forward"]:
        return [*steps, Step(build_save_call(options, "forward"))]
    for name in spec.methods:
        steps.append(Step(Call("torch_tensorrt.dynamo.export", "function", args=(Slot(f"compiled.{name}"),), kwargs={
            "arg_inputs": Slot(f"example_inputs.{name}"),
            "dynamic_shapes": Slot(f"dynamic_shapes.{name}"),
            "use_legacy_exporter": True,
        }), f"program.{name}"))
    export_kwargs: dict[str, Any] = {}
    if options.coalesce_cuda:
        # One partitioner instance per method: the CUDA backend reads its method name from its specs.
        export_kwargs["partitioners"] = {name: build_partitioners(options, name) for name in spec.methods}
    if options.cuda_graphs:
        export_kwargs["use_cuda_graphs"] = True
    edge = Call("torch_tensorrt.executorch.export", "function",
                args=({name: Slot(f"program.{name}") for name in spec.methods},), kwargs=export_kwargs)
    to_executorch = Call("executorch.exir.EdgeProgramManager.to_executorch", "method", args=(Slot("edge"),),
                         kwargs={"config": build_backend_config(options)})
    return [*steps, Step(edge, "edge"), Step(to_executorch, "executorch_program")]


# ---------------------------------------------------------------- checks before any work


def _spec_problems(spec: BuildSpec, options: TensorRTOptions) -> list[str]:
    problems = []
    if spec.external_weights:
        problems.append(
            "external_weights: TensorRT engines carry their weights inside the .pte and the CUDA backend writes "
            "its own aoti_cuda_blob.ptd; remove external_weights for target tensorrt"
        )
    if options.precision in LOW_PRECISION:
        other = {"float16", "bfloat16"} - {LOW_PRECISION[options.precision]}
        for name, method in spec.methods.items():
            for inp in method.inputs:
                if inp.dtype in other:
                    problems.append(
                        f"methods.{name}.inputs {inp.name!r}: dtype {inp.dtype} does not match target.precision "
                        f"{options.precision!r}; use one low-precision type"
                    )
    return problems


def _compile_option_problems(options: TensorRTOptions, toolchain: Toolchain) -> list[str]:
    api = toolchain.torch_tensorrt_api
    if api is None or not api.compile_keywords:
        return []
    problems = []
    for name in options.compile_options:
        if name not in api.compile_keywords:
            close = difflib.get_close_matches(name, api.compile_keywords, n=3)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            problems.append(
                f"target.compile_options.{name}: torch_tensorrt.dynamo.compile (torch-tensorrt {api.version}) has no "
                f"keyword {name!r} and would ignore it silently{hint}"
            )
    return problems


def _cuda_mismatch(what: str, channel: str | None, labelled: bool, torch_channel: str | None, install: str) -> str | None:
    """A channel conflict with torch: exact where both carry a ``+cu`` label, by CUDA major otherwise."""
    if not channel or not torch_channel or channel == torch_channel:
        return None
    if labelled:
        return f"{what} is built for {channel} but torch is {torch_channel}; keep torch, executorch and torch-tensorrt on one channel: {install}"
    major, torch_major = channel_cuda_major(channel), channel_cuda_major(torch_channel)
    if major == torch_major:
        return None  # a release wheel without a +cu label runs on any minor of its CUDA major
    return f"{what} is built for CUDA {major} ({channel}) but torch is CUDA {torch_major} ({torch_channel}); install one stack: {install}"


def _library_problems(toolchain: Toolchain, install: str) -> list[str]:
    problems = []
    torch_minor = minor_version(toolchain.torch)
    channel = toolchain.cuda_channel
    tt = toolchain.torch_tensorrt
    if tt is None:
        problems.append(f"torch-tensorrt is not installed; install it with: {install}")
    else:
        tt_minor = minor_version(tt)
        if tt_minor is not None and tt_minor < MIN_TORCH_TENSORRT:
            problems.append(
                f"torch-tensorrt {tt} is older than 2.14: it silently drops backend_config and the CUDA backend's .ptd; "
                f"upgrade with: {install}"
            )
        if tt_minor is not None and torch_minor != tt_minor:
            major, minor = tt_minor
            problems.append(
                f"torch-tensorrt {tt} needs torch {major}.{minor} (torch>={major}.{minor},<{major}.{minor + 1}), "
                f"found torch {toolchain.torch}; install both from one stack with: {install}"
            )
        conflict = _cuda_mismatch(f"torch-tensorrt {tt}", toolchain.torch_tensorrt_channel, channel_of(tt) is not None,
                                  channel, install)
        problems += [conflict] if conflict else []
        api = toolchain.torch_tensorrt_api
        if toolchain.tensorrt is None:
            problems.append(f"TensorRT is not installed (importing torch_tensorrt needs libnvinfer); install with: {install}")
        elif api and api.tensorrt_version and minor_version(api.tensorrt_version) != minor_version(toolchain.tensorrt):
            problems.append(
                f"TensorRT {toolchain.tensorrt} does not match the {api.tensorrt_version} torch-tensorrt {tt} was "
                f"built against; install with: {install}"
            )
    et = toolchain.executorch
    runtime = toolchain.tensorrt_executorch_runtime
    if et is None:
        problems.append(f"executorch is not installed; install it with: {install}")
    elif toolchain.executorch_cuda is False and runtime is None:
        # The release stack is CPU ExecuTorch plus the runtime wheel, which brings its own CUDA runtime.
        problems.append(
            f"executorch {et} is a CPU build and {RUNTIME_PACKAGE} is not installed: the delegate needs either the "
            f"runtime wheel beside CPU ExecuTorch (release stack) or ExecuTorch's CUDA build (nightly stack); "
            f"install with: {install}"
        )
    else:
        conflict = _cuda_mismatch(f"executorch {et}", channel_of(et), True, channel, install)
        problems += [conflict] if conflict else []
    if runtime is None:
        problems.append(
            f"{RUNTIME_PACKAGE} is not installed; validation loads the program with it. Install it with: "
            + worker_install(toolchain, RUNTIME_PACKAGE)
        )
    return problems


def _option_problems(spec: BuildSpec, options: TensorRTOptions, toolchain: Toolchain) -> list[str]:
    problems = []
    api = toolchain.torch_tensorrt_api
    if options.cuda_graphs and api is not None:
        mapping = list(spec.methods) != ["forward"]
        if not toolchain.capabilities.get("cuda_graphs_several_methods" if mapping else "cuda_graphs"):
            where = "torch_tensorrt.executorch.export()" if mapping else "torch_tensorrt.save()"
            problems.append(
                f"target.cuda_graphs: {where} of torch-tensorrt {toolchain.torch_tensorrt} does not accept "
                f"use_cuda_graphs (it raises TypeError); CUDA graph replay needs {CUDA_GRAPHS_BUILD}: install a newer "
                "nightly or build Torch-TensorRT from source, or set cuda_graphs: false"
            )
    if options.coalesce_cuda:
        problems += cuda_backend_problems(toolchain, "target.coalesce_cuda", "set coalesce_cuda: false")
    if options.hardware_compatible and (sm := probed_sm(toolchain.sm)) is not None and sm < 80:
        problems.append(
            f"target.hardware_compatible: hardware-compatible engines need an Ampere (sm80) or newer GPU; this one "
            f"is {toolchain.sm}; set hardware_compatible: false"
        )
    io = options.device_resident_io
    if io is not None and io.outputs and toolchain.executorch and (
        older_than(toolchain.executorch, DEVICE_OUTPUTS_EXECUTORCH)
    ):
        problems.append(
            f"target.device_resident_io.outputs: Python cannot receive device-resident outputs on ExecuTorch "
            f"{toolchain.executorch} (its bindings wrap the device pointer as a CPU tensor and the copy crashes), so "
            "the program could not be validated. What works on this stack: device-resident inputs only, "
            "`device_resident_io: {inputs: true, outputs: false}`. Device-resident outputs need ExecuTorch "
            f"{DEVICE_OUTPUTS_EXECUTORCH} or newer: " + install_command(toolchain.cuda_channel, "nightly")
        )
    return problems


def _warnings(spec: BuildSpec, options: TensorRTOptions) -> list[str]:
    warnings = []
    if options.cuda_graphs and options.shared_scratch:
        warnings.append(
            "target.cuda_graphs with target.shared_scratch: an engine on the shared activation scratch always takes "
            "the ordinary path, so CUDA graph replay will not happen"
        )
    if options.cuda_graphs and any(i.dynamic for m in spec.methods.values() for i in m.inputs):
        warnings.append(
            "target.cuda_graphs with dynamic shapes: shapes that change on every call never replay and still pay "
            "the copies into the stable replay buffers"
        )
    if options.shared_scratch:
        warnings.append(
            "target.shared_scratch is a delegate runtime feature: it is recorded in the manifest's runtime hints "
            "and does not change the export"
        )
    return warnings


class TensorRTTarget(GpuTarget):
    """TensorRT engines inside the .pte; optionally the CUDA backend for the operators TensorRT rejects."""

    name = "tensorrt"
    options = TensorRTOptions

    def check(self, spec: BuildSpec, toolchain: Toolchain) -> list[str]:
        check_scheme(spec, self.name)
        options = _options(spec)
        spec_problems = (_spec_problems(spec, options) + _compile_option_problems(options, toolchain)
                         + tensorrt_quant.spec_problems(spec, options.precision, options.hardware_compatible))
        if spec_problems:
            raise SpecError("invalid spec for target tensorrt:\n  - " + "\n  - ".join(spec_problems))
        install = worker_install(toolchain)
        problems = (
            platform_problems(toolchain, install, self.name)
            + _library_problems(toolchain, install)
            + _option_problems(spec, options, toolchain)
            + tensorrt_quant.toolchain_problems(spec, toolchain)
        )
        if problems:
            raise cannot_build("tensorrt", problems, install)
        return _warnings(spec, options)

    def compat(self, spec: BuildSpec, toolchain: Toolchain) -> str:
        options = _options(spec)
        try:
            return gpu_compat(toolchain.cuda_channel, "sm80" if options.hardware_compatible else toolchain.sm,
                              toolchain.arch, toolchain.tensorrt, sm_or_newer=options.hardware_compatible,
                              tensorrt_or_newer=options.version_compatible, quantization=compat_tag(spec.quantization))
        except SpecError as exc:
            raise ToolchainMismatch(f"the compat key of a TensorRT bundle cannot be built on this worker: {exc}") from None

    def export_method(
        self, module: torch.nn.Module, args: tuple[Any, ...], dynamic_shapes: Any, spec: BuildSpec
    ) -> ExportedProgram:
        # Engines are built from a CUDA graph: export on the device they will run on.
        with tensorrt_quant.export_context(spec):
            return super().export_method(module.to("cuda"), tuple(a.to("cuda") for a in args), dynamic_shapes, spec)

    def lower(self, programs: dict[str, ExportedProgram], spec: BuildSpec, out_dir: Path,
              constant_methods: dict[str, Any] | None = None) -> Lowered:
        from prefect_executorch.machine.apisource import Sources
        from prefect_executorch.program import read_program
        from prefect_executorch.spec.inputs import dynamic_shapes, example_inputs
        from prefect_executorch.targets.delegation import facts_from_program

        tensorrt_quant.require_quantize_converter(spec)
        steps = build_steps(spec)
        # dynamo.compile drops keywords it does not know: compare every call with what the installed
        # libraries accept (their signatures; for **kwargs, what their source reads) before any work.
        problems = check_calls(steps, LiveSources(Sources.installed("torch_tensorrt", "executorch")))
        if problems:
            raise ToolchainMismatch("the installed torch-tensorrt/executorch do not accept our calls:\n  - "
                                    + "\n  - ".join(problems))
        pte = out_dir / PROGRAM_FILE
        slots: dict[str, Any] = {"pte_path": str(pte)}
        for name, method in spec.methods.items():
            slots[f"exported.{name}"] = programs[name]
            slots[f"example_inputs.{name}"] = tuple(t.to("cuda") for t in example_inputs(method, seed=spec.validation.seed))
            slots[f"dynamic_shapes.{name}"] = dynamic_shapes(method)
        program = run_steps(steps, slots).get("executorch_program")
        if program is not None:
            # Serialize as torch_tensorrt.save does: the .pte, then any external data (.ptd) beside it.
            with open(pte, "wb") as file:
                program.write_to_file(file)
            if program._tensor_data:
                program.write_tensor_data_to_file(str(out_dir))
        # Engines hide their operators: count the method's operators before lowering, and read from
        # the .pte which of them were left to ExecuTorch's kernels.
        return Lowered(delegation=facts_from_program(programs, read_program(pte)))

    def runtime_setup(self, hints: Mapping[str, Any] | None = None) -> None:
        configure_eager_cuda()
        activate_delegate_runtime()

    def prepare_input(self, tensor: torch.Tensor, spec: BuildSpec) -> torch.Tensor:
        io = _options(spec).device_resident_io
        return tensor.to("cuda") if io is not None and io.inputs else tensor

    def runtime_hints(self, spec: BuildSpec, toolchain: Toolchain | None = None) -> dict[str, Any]:
        options = _options(spec)
        io = options.device_resident_io
        return {
            "input_device": "cuda" if io and io.inputs else "cpu",
            "output_device": "cuda" if io and io.outputs else "cpu",
            "wants_cuda_tensors": bool(io and io.inputs),
            "planned_outputs": io.planned_outputs if io else True,
            "cuda_graphs_requested": options.cuda_graphs,
            "shared_scratch": options.shared_scratch,
            "precision": options.precision,
            "delegate_runtime": RUNTIME_PACKAGE,
            "delegate_runtime_version": toolchain.tensorrt_executorch_runtime if toolchain else None,
            "cuda_channel": toolchain.cuda_channel if toolchain else None,
            "stack": stack_of(toolchain) if toolchain else None,
        }


def activate_delegate_runtime() -> None:
    """Register TensorRTBackend before anything loads ExecuTorch's runtime.

    The backend page's contract is that importing the package registers the delegate; the 0.1.0 wheel
    registers it through ``activate()`` instead. Both are handled (``gpu.activate_runtime_wheel``).
    """
    from prefect_executorch.machine.hostprobe import local_cuda_channel
    from prefect_executorch.machine.runtime_extension import backend_install_hint

    channel = local_cuda_channel()
    stack: Stack = "nightly" if ".dev" in importlib.metadata.version("torch") else "release"
    activate_runtime_wheel("TensorRTBackend", True, backend_install_hint("TensorRTBackend", channel),
                           install_command(channel, stack, None if stack == "release" else RUNTIME_PACKAGE))
