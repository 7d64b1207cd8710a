"""Each target's options: the ``target:`` section of a spec, one model per registered target.

Pure pydantic (no behaviour imports): the spec builds its ``target:`` union from ``OPTIONS`` and never
imports the targets; ``targets/`` checks that each registered target brings the model listed here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import Field, field_validator, model_validator

from prefect_executorch.spec.base import StrictModel


class TargetOptions(StrictModel):
    """Base of a target's options: ``kind`` names the target in the registry."""

    kind: str


class XnnpackOptions(TargetOptions):
    """CPU target: XNNPACK delegate, portable kernels for the rest."""

    kind: Literal["xnnpack"] = "xnnpack"


class PortableOptions(TargetOptions):
    """CPU target: ExecuTorch portable kernels only."""

    kind: Literal["portable"] = "portable"


class DeviceResidentIO(StrictModel):
    """Which copies around the method boundary a TensorRT program skips (the caller holds CUDA tensors)."""

    inputs: bool = Field(True, description="Skip the host-to-device copy of method inputs; inputs are left unplanned.")
    outputs: bool = Field(True, description="Skip the device-to-host copy of method outputs.")
    planned_outputs: bool = Field(
        True,
        description="Keep outputs in the program's device arena (Python gets a CUDA copy). False makes the "
        "caller provide output memory, which Python bindings before ExecuTorch 1.6.0.dev20261008 get wrong.",
    )

    @model_validator(mode="after")
    def _something_on_device(self) -> DeviceResidentIO:
        if not (self.inputs or self.outputs):
            raise ValueError("inputs and outputs are both false, which is the default; use device_resident_io: false")
        if not self.outputs and not self.planned_outputs:
            raise ValueError("planned_outputs: false only applies when outputs stay on the device (outputs: true)")
        return self


#: ``dynamo.compile`` keywords the target sets itself from its own options.
TENSORRT_OWNED_COMPILE_KEYWORDS = {
    "exported_program": "the target passes the exported method",
    "inputs": "the target builds arg_inputs from the spec's methods",
    "arg_inputs": "the target builds arg_inputs from the spec's methods",
    "kwarg_inputs": "methods take positional inputs only",
    "min_block_size": "set target.min_block_size",
    "hardware_compatible": "set target.hardware_compatible",
    "version_compatible": "set target.version_compatible",
    "enable_autocast": "set target.precision",
    "autocast_low_precision_type": "set target.precision",
}

CompileValue = bool | int | float | str | list[str]


class TensorRTOptions(TargetOptions):
    """NVIDIA GPU target: TensorRT engines inside the .pte, optionally with the CUDA backend for the rest."""

    kind: Literal["tensorrt"] = "tensorrt"
    min_block_size: int = Field(5, ge=1, description="Fewest convertible operators TensorRT takes as one engine.")
    precision: Literal["fp32", "fp16", "bf16"] = Field(
        "fp32", description="fp32 builds without TF32; fp16/bf16 use torch-tensorrt's autocast (networks are strongly typed)."
    )
    coalesce_cuda: bool = Field(False, description="Compile what TensorRT rejects with ExecuTorch's CUDA backend (needs nvcc).")
    device_resident_io: DeviceResidentIO | None = Field(None, description="Keep method inputs/outputs on the GPU.")
    cuda_graphs: bool = Field(False, description="Record each engine once and replay it (needs a build newer than 2026-10-06).")
    shared_scratch: bool = Field(
        False, description="Engines share one activation scratch buffer (a delegate runtime hint; disables replay)."
    )
    hardware_compatible: bool = Field(False, description="Engines run on any Ampere-or-newer GPU (compat 'sm80plus').")
    version_compatible: bool = Field(False, description="Engines run on the same or a newer TensorRT of one major (compat 'trt11.1plus').")
    retrace: bool = Field(False, description="Must stay false: re-exporting the compiled graph drops the engines.")
    compile_options: dict[str, CompileValue] = Field(
        default_factory=dict, description="Further torch_tensorrt.dynamo.compile keywords, checked against its signature."
    )

    @field_validator("device_resident_io", mode="before")
    @classmethod
    def _device_shorthand(cls, value: Any) -> Any:
        if value is True:
            return {}
        return None if value is False else value

    @field_validator("retrace")
    @classmethod
    def _no_retrace(cls, value: bool) -> bool:
        if value:
            raise ValueError(
                "retrace: true re-exports the compiled graph, which drops the TensorRT engines; the failure only "
                "shows when the program is loaded. Remove it (the exporter always passes retrace=False)"
            )
        return value

    @field_validator("compile_options")
    @classmethod
    def _not_owned(cls, options: dict[str, CompileValue]) -> dict[str, CompileValue]:
        for name in options:
            if name in TENSORRT_OWNED_COMPILE_KEYWORDS:
                raise ValueError(f"{name!r} is set by the target ({TENSORRT_OWNED_COMPILE_KEYWORDS[name]})")
        return options


class CudaOptions(TargetOptions):
    """NVIDIA GPU target: ExecuTorch's CUDA backend (AOTInductor with Triton kernels); model.pte + aoti_cuda_blob.ptd."""

    kind: Literal["cuda"] = "cuda"
    precision: Literal["fp32", "tf32", "fp16", "bf16"] = Field(
        "fp32", description="fp16/bf16 compute the model in that type behind the spec's input and output dtypes; "
        "tf32 keeps float32 tensors and compiles matmuls and convolutions for TF32 tensor cores (what "
        "torch.set_float32_matmul_precision('high') does in eager); every precision is compared with an eager "
        "reference without TF32, at that precision's tolerance.")
    triton_kernels: Literal["auto", "on", "off"] = Field(
        "auto", description="ExecuTorch's own Triton kernels for attention and top-k. Its attention kernel takes "
        "bfloat16 only, so 'auto' turns them off for a method whose attention runs in another type.")
    low_memory: bool = Field(
        False, description="The backend's low-memory export: mutated buffers (KV caches) are cloned on the host while compiling.")
    cuda_graphs: bool = Field(
        False, description="Capture each method as a CUDA graph on its fourth call and replay it after (the backend's "
        "enable_cuda_graph_for_method): static input shapes only; validation checks that replayed outputs equal direct ones.")
    inductor: dict[str, CompileValue] = Field(
        default_factory=dict, description="Inductor settings for the compile, by their torch._inductor.config names "
        "(e.g. coordinate_descent_tuning: true); the backend's own (max_autotune*, aot_inductor.*) cannot be changed.")


#: Each target's options model by its ``kind``, in the order error messages list them.
OPTIONS: dict[str, type[TargetOptions]] = {
    options.model_fields["kind"].default: options
    for options in (XnnpackOptions, PortableOptions, CudaOptions, TensorRTOptions)
}

if TYPE_CHECKING:
    # mypy cannot read a union built at run time; to it a spec's target is its options' base.
    TargetSpec = TargetOptions
else:
    #: The spec's ``target:`` field: one options model per target, told apart by ``kind``.
    TargetSpec = Annotated[Union[tuple(OPTIONS.values())], Field(discriminator="kind")]  # noqa: UP007 - `|` cannot spread a tuple
