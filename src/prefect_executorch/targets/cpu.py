"""CPU targets: XNNPACK and portable kernels."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_executorch.compat import cpu_compat
from prefect_executorch.delegation import DelegationFacts, delegation_facts
from prefect_executorch.errors import ToolchainMismatch
from prefect_executorch.quantization import check_scheme, compat_tag
from prefect_executorch.targets.base import PROGRAM_FILE, WEIGHTS_TAG, Target
from prefect_executorch.targets.options import PortableOptions, XnnpackOptions

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from prefect_executorch.spec import BuildSpec
    from prefect_executorch.toolchain import Toolchain


def _weights_tag(node: Any) -> str:
    return WEIGHTS_TAG


def _write(manager: Any, spec: BuildSpec, out_dir: Path) -> None:
    (out_dir / PROGRAM_FILE).write_bytes(manager.buffer)
    if spec.external_weights:
        manager.write_tensor_data_to_file(str(out_dir))


def _backend_config(spec: BuildSpec) -> Any:
    from executorch.exir import ExecutorchBackendConfig

    return ExecutorchBackendConfig(external_constants=_weights_tag if spec.external_weights else False)


class CpuTarget(Target):
    """What the CPU targets share: the compat key and the ExecuTorch check."""

    device = "cpu"

    def check(self, spec: BuildSpec, toolchain: Toolchain) -> list[str]:
        check_scheme(spec, self.name)
        if toolchain.executorch is None:
            raise ToolchainMismatch(
                f"target {self.name!r} needs ExecuTorch; install it with: pip install executorch==1.4.1"
            )
        return []

    def compat(self, spec: BuildSpec, toolchain: Toolchain) -> str:
        return cpu_compat(self.name, toolchain.arch, quantization=compat_tag(spec.quantization))

    def runtime_operators(self) -> set[str] | None:
        from executorch.extension.pybindings.portable_lib import _get_operator_names

        return set(_get_operator_names())


class PortableTarget(CpuTarget):
    """ExecuTorch's portable kernels, no delegate."""

    name = "portable"
    options = PortableOptions

    def lower(
        self, programs: dict[str, ExportedProgram], spec: BuildSpec, out_dir: Path
    ) -> dict[str, DelegationFacts]:
        from executorch.exir import to_edge

        edge = to_edge(programs)
        delegation = delegation_facts(edge)
        _write(edge.to_executorch(_backend_config(spec)), spec, out_dir)
        return delegation


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

    def lower(
        self, programs: dict[str, ExportedProgram], spec: BuildSpec, out_dir: Path
    ) -> dict[str, DelegationFacts]:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

        edge = to_edge_transform_and_lower(programs, partitioner=[XnnpackPartitioner()])
        delegation = delegation_facts(edge)
        _write(edge.to_executorch(_backend_config(spec)), spec, out_dir)
        return delegation
