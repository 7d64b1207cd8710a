"""Probe the worker's toolchain and refuse a spec it cannot build."""

from __future__ import annotations

from prefect import get_run_logger, task

from prefect_executorch.errors import ToolchainMismatch
from prefect_executorch.fleet.placement import Placement, route
from prefect_executorch.machine.probecache import probe_cached
from prefect_executorch.machine.toolchain import Toolchain
from prefect_executorch.progress import stage
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.targets import check_build, get_target


@task(name="probe-toolchain")
def probe_toolchain() -> Toolchain:
    """What this worker is: versions, CUDA channel, GPUs, OS and arch.

    The probe's cached answer when nothing it depends on changed (``machine/probecache.py``: the key covers
    the interpreter, every installed distribution, the driver and GPUs, the boot, the CUDA environment),
    else a probe in a child process, then cached: a ~0.1 s child saved on every run of an unchanged worker.
    """
    with stage("probe"):
        return probe_cached()


@task(name="check-buildable")
def check_buildable(spec: BuildSpec, toolchain: Toolchain) -> str:
    """Raise for what this worker cannot build; log warnings; return the bundle's compat key."""
    target = get_target(spec.target_name)
    for warning in check_build(spec, toolchain):
        get_run_logger().warning(warning)
    return target.compat(spec, toolchain)


@task(name="check-placement")
def check_placement(spec: BuildSpec, placement: Placement, toolchain: Toolchain) -> None:
    """Refuse to build here when this worker is not what the placement asks for."""
    # In the run's own process the pinned GPU is device 0 (the worker sets CUDA_VISIBLE_DEVICES).
    decision = route({"spec": spec, "placement": placement}, {}, None, None, toolchain)
    if not decision.accepted:
        raise ToolchainMismatch(f"cannot build {spec.target_name} for {placement.pool}/{placement.queue} here: {decision.reason}")
