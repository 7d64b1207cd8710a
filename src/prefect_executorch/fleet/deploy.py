"""Work pools per CUDA channel and queues per GPU arch, created before ``prefect deploy`` runs."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from prefect_executorch.errors import DeployFailed, SpecError
from prefect_executorch.fleet.placement import DEFAULT_QUEUE, GPU_ARCHS, channel_of_pool, pool_install_command


class PoolPlan(BaseModel):
    """A work pool a prefect.yaml needs, with its queues."""

    name: str
    queues: list[str]


def pool_template(pool: str) -> dict[str, Any]:
    """The ``executorch`` worker's default base job template, with the channel and its install line as defaults."""
    from prefect_executorch.fleet.worker import ExecutorchWorker

    template = copy.deepcopy(ExecutorchWorker.get_default_base_job_template())
    channel = channel_of_pool(pool)
    if channel:
        properties = template["variables"]["properties"]
        properties["cuda_channel"]["default"] = channel
        properties["install"]["default"] = pool_install_command(channel)
    return template


def plan_pool(pool: str, queues: list[str] | tuple[str, ...] = ()) -> PoolPlan:
    """A pool with its default queue, one queue per GPU arch if it is a GPU pool, and ``queues``."""
    names = {DEFAULT_QUEUE, *queues, *(GPU_ARCHS if channel_of_pool(pool) else ())}
    return PoolPlan(name=pool, queues=sorted(names))


def plan_pools(prefect_file: Path) -> list[PoolPlan]:
    """The pools a prefect.yaml deploys to, with their queues."""
    try:
        config = yaml.safe_load(prefect_file.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError(f"prefect file: cannot read {str(prefect_file)!r}: {exc}") from None
    queues: dict[str, set[str]] = {}
    for index, deployment in enumerate(config.get("deployments") or []):
        pool = (deployment.get("work_pool") or {}).get("name")
        if not pool:
            raise SpecError(f"deployments[{index}].work_pool.name: missing in {prefect_file}; name the pool to run on")
        queue = deployment["work_pool"].get("work_queue_name")
        queues.setdefault(pool, set()).update([queue] if queue else [])
    return [plan_pool(pool, tuple(names)) for pool, names in sorted(queues.items())]


async def ensure_pools(plans: list[PoolPlan]) -> list[str]:
    """Create each missing pool (type ``executorch``, channel template) and queue; return what was created."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    from prefect_executorch.fleet.worker import WORKER_TYPE

    created: list[str] = []
    async with get_client() as client:
        for plan in plans:
            try:
                await client.read_work_pool(plan.name)
            except ObjectNotFound:
                await client.create_work_pool(
                    WorkPoolCreate(name=plan.name, type=WORKER_TYPE, base_job_template=pool_template(plan.name))
                )
                created.append(f"pool {plan.name}")
            existing = {queue.name for queue in await client.read_work_queues(work_pool_name=plan.name)}
            for queue in plan.queues:
                if queue not in existing:
                    try:
                        await client.create_work_queue(name=queue, work_pool_name=plan.name)
                        created.append(f"queue {plan.name}/{queue}")
                    except ObjectAlreadyExists:
                        pass  # created by a concurrent deploy
    return created


def prepare_pools(plans: list[PoolPlan]) -> list[str]:
    """``ensure_pools`` from sync code; an unreachable API is a ``DeployFailed`` naming the URL."""
    import asyncio

    import httpx
    from prefect.settings import PREFECT_API_URL

    try:
        return asyncio.run(ensure_pools(plans))
    except httpx.HTTPError as exc:
        raise DeployFailed(
            f"cannot create work pools at {PREFECT_API_URL.value() or 'the ephemeral API'}: {exc}; "
            "start a server (`prefect server start`) and set PREFECT_API_URL"
        ) from None


def run_prefect_deploy(prefect_file: Path, project_dir: Path, names: list[str] | None = None) -> None:
    """``prefect --no-prompt deploy --all`` (or ``--name`` each) from ``project_dir``, which the runs' working directory becomes."""
    selection = [arg for name in names for arg in ("--name", name)] if names else ["--all"]
    command = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--prefect-file", str(prefect_file.resolve()),
               *selection]
    result = subprocess.run(command, cwd=project_dir, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-3000:]
        raise DeployFailed(f"prefect deploy of {prefect_file} failed (exit {result.returncode}):\n{tail}")
