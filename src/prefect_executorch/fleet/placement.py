"""Where a build runs: CUDA channel pools, GPU-arch queues, and the worker's accept/refuse decision.

One work pool per CUDA channel (``gpu-cu132``...; ``cpu`` for CPU targets), one queue per GPU arch
(``sm90``...). ``route`` is the pure decision a worker makes for a flow run: it gathers what the
run needs (spec target, ``placement`` parameter, job variables, pool and queue names), refuses
contradictions between those sources, and compares the rest with the worker's probed toolchain.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from prefect_executorch.machine.compat import parse_sm, sm_number
from prefect_executorch.machine.toolchain import GpuInfo, Toolchain
from prefect_executorch.spec.base import StrictModel
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.options import TargetSpec
from prefect_executorch.targets import needs_cuda
from prefect_executorch.targets.tensorrt import install_command as tensorrt_install

CPU_POOL = "cpu"
DEFAULT_QUEUE = "default"
GPU_ARCHS = ("sm80", "sm90", "sm100")

_CHANNEL_RE = re.compile(r"^cu\d{3}$")
_GPU_POOL_RE = re.compile(r"^gpu-(cu\d{3})$")

def pool_install_command(channel: str) -> str:
    """What a GPU pool of ``channel`` installs: the backend page's nightly line for that channel."""
    return tensorrt_install(channel, "nightly")


def pool_for(channel: str) -> str:
    """Work pool of a channel: ``cu132`` -> ``gpu-cu132``; ``cpu`` -> ``cpu``."""
    return CPU_POOL if channel == "cpu" else f"gpu-{channel}"


def channel_of_pool(pool: str | None) -> str | None:
    """The CUDA channel a pool name implies (``gpu-cu132`` -> ``cu132``), else None."""
    match = _GPU_POOL_RE.match(pool or "")
    return match.group(1) if match else None


class Placement(StrictModel):
    """What one build needs from its worker."""

    channel: str = Field("cpu", description="'cpu', or the CUDA channel: 'cu130', 'cu132', 'cu134'.")
    sm: str | None = Field(None, description="GPU arch: 'sm90', or 'sm80plus' for hardware-compatible engines.")
    tensorrt: str | None = Field(None, description="TensorRT version prefix the engines need, e.g. '11.1'.")

    @field_validator("channel")
    @classmethod
    def _channel(cls, value: str) -> str:
        if value != "cpu" and not _CHANNEL_RE.match(value):
            raise ValueError(f"{value!r} is not 'cpu' or a CUDA channel like 'cu132'")
        return value

    @field_validator("sm")
    @classmethod
    def _sm(cls, value: str | None) -> str | None:
        if value is not None:
            sm_number(value)
        return value

    @model_validator(mode="after")
    def _gpu_only(self) -> Placement:
        if self.channel == "cpu" and (self.sm or self.tensorrt):
            raise ValueError("sm and tensorrt need a CUDA channel; set channel to cu130, cu132 or cu134")
        return self

    @property
    def pool(self) -> str:
        """The work pool that serves this placement."""
        return pool_for(self.channel)

    @property
    def queue(self) -> str:
        """The work queue: the GPU arch (``sm80plus`` runs on any Ampere+ GPU: queue ``sm80``)."""
        return f"sm{sm_number(self.sm)}" if self.sm else DEFAULT_QUEUE


