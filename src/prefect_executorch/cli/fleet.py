"""Commands of a Prefect fleet: ``deploy`` the flows, start a ``worker``, request a ``retrain``."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from prefect_executorch.cli.app import STORE_ENV, app, console, err_console, handle_errors


@app.command()
@handle_errors
def deploy(
    prefect_file: Path = typer.Option(Path("deployments/prefect.yaml"), "--prefect-file", help="The prefect.yaml to deploy."),
    store: str | None = typer.Option(None, "--store",
                                        help="Bundle store the deployments publish to ({{ $PREFECT_EXECUTORCH_STORE }})."),
    name: list[str] = typer.Option([], "--name", help="Deploy only these 'flow/deployment' names (default: all)."),
    project_dir: Path = typer.Option(Path("."), "--project-dir", help="Where runs start (relative model paths resolve here)."),
    automations: Path | None = typer.Option(
        Path("deployments/automations.yaml"), "--automations", help="Automations to apply after the deployments."),
) -> None:
    """Create the work pools and queues the deployments need, `prefect deploy` them, then apply the automations."""
    from prefect_executorch.errors import SpecError
    from prefect_executorch.fleet.deploy import plan_pools, prepare_pools, run_prefect_deploy
    from prefect_executorch.fleet.server import require_prefect_api
    from prefect_executorch.settings import get_settings

    store = store or get_settings().store
    if not store:
        raise SpecError(f"--store: not set; pass --store s3://bucket/prefix (or set {STORE_ENV})")
    # Not a setting read: prefect.yaml's {{ $PREFECT_EXECUTORCH_STORE }} takes the chosen store from `prefect deploy`'s env.
    os.environ[STORE_ENV] = store
    plans = plan_pools(prefect_file)
    require_prefect_api()
    for line in prepare_pools(plans):
        console.print(f"created {line}")
    run_prefect_deploy(prefect_file, project_dir, name)
    if automations is not None and automations.exists():
        from prefect_executorch.fleet.automations import apply_automations_file

        for line in apply_automations_file(automations):
            console.print(line)
    elif automations is not None:
        console.print(f"no automations file at {automations}: none applied")
    console.print(f"[bold green]deployed[/] {', '.join(name) if name else 'all deployments of ' + str(prefect_file)}"
                  f" to pools {', '.join(p.name for p in plans)}")


@app.command()
@handle_errors
def worker(
    pool: str = typer.Option(..., "--pool", help="Work pool: gpu-cu130, gpu-cu132, gpu-cu134 or cpu."),
    queue: list[str] = typer.Option([], "--queue", help="Queues to poll (default: all of the pool), e.g. sm90."),
    gpu: int | None = typer.Option(None, "--gpu", help="Pin to this GPU index (one worker per GPU)."),
    name: str | None = typer.Option(None, "--name", help="Worker name (default: host-channel-sm-trt[-gpuN])."),
    limit: int | None = typer.Option(None, "--limit", help="Most concurrent flow runs."),
    run_once: bool = typer.Option(False, "--run-once", help="Poll once, wait for the runs, exit."),
    healthcheck: bool = typer.Option(False, "--with-healthcheck", help="Serve /health on 127.0.0.1."),
) -> None:
    """Probe this machine and start an `executorch` worker that refuses runs for another channel or GPU arch."""
    from prefect.settings import temporary_settings

    from prefect_executorch.errors import ToolchainMismatch
    from prefect_executorch.fleet.deploy import plan_pool, prepare_pools
    from prefect_executorch.fleet.placement import channel_of_pool, describe_worker
    from prefect_executorch.fleet.server import require_prefect_api
    from prefect_executorch.fleet.worker import (
        WORKER_GPU_ENV,
        ExecutorchWorker,
        default_worker_name,
        serve,
        worker_toolchain,
    )

    toolchain = worker_toolchain()  # in a child: the worker itself never imports torch nor holds a CUDA context
    if gpu is not None and gpu not in [g.index for g in toolchain.gpus]:
        raise ToolchainMismatch(f"--gpu: no GPU {gpu} here; this machine has {describe_worker(toolchain)}")
    require_prefect_api()  # what the command line says is checked first: it needs no server
    channel = channel_of_pool(pool)
    if channel and channel != toolchain.cuda_channel:
        err_console.print(f"[yellow]warning:[/] pool {pool} builds for {channel} but this machine is "
                          f"{describe_worker(toolchain, gpu)}: every run will be refused")
    prepare_pools([plan_pool(pool, tuple(queue))])
    worker_name = name or default_worker_name(toolchain, gpu, os.getpid())
    # This process's environment, not a setting read: the flow runs it starts inherit the pin.
    if gpu is not None:
        os.environ[WORKER_GPU_ENV] = str(gpu)
    worker_process = ExecutorchWorker(name=worker_name, work_pool_name=pool, work_queues=queue or None, limit=limit)
    worker_process.toolchain = toolchain
    console.print(f"starting worker {worker_name} on pool {pool}: {describe_worker(toolchain, gpu)}")
    # Prefect's default is 0.0.0.0; an operator's own PREFECT_WORKER_WEBSERVER_HOST still wins.
    host = {} if "PREFECT_WORKER_WEBSERVER_HOST" in os.environ else {"worker.webserver.host": "127.0.0.1"}
    with temporary_settings(updates=host):
        serve(worker_process, run_once=run_once, with_healthcheck=healthcheck,
              printer=lambda line: console.print(line, markup=False, highlight=False))


@app.command()
@handle_errors
def retrain(
    name: str = typer.Argument(..., metavar="NAME", help="Model name (the spec's name in its retrain deployment)."),
    weights: str = typer.Option(..., "--weights", help="New state dict: s3://bucket/key or a path the workers can read."),
    sha256: str | None = typer.Option(None, "--sha256", help="Expected sha256 of the weights (default: computed from a local file)."),
    version: str | None = typer.Option(None, "--version", help="Version to publish (default: <spec version>-<sha256[:12]>)."),
    reason: str = typer.Option("", "--reason", help="Free text: why the model was retrained."),
    training_run: str | None = typer.Option(None, "--training-run", help="Id of the training run (the bundle's lineage)."),
) -> None:
    """Emit `model.retrain.requested` for NAME: the hook a training pipeline calls when new weights are ready."""
    from prefect.settings import PREFECT_API_URL

    from prefect_executorch.errors import SpecError
    from prefect_executorch.fleet.retrain_event import EVENT, emit_retrain, parse_request
    from prefect_executorch.fleet.server import require_prefect_api
    from prefect_executorch.hashing import sha256_file

    if not PREFECT_API_URL.value():
        raise SpecError("PREFECT_API_URL: not set; point it at the server that runs the retrain deployment")
    if sha256 is None and "://" not in weights and Path(weights).is_file():
        sha256 = sha256_file(weights)
    request = parse_request({"name": name, "weights_uri": weights, "weights_sha256": sha256, "version": version,
                             "reason": reason, "training_run": training_run})
    require_prefect_api()  # after the request is checked: a bad one needs no server to be refused
    event_id = emit_retrain(request)
    console.print(f"emitted {EVENT} for {request.resource_id} (event {event_id})")
