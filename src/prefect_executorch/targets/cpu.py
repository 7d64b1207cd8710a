"""CPU targets: XNNPACK and portable kernels."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_executorch.errors import ToolchainMismatch
from prefect_executorch.machine.compat import cpu_compat
from prefect_executorch.spec.kinds import inputs_planned
from prefect_executorch.spec.options import PortableOptions, XnnpackOptions
from prefect_executorch.spec.schemes import check_scheme, compat_tag
from prefect_executorch.targets.base import PROGRAM_FILE, WEIGHTS_TAG, Lowered, Target
from prefect_executorch.targets.delegation import delegation_facts

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from prefect_executorch.machine.toolchain import Toolchain
    from prefect_executorch.program import MethodFacts
    from prefect_executorch.spec.buildspec import BuildSpec


def _weights_tag(node: Any) -> str:
    return WEIGHTS_TAG


def _write(manager: Any, spec: BuildSpec, out_dir: Path) -> None:
    (out_dir / PROGRAM_FILE).write_bytes(manager.buffer)
    if spec.external_weights:
        manager.write_tensor_data_to_file(str(out_dir))


class CpuTarget(Target):
    """What the CPU targets share: the compat key and the ExecuTorch check."""

    device = "cpu"

    def check(self, spec: BuildSpec, toolchain: Toolchain) -> list[str]:
        check_scheme(spec, self.name)
        if toolchain.executorch is None:
            raise ToolchainMismatch(
                f"target {self.name!r} needs ExecuTorch; install it with: pip install executorch==1.5.1"
            )
        return []

    def compat(self, spec: BuildSpec, toolchain: Toolchain) -> str:
        return cpu_compat(self.name, toolchain.arch, quantization=compat_tag(spec.quantization))

    def cpp_libraries(self, methods: list[MethodFacts]) -> list[str] | None:
        """From the program itself: the runtime with its portable kernels, the XNNPACK backend if a method delegates
        to it, the quantized kernels if a method calls one (what the C++ consumer links: docs/cpp-consumer.md)."""
        delegates = {backend for method in methods for backend in method.delegates}
        operators = {operator for method in methods for operator in method.operators}
        needed = ["libexecutorch"]
        if "XnnpackBackend" in delegates:
            needed.append("libexecutorch_backend_xnnpack")
        if any(operator.startswith("quantized_decomposed::") for operator in operators):
            needed.append("libexecutorch_kernels_quantized")
        return needed

    def runtime_operators(self) -> set[str] | None:
        from prefect_executorch.machine.runtime_extension import runtime_extension

        return set(runtime_extension()._get_operator_names())

    def edge_program(self, programs: Any, *, generate_etrecord: bool = False,
                     constant_methods: dict[str, Any] | None = None) -> Any:
        """``programs`` in ExecuTorch's edge dialect, partitioned as this target lowers them (triage replays this).

        ``constant_methods``: methods that return a constant, such as the metadata an LLM runner reads.
        """
        from executorch.exir import to_edge

        return to_edge(programs, generate_etrecord=generate_etrecord, constant_methods=constant_methods)

    def to_executorch(self, edge: Any, spec: BuildSpec) -> Any:
        """The edge program as an ExecuTorch program, weights inline or tagged for the ``.ptd``."""
        from executorch.exir import ExecutorchBackendConfig
        from executorch.exir.passes import MemoryPlanningPass

        # Quantized embeddings (torchao's dequantize + embedding) become ExecuTorch's quantized embedding kernels
        # in this pass; nothing else runs torchao's dequantize.
        fuse = spec.quantization is not None and spec.quantization.embeddings is not None
        planning = MemoryPlanningPass(alloc_graph_input=inputs_planned(spec))
        return edge.to_executorch(ExecutorchBackendConfig(
            external_constants=_weights_tag if spec.external_weights else False, do_quant_fusion_and_const_prop=fuse,
            memory_planning_pass=planning))

    def lower(self, programs: dict[str, ExportedProgram], spec: BuildSpec, out_dir: Path,
              constant_methods: dict[str, Any] | None = None) -> Lowered:
        edge = self.edge_program(programs, constant_methods=constant_methods)
        delegation = delegation_facts(edge)
        _write(self.to_executorch(edge, spec), spec, out_dir)
        return Lowered(delegation=delegation)


class PortableTarget(CpuTarget):
    """ExecuTorch's portable kernels, no delegate."""

    name = "portable"
    options = PortableOptions


class XnnpackTarget(CpuTarget):
    """XNNPACK delegate for what it takes, portable kernels for the rest."""

    name = "xnnpack"
    options = XnnpackOptions

    def export_method(
        self, module: torch.nn.Module, args: tuple[Any, ...], dynamic_shapes: Any, spec: BuildSpec
    ) -> ExportedProgram:
        program = super().export_method(module, args, dynamic_shapes, spec)
        if not spec.external_weights:
            return program
        # XNNPACK reads where its weights go from a tag on the unlifted graph, so the program is
        # tagged and exported once more (as executorch's own external-weights tests do).
        from executorch.exir.passes.external_constants_pass import delegate_external_constants_pass_unlifted

        unlifted = program.module()
        delegate_external_constants_pass_unlifted(module=unlifted, gen_tag_fn=_weights_tag)
        return super().export_method(unlifted, args, dynamic_shapes, spec)

    def edge_program(self, programs: Any, *, generate_etrecord: bool = False,
                     constant_methods: dict[str, Any] | None = None) -> Any:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

        return to_edge_transform_and_lower(programs, partitioner=[XnnpackPartitioner()],
                                           generate_etrecord=generate_etrecord, constant_methods=constant_methods)
