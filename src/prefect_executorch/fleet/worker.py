"""The ``executorch`` worker type: a process worker that knows its toolchain and refuses runs it cannot build.

At start it takes the probe the CLI made (``$PREFECT_EXECUTORCH_WORKER_TOOLCHAIN``) or probes in
a child process (so the worker holds no CUDA context), and creates one concurrency limit per GPU.
Each flow run is routed through ``placement.route``: a run that needs another CUDA channel, GPU
arch or TensorRT version is marked Failed with a message naming both sides and is never started.
Registered through the ``prefect.collections`` entry point, so ``prefect worker start --type
executorch`` finds it too.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

import anyio.abc
from prefect.client.schemas.objects import FlowRun
from prefect.states import Failed
from prefect.utilities.engine import propose_state
from prefect.workers.process import ProcessJobConfiguration, ProcessVariables, ProcessWorker, ProcessWorkerResult
from pydantic import Field

from prefect_executorch.fleet.gpu_slots import GPU_ENV, ensure_gpu_limits
from prefect_executorch.fleet.placement import Decision, describe_run, route
from prefect_executorch.machine.toolchain import Toolchain, probe_isolated
from prefect_executorch.settings import WorkerSettings, read_settings
from prefect_executorch.stopping import exit_after, exit_status, kill_descendants

WORKER_TYPE = "executorch"
#: WorkerSettings' variables. This one: a probe to use instead of probing (JSON), for a worker started by
#: ``prefect worker start`` from a process that has probed already.
TOOLCHAIN_ENV = "PREFECT_EXECUTORCH_WORKER_TOOLCHAIN"
#: The GPU index this worker is pinned to; its runs see only that GPU.
WORKER_GPU_ENV = "PREFECT_EXECUTORCH_WORKER_GPU"
#: Seconds between a run's heartbeats (Prefect's default is 180, its floor 30): the lost-run automation
#: of deployments/automations.yaml marks a run Crashed after 90 s without one.
HEARTBEAT_S = 30
#: Flow-run label prefix for what the worker advertises.
LABEL_PREFIX = "executorch."
#: Seconds a stopping worker lets Prefect end its loops and flow runs before it kills what is left and exits.
STOP_GRACE_S = 8.0
#: How often a stop is asked again: Prefect's start-up and polling code can swallow one task cancellation.
RECANCEL_S = 0.5
#: Seconds a stopping worker gives Prefect's runner to report the runs it killed before it marks them itself.
RUNS_REPORTED_S = 3.0

_CHANNEL_HELP = "CUDA channel runs of this pool need: cu130, cu132 or cu134 (unset for CPU pools)."
_SM_HELP = "GPU arch a run needs: sm80, sm90, sm100, or sm80plus for hardware-compatible engines."
_TRT_HELP = "TensorRT version prefix a run's engines need, e.g. 11.1."
_INSTALL_HELP = "The channel's install command, quoted when a worker lacks the toolchain."


class ExecutorchJobConfiguration(ProcessJobConfiguration):
    """Process job configuration plus what the run needs from its worker."""

    cuda_channel: str | None = Field(default=None, description=_CHANNEL_HELP)
    sm: str | None = Field(default=None, description=_SM_HELP)
    tensorrt: str | None = Field(default=None, description=_TRT_HELP)
    install: str | None = Field(default=None, description=_INSTALL_HELP)

    def requirements(self) -> dict[str, str | None]:
        """The job variables ``route`` reads."""
        return {"cuda_channel": self.cuda_channel, "sm": self.sm, "tensorrt": self.tensorrt, "install": self.install}


class ExecutorchVariables(ProcessVariables):
    """Job variables a pool or deployment may set."""

    cuda_channel: str | None = Field(default=None, description=_CHANNEL_HELP)
    sm: str | None = Field(default=None, description=_SM_HELP)
    tensorrt: str | None = Field(default=None, description=_TRT_HELP)
    install: str | None = Field(default=None, description=_INSTALL_HELP)


def worker_toolchain() -> Toolchain:
    """The toolchain the CLI passed in the environment, else a fresh probe in a child process."""
    passed = read_settings(WorkerSettings).toolchain
    # The probe's child, not the worker, imports torch and touches the GPU: the worker holds no CUDA
    # context. A spawned child: a forkserver would keep torch's imports resident for the worker's life.
    return Toolchain.model_validate_json(passed) if passed else probe_isolated(start="spawn")


def advertised(toolchain: Toolchain, gpu_index: int | None) -> dict[str, str]:
    """What a worker advertises: channel, SM, TensorRT, GPU (flow-run labels and worker metadata)."""
    gpu = next((g for g in toolchain.gpus if g.index == (gpu_index or 0)), None)
    return {
        f"{LABEL_PREFIX}cuda_channel": toolchain.cuda_channel or "cpu",
        f"{LABEL_PREFIX}sm": gpu.sm if gpu else "none",
        f"{LABEL_PREFIX}tensorrt": toolchain.tensorrt or "none",
        f"{LABEL_PREFIX}gpu": f"{gpu.index}:{gpu.name}" if gpu else "none",
        f"{LABEL_PREFIX}host": toolchain.hostname,
    }


def default_worker_name(toolchain: Toolchain, gpu_index: int | None, pid: int) -> str:
    """``<host>-<channel>-<sm>-trt<version>[-gpu<i>]-pid<pid>``, e.g. ``h200a-cu132-sm90-trt11.1.0-gpu0-pid4711``.

    The process id tells apart workers started alike on one host: Prefect takes workers of one name for one
    (two terminals showed as one worker, still online after one of them was killed).
    """
    facts = advertised(toolchain, gpu_index)
    parts = [toolchain.hostname or "worker", facts[f"{LABEL_PREFIX}cuda_channel"], facts[f"{LABEL_PREFIX}sm"],
             "trt" + facts[f"{LABEL_PREFIX}tensorrt"]]
    if gpu_index is not None:
        parts.append(f"gpu{gpu_index}")
    parts.append(f"pid{pid}")
    return "-".join(parts).replace("/", "-").replace("%", "-")


class ExecutorchWorker(ProcessWorker):
    """Process worker for prefect-executorch builds, matched to its CUDA channel and GPU arch."""

    type = WORKER_TYPE
    job_configuration = ExecutorchJobConfiguration  # type: ignore[assignment]
    job_configuration_variables = ExecutorchVariables  # type: ignore[assignment]
    _description = (
        "Runs prefect-executorch flows as subprocesses; probes its toolchain at start and refuses "
        "runs that need another CUDA channel, GPU arch or TensorRT version."
    )
    _display_name = "ExecuTorch build worker"
    _documentation_url = "https://github.com/prefect-executorch/prefect-executorch/blob/main/docs/fleet.md"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.toolchain: Toolchain | None = None
        self.gpu_index = read_settings(WorkerSettings).gpu
        #: The flow runs this worker has started and Prefect's runner has not finished with.
        self.in_flight: set[UUID] = set()
        #: Flow runs whose crash Prefect's runner has reported: the base worker must not report it again.
        self.crash_reported: set[UUID] = set()

    async def setup(self) -> None:
        """Probe first (unless the CLI did), so a worker that cannot probe never polls."""
        self.toolchain = self.toolchain or worker_toolchain()
        self._logger.info("toolchain: %s", json.dumps(advertised(self.toolchain, self.gpu_index)))
        await super().setup()
        indexes = [self.gpu_index] if self.gpu_index is not None else [g.index for g in self.toolchain.gpus]
        if indexes:
            names = await anyio.to_thread.run_sync(ensure_gpu_limits, self.toolchain.hostname, indexes)
            self._logger.info("one engine build at a time per GPU: concurrency limits %s", names)

    async def _worker_metadata(self) -> Any:
        metadata = await super()._worker_metadata()
        if metadata is not None and self.toolchain is not None:
            metadata.executorch = advertised(self.toolchain, self.gpu_index)  # type: ignore[attr-defined]
        return metadata

    def decide(self, flow_run: FlowRun, configuration: ExecutorchJobConfiguration) -> Decision:
        """Route ``flow_run`` against this worker's toolchain."""
        assert self.toolchain is not None, "setup() probes the toolchain before any run"
        return route(flow_run.parameters or {}, configuration.requirements(), self._work_pool_name,
                     flow_run.work_queue_name, self.toolchain, self.gpu_index)

    async def run(
        self,
        flow_run: FlowRun,
        configuration: ExecutorchJobConfiguration,  # type: ignore[override]
        task_status: anyio.abc.TaskStatus[int] | None = None,
    ) -> ProcessWorkerResult:
        """Refuse a mismatched run (Failed, with the reason), else run it pinned to this worker's GPU."""
        assert self.toolchain is not None, "setup() probes the toolchain before any run"
        labels: dict[str, bool | int | float | str] = {**advertised(self.toolchain, self.gpu_index)}
        await self.client.update_flow_run_labels(flow_run.id, labels)
        decision = self.decide(flow_run, configuration)
        if not decision.accepted:
            message = f"refused by worker {self.name!r}: {decision.reason}"
            self.get_flow_run_logger(flow_run).error(message)
            await propose_state(self.client, Failed(message=message), flow_run_id=flow_run.id)
            if task_status is not None:
                task_status.started(-1)
            return ProcessWorkerResult(status_code=0, identifier="refused")
        configuration.env.setdefault("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", str(HEARTBEAT_S))
        if self.gpu_index is not None:
            # The run's environment, not a setting read: CUDA's own variable and the GPU setting of the flow run.
            configuration.env.update({"CUDA_VISIBLE_DEVICES": str(self.gpu_index), GPU_ENV: str(self.gpu_index)})
        what = describe_run(flow_run.name, flow_run.parameters or {})
        self._logger.info("picked up %s", what)
        started = time.monotonic()
        self.in_flight.add(flow_run.id)
        try:
            result = await super().run(flow_run, configuration, task_status)
        finally:
            self.in_flight.discard(flow_run.id)
        took = time.monotonic() - started
        if result.status_code != 0:
            # Prefect's runner has reported this exit as Crashed already; its base worker would report it again on
            # the status code, 2 s later, and the retry automation answers every Crashed event: by then the run was
            # scheduled again, so one crash was retried twice and one build ran on two workers at once.
            self.crash_reported.add(flow_run.id)
        # What follows is the terminal's line and tidying up: an API error here must not fail the run's submission.
        try:
            if result.status_code == 0:  # the run's process set its final state before it exited
                ended = (await self.client.read_flow_run(flow_run.id)).state_name
                self._logger.info("finished %s: %s in %.0f s", what, ended, took)
            else:  # by now the run may be retried elsewhere: its state is no longer this attempt's
                self._logger.info("finished %s: Crashed in %.0f s (its process exited with %s)", what, took,
                                  result.status_code)
                await self._crash_task_runs_of(flow_run)
        except Exception as exc:  # noqa: BLE001 - httpx and Prefect raise many types
            self._logger.warning("finished %s in %.0f s; could not read or tidy its run: %s", what, took, exc)
        return result

    async def _propose_crashed_state(self, flow_run: FlowRun, message: str, client: Any = None) -> None:
        if flow_run.id in self.crash_reported:
            self.crash_reported.discard(flow_run.id)
            return
        await super()._propose_crashed_state(flow_run, message, client)

    async def _crash_task_runs_of(self, flow_run: FlowRun) -> None:
        """Mark Crashed the task runs the dead attempt left Running or Pending (no process will end them)."""
        from prefect.client.schemas.filters import (
            FlowRunFilter,
            FlowRunFilterId,
            TaskRunFilter,
            TaskRunFilterState,
            TaskRunFilterStateType,
        )
        from prefect.client.schemas.objects import StateType
        from prefect.states import Crashed

        # The attempt this worker started: the run entered Running once more than when it was submitted. A retry
        # elsewhere (its run count one higher) may be running already; its task runs are left alone.
        attempt = flow_run.run_count + 1
        left = await self.client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])),
            task_run_filter=TaskRunFilter(state=TaskRunFilterState(
                type=TaskRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING]))))
        # A task run that never ran has run count 0 (the server sets it on Running): created before the retry ran,
        # it is this attempt's. Read after the task runs, a run count still this attempt's says no retry had any.
        no_retry_yet = (await self.client.read_flow_run(flow_run.id)).run_count == attempt
        for task_run in left:
            if task_run.flow_run_run_count == attempt or (task_run.flow_run_run_count == 0 and no_retry_yet):
                await self.client.set_task_run_state(
                    task_run.id, Crashed(message="its flow-run process died while it ran"), force=True)


