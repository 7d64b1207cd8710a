"""Targets by name: each knows how to check, export, load and describe a build, and brings its options."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Union

from pydantic import Field

from prefect_executorch.errors import SpecError
from prefect_executorch.targets.base import PROGRAM_FILE, Target
from prefect_executorch.targets.cpu import PortableTarget, XnnpackTarget
from prefect_executorch.targets.cuda import CudaTarget
from prefect_executorch.targets.options import TargetOptions
from prefect_executorch.targets.tensorrt import TensorRTTarget

TARGETS: dict[str, Target] = {
    target.name: target for target in (XnnpackTarget(), PortableTarget(), CudaTarget(), TensorRTTarget())
}

if TYPE_CHECKING:
    # mypy cannot read a union built at run time; to it a spec's target is its options' base.
    TargetSpec = TargetOptions
else:
    #: The spec's ``target:`` field: one options model per registered target, told apart by ``kind``.
    TargetSpec = Annotated[Union[tuple(target.options for target in TARGETS.values())], Field(discriminator="kind")]  # noqa: UP007 - `|` cannot spread a tuple


def get_target(name: str) -> Target:
    """The target registered under ``name``."""
    try:
        return TARGETS[name]
    except KeyError:
        raise SpecError(f"target: unknown target {name!r}; choose one of {sorted(TARGETS)}") from None


__all__ = ["PROGRAM_FILE", "TARGETS", "Target", "TargetSpec", "get_target"]
