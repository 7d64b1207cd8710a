"""The target interface: one object per target, one job per method."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, Field

from prefect_executorch.isolation import MemoryLimit
from prefect_executorch.spec.kinds import token_per_call
from prefect_executorch.spec.options import TargetOptions
from prefect_executorch.targets.delegation import DelegationFacts

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from prefect_executorch.machine.toolchain import Toolchain
    from prefect_executorch.program import MethodFacts
    from prefect_executorch.spec.buildspec import BuildSpec
    from prefect_executorch.spec.kinds import FixedShapes

#: Name of the program file in every bundle.
PROGRAM_FILE = "model.pte"
#: Tag (and so file stem) our CPU targets give external weights: ``model.ptd``.
WEIGHTS_TAG = "model"
#: Address-space limit of a CPU validation child when the spec sets none (MiB).
CPU_VALIDATE_LIMIT_MIB = 8192
#: Where a target's programs run: ``cuda`` targets build only on a CUDA worker (placement asks this).
Device = Literal["cpu", "cuda"]


class Lowered(BaseModel):
    """What lowering found out: the operators each delegate took, and what the user should know of its choices."""

    delegation: dict[str, DelegationFacts] | None = Field(
        None, description="``delegation.delegation_facts`` of the lowered program; None when the target cannot tell.")
    notes: list[str] = Field(default_factory=list, description="Choices the target made for this model, in words.")


class Target(ABC):
    """How one target checks, exports, loads and describes a build."""

    name: ClassVar[str]
    #: The spec's ``target:`` section for this target (its ``kind`` is ``name``).
    options: ClassVar[type[TargetOptions]]
    device: ClassVar[Device]
    #: Whether its programs must each have a process of their own (the side-by-side runs them apart).
    one_program_per_process: ClassVar[bool] = False
    #: Whether its programs run in the ExecuTorch package's own runtime, with the extensions built beside it (the LLM
    #: runner among them); else in a runtime wheel swapped in for it, which has the program loader only.
    runs_in_executorch_runtime: ClassVar[bool] = True

    def check(self, spec: BuildSpec, toolchain: Toolchain) -> list[str]:
        """Raise ``SpecError``/``ToolchainMismatch`` for what cannot work; return warnings."""
        return []

    @abstractmethod
    def compat(self, spec: BuildSpec, toolchain: Toolchain) -> str:
        """The compat key: where the bundle runs, e.g. ``cpu-xnnpack-x86_64``."""

    def export_method(
        self, module: torch.nn.Module, args: tuple[Any, ...], dynamic_shapes: Any, spec: BuildSpec
    ) -> ExportedProgram:
        """``torch.export`` one method (a module whose ``forward`` is that method)."""
        import torch

        return torch.export.export(module, args, dynamic_shapes=dynamic_shapes)

    def fixed_shapes(self, spec: BuildSpec) -> FixedShapes | None:
        """The setting under which this spec's programs run only at the sizes they were exported with (each model
        kind then feeds them calls of those sizes); None: any size their dynamic dims allow."""
        return None

    def token_per_call(self, spec: BuildSpec) -> bool:
        """Whether this target's program of the decoder LM ``spec`` takes one token a call (``llm.prefill``; ``auto``:
        where the program runs fixed shapes)."""
        return token_per_call(spec, self.fixed_shapes(spec))

    def placed_model(self, model: torch.nn.Module, spec: BuildSpec) -> torch.nn.Module:
        """A Hugging Face model (a decoder LM, a speech model) as this target exports it: on its device, in its
        compute type (default: as loaded)."""
        return model

    @abstractmethod
    def lower(self, programs: dict[str, ExportedProgram], spec: BuildSpec, out_dir: Path,
              constant_methods: dict[str, Any] | None = None) -> Lowered:
        """Lower the exported methods and write ``model.pte`` (and any ``.ptd``) into ``out_dir``.

        ``constant_methods``: methods that return a constant, such as the metadata an LLM runner reads.
        Without delegation facts the manifest says the delegated fraction is unknown.
        """

    def runtime_operators(self) -> set[str] | None:
        """Operators the target's runtime has kernels for (None: cannot tell without loading a program)."""
        return None

    def runtime_setup(self, hints: Mapping[str, Any] | None = None) -> None:  # noqa: B027 - CPU targets need nothing
        """Prepare this process to load programs: what it imports first, and the runtime options the bundle's
        ``hints`` (its manifest's ``runtime_hints``; a build's own while validating) ask for."""

    def memory_limit(self, stage: Literal["export", "validate"], requested_mib: int | None) -> MemoryLimit | None:
        """The bound of the ``stage`` child: the spec's value, else this target's default (None: unbounded)."""
        mib = requested_mib if requested_mib is not None else CPU_VALIDATE_LIMIT_MIB if stage == "validate" else None
        return MemoryLimit(mib=mib, kind="address_space") if mib is not None else None

    def prepare_input(self, tensor: torch.Tensor, spec: BuildSpec) -> torch.Tensor:
        """Place an input where the program wants it (default: host memory)."""
        return tensor

    def eager_device(self, spec: BuildSpec) -> str:
        """Where validation runs the eager model: the device the program runs on."""
        return "cpu"

    def compute_dtype(self, spec: BuildSpec) -> str | None:
        """A lower precision the program computes in than its inputs say (validation tolerances follow it): a float
        dtype's name, or ``tfloat32`` for float32 tensors whose matmuls run in TF32."""
        return None

    def runtime_hints(self, spec: BuildSpec, toolchain: Toolchain | None = None) -> dict[str, Any]:
        """What a consumer of the bundle must know to run it (recorded in the manifest)."""
        return {"input_device": "cpu"}

    def cpp_libraries(self, methods: list[MethodFacts]) -> list[str] | None:
        """The ExecuTorch libraries a C++ consumer links to run ``methods`` (None: not known for this target)."""
        return None