class MatrixCell(StrictModel):
    """One build of a matrix: a target and the placement it is built on."""

    target: TargetSpec
    placement: Placement = Field(default_factory=Placement)

    @field_validator("target", mode="before")
    @classmethod
    def _target_shorthand(cls, value: Any) -> Any:
        return {"kind": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _cpu_targets_on_cpu(self) -> MatrixCell:
        if needs_cuda(self.target.kind) and self.placement.channel == "cpu":
            raise ValueError(f"target {self.target.kind!r} needs a CUDA channel in placement (cu130, cu132, cu134)")
        return self

    def spec_for(self, spec: BuildSpec) -> BuildSpec:
        """``spec`` with this cell's target."""
        return spec.model_copy(update={"target": self.target})

    @property
    def label(self) -> str:
        """Short name for logs and flow-run names: ``xnnpack@cpu``, ``tensorrt@cu132-sm90``."""
        where = "-".join(filter(None, [self.placement.channel, self.placement.sm, self.placement.tensorrt]))
        return f"{self.target.kind}@{where}"


class Decision(BaseModel):
    """A worker's answer to a flow run: accepted, or refused with a reason naming both sides."""

    accepted: bool
    reason: str = ""


class Need(BaseModel):
    """One thing a run needs from its worker, and where that was asked."""

    value: str
    source: str


def _merge(needs: dict[str, Need], key: str, value: str | None, source: str) -> str | None:
    """Record ``value`` for ``key``; return a conflict message if another source asked otherwise."""
    if value is None:
        return None
    have = needs.get(key)
    if have is None:
        needs[key] = Need(value=value, source=source)
        return None
    if have.value != value:
        return f"the run asks for {key} {have.value!r} ({have.source}) and {value!r} ({source})"
    return None


def _as_mapping(value: Any) -> Mapping[str, Any]:
    """A parameter as the API holds it (a mapping), whether it came as a model or a dict."""
    if isinstance(value, BaseModel):
        return value.model_dump()
    return value if isinstance(value, Mapping) else {}


def _target_kind(spec: Any) -> str | None:
    """The kind of a spec parameter's target (the spec's default, xnnpack, when unset)."""
    if spec is None:
        return None
    target = _as_mapping(spec).get("target", "xnnpack")
    return str(target.get("kind")) if isinstance(target, Mapping) else str(target)


def describe_run(flow_run_name: str, parameters: Mapping[str, Any]) -> str:
    """What a run builds, for a worker's terminal: ``model version target`` (a matrix: its targets), and its name."""
    spec = _as_mapping(parameters.get("spec"))
    if not spec:
        return flow_run_name
    targets = parameters.get("targets")
    what = (", ".join(str(_target_kind(cell)) for cell in targets) + " (matrix)"
            if isinstance(targets, list) else _target_kind(spec))
    return f"{spec.get('name')} {spec.get('version')} {what} ({flow_run_name})"


def describe_worker(toolchain: Toolchain, gpu_index: int | None = None) -> str:
    """The worker side of a refusal: channel, torch, GPU and TensorRT."""
    channel = toolchain.cuda_channel or "no CUDA"
    gpu = _gpu(toolchain, gpu_index)
    gpu_text = f"GPU {gpu.index} {gpu.name} {gpu.sm}" if gpu else "no GPU"
    trt = f"TensorRT {toolchain.tensorrt}" if toolchain.tensorrt else "no TensorRT"
    return f"{channel} (torch {toolchain.torch}), {gpu_text}, {trt}"


def _gpu(toolchain: Toolchain, gpu_index: int | None) -> GpuInfo | None:
    wanted = 0 if gpu_index is None else gpu_index
    return next((g for g in toolchain.gpus if g.index == wanted), None)


def _fits(want: str, have: str) -> bool:
    """Whether arch ``have`` serves ``want`` (``sm80plus``: any arch from 80 up)."""
    return sm_number(have) >= sm_number(want) if want.endswith("plus") else sm_number(have) == sm_number(want)


def requirements(
    parameters: Mapping[str, Any], job_variables: Mapping[str, Any], pool: str | None, queue: str | None
) -> tuple[dict[str, Need], list[str]]:
    """What a run needs (channel, sm, tensorrt) and from where, plus every contradiction between sources."""
    needs: dict[str, Need] = {}
    conflicts: list[str] = []
    placement = _as_mapping(parameters.get("placement"))
    channel = placement.get("channel")
    for key, value, source in (
        ("channel", None if channel == "cpu" else channel, "parameter placement.channel"),
        ("channel", job_variables.get("cuda_channel"), "job variable cuda_channel"),
        ("channel", channel_of_pool(pool), f"work pool {pool!r}"),
        ("sm", placement.get("sm"), "parameter placement.sm"),
        ("sm", job_variables.get("sm"), "job variable sm"),
        ("tensorrt", placement.get("tensorrt"), "parameter placement.tensorrt"),
        ("tensorrt", job_variables.get("tensorrt"), "job variable tensorrt"),
    ):
        conflict = _merge(needs, key, value, source)
        if conflict:
            conflicts.append(conflict)
    if queue and parse_sm(queue) is not None:
        if "sm" not in needs:
            needs["sm"] = Need(value=queue, source=f"work queue {queue!r}")
        elif not _fits(needs["sm"].value, queue):
            conflicts.append(f"the run asks for sm {needs['sm'].value!r} ({needs['sm'].source}) but sits in queue {queue!r}")
    return needs, conflicts


def route(
    parameters: Mapping[str, Any],
    job_variables: Mapping[str, Any],
    pool: str | None,
    queue: str | None,
    toolchain: Toolchain,
    gpu_index: int | None = None,
) -> Decision:
    """Accept a flow run, or refuse it with a reason naming what it needs and what this worker is.

    A run with ``targets`` (a matrix or a retrain) only dispatches builds elsewhere, so its spec's
    target asks nothing of this worker; a build run's spec target, ``placement`` parameter, the
    job variables ``cuda_channel``/``sm``/``tensorrt`` and the pool/queue names all must agree.
    """
    needs, conflicts = requirements(parameters, job_variables, pool, queue)
    if conflicts:
        return Decision(accepted=False, reason="; ".join(conflicts) + "; fix the deployment or the run's parameters")
    refusals: list[str] = []
    kind = None if "targets" in parameters else _target_kind(parameters.get("spec"))
    gpu = _gpu(toolchain, gpu_index)
    if kind is not None and needs_cuda(kind) and (not toolchain.cuda_available or gpu is None):
        refusals.append(f"spec target {kind!r} needs a CUDA GPU")
    wrong_channel = "channel" in needs and needs["channel"].value != toolchain.cuda_channel
    if wrong_channel:
        refusals.append(f"the run needs CUDA channel {needs['channel'].value} ({needs['channel'].source})")
    if "sm" in needs and not (gpu and _fits(needs["sm"].value, gpu.sm)):
        refusals.append(f"the run needs GPU arch {needs['sm'].value} ({needs['sm'].source})")
    if "tensorrt" in needs and not (toolchain.tensorrt or "").startswith(needs["tensorrt"].value):
        refusals.append(f"the run needs TensorRT {needs['tensorrt'].value} ({needs['tensorrt'].source})")
    if not refusals:
        return Decision(accepted=True)
    reason = "; ".join(refusals) + f", but this worker is {describe_worker(toolchain, gpu_index)}"
    if wrong_channel and job_variables.get("install"):
        reason += f"; run it on a worker that has the {needs['channel'].value} toolchain ({job_variables['install']})"
    return Decision(accepted=False, reason=reason)
