"""What a worker tidies once a flow-run process it started has died: the task runs that attempt left unfinished."""

from __future__ import annotations

import asyncio
from typing import Any

from prefect import flow, task
from prefect.states import Pending, Running, Scheduled

from prefect_executorch.fleet.worker import ExecutorchWorker


@flow
def killed_build() -> None:
    """Only its name is used: the runs below are made through the API, as a worker's flow-run process makes them."""


@task
def step() -> None:
    """Its task runs stand for the build's export and build-and-publish."""


async def _task_run(client: Any, run_id: Any, key: str, running: bool) -> Any:
    made = await client.create_task_run(step, flow_run_id=run_id, dynamic_key=key, state=Pending())
    if running:
        await client.set_task_run_state(made.id, Running())  # the server stamps the flow run's run count on it
    return made.id


async def _tidy(retried: bool) -> dict[str, str]:
    from prefect import get_client

    async with get_client() as client:
        run = await client.create_flow_run(killed_build, state=Scheduled())
        submitted = await client.read_flow_run(run.id)  # what the worker held when it started the process
        await client.set_flow_run_state(run.id, Running())
        ids = {"ran": await _task_run(client, run.id, "ran", running=True),
               "never ran": await _task_run(client, run.id, "never-ran", running=False)}
        if retried:  # a retry elsewhere is running already; its own first task run has not started yet
            await client.set_flow_run_state(run.id, Scheduled(), force=True)
            await client.set_flow_run_state(run.id, Running(), force=True)
            ids = {"ran": ids["ran"], "retry's, not yet run": await _task_run(client, run.id, "retry", running=False)}
        async with ExecutorchWorker(work_pool_name="tidy-test") as worker:
            await worker._crash_task_runs_of(submitted)
        return {name: (await client.read_task_run(task_id)).state_name for name, task_id in ids.items()}


def test_every_task_run_of_the_dead_attempt_is_crashed_even_one_that_never_ran(prefect_harness: None) -> None:
    """A build killed as it created a task run left it Pending with run count 0 (CI, 2026-12-05): it too is Crashed."""
    assert asyncio.run(_tidy(retried=False)) == {"ran": "Crashed", "never ran": "Crashed"}


def test_a_retry_that_already_runs_keeps_its_task_runs(prefect_harness: None) -> None:
    assert asyncio.run(_tidy(retried=True)) == {"ran": "Crashed", "retry's, not yet run": "Pending"}