def serve(worker: ExecutorchWorker, *, run_once: bool, with_healthcheck: bool, printer: Callable[[str], None]) -> None:
    """Run ``worker`` in this process until its loops end, or until SIGINT/SIGTERM stops it within ``STOP_GRACE_S``.

    Prefect's ``worker start`` forwards a signal as one cancellation of its main task, which its start-up
    and polling code can swallow: the worker then ran on after Ctrl-C and ``systemctl stop``. Here a stop
    first kills the flow runs in flight while Prefect's runner still watches them, so that it reports each
    Crashed as for any dead run process (tagged runs are then retried once, elsewhere); a run it has not
    reported within ``RUNS_REPORTED_S`` is marked Crashed here. Then the worker is cancelled until it is
    gone. Whatever still runs at the deadline is killed; a second signal stops at once.
    """
    asyncio.run(_serve(worker, run_once, with_healthcheck, printer))


async def _serve(worker: ExecutorchWorker, run_once: bool, with_healthcheck: bool,
                 printer: Callable[[str], None]) -> None:
    loop = asyncio.get_running_loop()
    received: list[int] = []
    stop = asyncio.Event()

    def on_signal(signum: int) -> None:
        name = signal.Signals(signum).name
        if received:
            printer(f"Received {name} again: worker {worker.name!r} and its flow runs killed")
            kill_descendants()
            os._exit(exit_status(signum))
        received.append(signum)
        printer(f"Received {name}: stopping worker {worker.name!r} and its flow runs (at most {STOP_GRACE_S:g} s)")
        stop.set()
        killed = f"Worker {worker.name!r} did not stop within {STOP_GRACE_S:g} s: it and its flow runs killed"
        exit_after(STOP_GRACE_S, exit_status(signum), lambda: killed, killed)

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    serving = asyncio.ensure_future(worker.start(run_once=run_once, with_healthcheck=with_healthcheck, printer=printer))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait([serving, stopping], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if received:
        await _end_flow_runs(worker, signal.Signals(received[0]).name, printer)
    while not serving.done():
        serving.cancel()
        await asyncio.wait([serving], timeout=RECANCEL_S)
    if received:
        printer(f"Worker {worker.name!r} stopped!")
    elif serving.exception() is not None:
        raise serving.exception()  # type: ignore[misc]


async def _end_flow_runs(worker: ExecutorchWorker, signal_name: str, printer: Callable[[str], None]) -> None:
    """Kill the flow runs in flight; mark Crashed those Prefect's runner has not reported within ``RUNS_REPORTED_S``."""
    from prefect import get_client
    from prefect.states import Crashed

    if not worker.in_flight:
        return
    kill_descendants()
    deadline = asyncio.get_running_loop().time() + RUNS_REPORTED_S
    while worker.in_flight and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)
    message = f"worker {worker.name!r} was stopped ({signal_name}) while the run was in flight; its process was killed"
    async with get_client() as client:
        for flow_run_id in sorted(worker.in_flight):
            await propose_state(client, Crashed(message=message), flow_run_id=flow_run_id)
            printer(f"flow run {flow_run_id} marked Crashed: {message}")
