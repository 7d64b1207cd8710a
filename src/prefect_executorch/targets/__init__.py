"""Targets by name: each knows how to check, export, load and describe a build, and brings its options."""

from __future__ import annotations

from prefect_executorch.errors import SpecError
from prefect_executorch.machine.toolchain import Toolchain
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.kinds import check_kind_shapes, check_kind_stack
from prefect_executorch.targets.base import PROGRAM_FILE, Target
from prefect_executorch.targets.cpu import PortableTarget, XnnpackTarget
from prefect_executorch.targets.cuda import CudaTarget
from prefect_executorch.targets.tensorrt import TensorRTTarget

TARGETS: dict[str, Target] = {
    target.name: target for target in (XnnpackTarget(), PortableTarget(), CudaTarget(), TensorRTTarget())
}

def get_target(name: str) -> Target:
    """The target registered under ``name``."""
    try:
        return TARGETS[name]
    except KeyError:
        raise SpecError(f"target: unknown target {name!r}; choose one of {sorted(TARGETS)}") from None


def needs_cuda(target_kind: str) -> bool:
    """Whether a registered target builds only on a CUDA GPU (unknown kinds are the spec's error)."""
    target = TARGETS.get(target_kind)
    return target is not None and target.device == "cuda"


def check_build(spec: BuildSpec, toolchain: Toolchain) -> list[str]:
    """Raise ``SpecError``/``ToolchainMismatch`` for everything that keeps a build from starting here, before any
    export: what the spec's model kind needs in this process, what its target needs, and what the kind cannot do on
    that target; return the target's warnings."""
    target = get_target(spec.target_name)
    check_kind_stack(spec)
    warnings = target.check(spec, toolchain)
    check_kind_shapes(spec, target.fixed_shapes(spec))
    return warnings


__all__ = ["PROGRAM_FILE", "TARGETS", "Target", "check_build", "get_target", "needs_cuda"]
