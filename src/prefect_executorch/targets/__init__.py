"""Targets by name: each knows how to check, export, load and describe a build."""

from __future__ import annotations

from prefect_executorch.errors import SpecError
from prefect_executorch.targets.base import PROGRAM_FILE, Target
from prefect_executorch.targets.cpu import PortableTarget, XnnpackTarget
from prefect_executorch.targets.tensorrt import TensorRTTarget

TARGETS: dict[str, Target] = {target.name: target for target in (XnnpackTarget(), PortableTarget(), TensorRTTarget())}


def get_target(name: str) -> Target:
    """The target registered under ``name``."""
    try:
        return TARGETS[name]
    except KeyError:
        raise SpecError(f"target: unknown target {name!r}; choose one of {sorted(TARGETS)}") from None


__all__ = ["PROGRAM_FILE", "TARGETS", "Target", "get_target"]
