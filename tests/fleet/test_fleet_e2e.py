"""The fleet for real: `prefect server start`, `prefect-executorch deploy`, workers as subprocesses.

One server, one CPU worker and a SeaweedFS bucket as the store for the module; a deployed matrix
build, an event-triggered retrain that moves `staging-<compat>`, a run refused by a worker whose pool's
channel this machine does not have, and the automations: a publish event moves `staging-<compat>`, a
failed validation posts to a notification webhook, a flow run whose process dies is marked Crashed.
Every process is started with Popen and stopped by its pid.
"""

from __future__ import annotations

import datetime
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from prefect_executorch.artifacts.aliases import read_alias
from prefect_executorch.artifacts.manifest import BundleKey
from prefect_executorch.artifacts.publishing import pull, read_manifest
from prefect_executorch.artifacts.urls import open_store
from prefect_executorch.hashing import sha256_file
from prefect_executorch.testing.prefect_server import CLI, PrefectServer, tail
from prefect_executorch.testing.seaweedfs import free_port

from helpers import cpu_burner, set_aws_env, settled

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
MODEL = "small-convnet"


class Fleet(PrefectServer):
    """The module's server on SQLite, its store, and the processes started against it."""

    def __init__(self, home: Path, store: str) -> None:
        super().__init__(
            home, f"sqlite+aiosqlite:///{home / 'prefect.db'}", ROOT,
            PREFECT_EXECUTORCH_STORE=store,
            # Prefect's cancellation cleanup cancels the builds of a cancelled matrix; every 20 s by default.
            PREFECT_SERVER_SERVICES_CANCELLATION_CLEANUP_LOOP_SECONDS="2",
            # The runs' scratch directories, so a test can see that none is left behind.
            TMPDIR=str(home / "tmp"),
        )
        self.store = store
        self.health_port = 0
        self.lost_node: LostNode


def _variant(tmp: Path) -> Path:
    """deployments/prefect.yaml for this machine: the CPU cell only, and one GPU pool to be refused in.

    The retrain keeps its cu134 cell too: no worker serves that pool, so the shipped `on_missing_pool: skip`
    leaves it out, with the reason, and the retrain finishes.
    """
    config = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    keep = {"cpu", "gpu-cu132", "small-convnet-nightly", MODEL, "manual", "staging"}
    config["deployments"] = [d for d in config["deployments"] if d["name"] in keep]
    for deployment in config["deployments"]:
        params = deployment.get("parameters", {})
        if "targets" in params:
            cells = params["targets"]
            params["targets"] = [cell for cell in cells if cell["placement"]["channel"] == "cpu"][:1]
            if deployment["name"] == MODEL:
                params["targets"] += [cell for cell in cells if cell["placement"]["channel"] == "cu134"]
    path = tmp / "prefect.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fleet")
    with pytest.MonkeyPatch.context() as patch:
        set_aws_env(patch, s3_server)  # this process and every child reach SeaweedFS, nothing else
        fleet = Fleet(tmp / "home", f"s3://{s3_server.make_bucket()}/bundles")
        fleet.home.mkdir()
        (fleet.home / "tmp").mkdir()
        try:
            fleet.start_server()
            deployed = fleet.cli("deploy", "--prefect-file", str(_variant(tmp)))
            assert deployed.returncode == 0, deployed.stdout + deployed.stderr
            fleet.health_port = free_port()
            fleet.start("worker-cpu", [*CLI, "worker", "--pool", "cpu", "--limit", "4", "--with-healthcheck"],
                        PREFECT_WORKER_WEBSERVER_PORT=str(fleet.health_port))
            fleet.lost_node = LostNode(fleet)
            yield fleet
        finally:
            fleet.stop_all()
    assert all(proc.poll() is not None for proc in fleet.procs)


def _client(fleet: Fleet) -> Any:
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    class _Ctx:
        def __enter__(self) -> Any:
            self.settings = temporary_settings(updates={PREFECT_API_URL: fleet.url})
            self.settings.__enter__()
            self.client = get_client(sync_client=True).__enter__()
            return self.client

        def __exit__(self, *exc: Any) -> None:
            self.client.__exit__(*exc)
            self.settings.__exit__(*exc)

    return _Ctx()


def _wait_final(fleet: Fleet, flow_run_id: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    with _client(fleet) as client:
        while True:
            run = client.read_flow_run(flow_run_id)
            if run.state and run.state.is_final():
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"flow run {run.name} still {run.state_name}:\n{tail(fleet.home / 'worker-cpu.log')}")
            time.sleep(1)


def _run(fleet: Fleet, deployment: str, parameters: dict[str, Any] | None = None, queue: str | None = None) -> Any:
    with _client(fleet) as client:
        dep = client.read_deployment_by_name(deployment)
        run = client.create_flow_run_from_deployment(dep.id, parameters=parameters or {}, work_queue_name=queue)
    return run.id


def test_deployments_pools_and_schedule(fleet: Fleet) -> None:
    with _client(fleet) as client:
        pool = client.read_work_pool("gpu-cu132")
        queues = {q.name for q in client.read_work_queues(work_pool_name="gpu-cu132")}
        nightly = client.read_deployment_by_name("build-matrix/small-convnet-nightly")
        retrain = client.read_deployment_by_name(f"retrain/{MODEL}")
        promote = client.read_deployment_by_name("promote-bundle/manual")
        staging = client.read_deployment_by_name("promote-bundle/staging")
        automations = client.read_automations_by_name(f"{MODEL}__automation_1")
    assert pool.type == "executorch"
    assert pool.base_job_template["variables"]["properties"]["cuda_channel"]["default"] == "cu132"
    assert {"sm80", "sm90", "sm100"} <= queues
    assert [s.schedule.cron for s in nightly.schedules] == ["0 3 * * *"]
    assert retrain.parameters["store"] == fleet.store and retrain.global_concurrency_limit.limit == 1
    assert automations and automations[0].trigger.expect == {"model.retrain.requested"}
    assert not promote.schedules and promote.parameters == {"store": fleet.store}
    # One latency gate for the staging aliases, whoever moves them (a retrain's bundles or a build's).
    assert retrain.parameters["max_latency_regression"] == staging.parameters["max_latency_regression"] == 0.5


def _listening(port: int) -> list[str]:
    """Local addresses listening on ``port`` (from /proc/net/tcp, IPv4)."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.append(".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0)))
    return found


def test_worker_health_endpoint_is_loopback_only(fleet: Fleet) -> None:
    deadline = time.monotonic() + 60
    while not _listening(fleet.health_port):
        assert time.monotonic() < deadline, tail(fleet.home / "worker-cpu.log")
        time.sleep(0.5)
    assert _listening(fleet.health_port) == ["127.0.0.1"]
    with urllib.request.urlopen(f"http://127.0.0.1:{fleet.health_port}/health", timeout=5) as response:
        assert response.status == 200


def test_matrix_deployment_builds_on_the_cpu_pool(fleet: Fleet) -> None:
    run = _wait_final(fleet, _run(fleet, "build-matrix/small-convnet-nightly"), timeout=240)
    assert run.state.is_completed(), f"{run.state.message}\n{tail(fleet.home / 'worker-cpu.log')}"
    store = open_store(fleet.store)
    key = BundleKey(name=MODEL, version="1.0.0", target="xnnpack", compat=f"cpu-xnnpack-{os.uname().machine}")
    manifest, _ = read_manifest(store, key)
    assert manifest.validation.passed and manifest.validation.shapes == {"forward": ["min", "opt", "max"]}
    assert "XnnpackBackend" in manifest.methods["forward"].delegates
    with _client(fleet) as client:
        children = client.read_flow_runs()
    builds = [r for r in children if r.name.startswith(f"build-{MODEL}-1.0.0-xnnpack")]
    assert len(builds) == 1 and builds[0].state.is_completed()
    assert builds[0].labels["executorch.cuda_channel"] == "cpu"
    assert builds[0].work_pool_name == "cpu"
    # Its publish moved staging: done here, so that it cannot land after the next test's retrain moved it.
    _staging_run(fleet, "1.0.0")


def test_retrain_event_builds_the_new_weights(fleet: Fleet, tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "examples" / "convnet"))
    try:
        from model import build  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    model = build()
    with torch.no_grad():
        model.head.bias.add_(0.5)  # new weights: the bundle must come out different
    weights = tmp_path / "retrained.pt"
    torch.save(model.state_dict(), weights)
    sha = sha256_file(weights)
    weights_uri = fleet.store.replace("/bundles", "/training/run-42.pt")
    open_store(weights_uri.rsplit("/", 1)[0]).put_file("run-42.pt", weights)

    emitted = fleet.cli("retrain", MODEL, "--weights", weights_uri, "--sha256", sha, "--reason", "e2e")
    assert emitted.returncode == 0, emitted.stderr
    assert "model.retrain.requested" in emitted.stdout

    deadline = time.monotonic() + 240
    with _client(fleet) as client:
        dep = client.read_deployment_by_name(f"retrain/{MODEL}")
        from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

        while not (runs := client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])))):
            assert time.monotonic() < deadline, "the event triggered no retrain run"
            time.sleep(1)
    (run,) = runs
    assert run.parameters["weights_uri"] == weights_uri and run.parameters["weights_sha256"] == sha
    run = _wait_final(fleet, run.id, timeout=deadline - time.monotonic())
    assert run.state.is_completed(), f"{run.state.message}\n{tail(fleet.home / 'worker-cpu.log')}"
    # The TensorRT cell's pool has no worker: left out, with the reason, and the retrain finished without it.
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with _client(fleet) as client:
        (table,) = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"matrix-{MODEL}"])),
                                         sort=ArtifactSort.CREATED_DESC, limit=1)
    rows = {row["build"]: row for row in (json.loads(table.data) if isinstance(table.data, str) else table.data)}
    assert rows["tensorrt@cu134-sm100"]["state"] == "Skipped", rows
    assert "no live worker in pool gpu-cu134" in rows["tensorrt@cu134-sm100"]["why"]
    assert rows["xnnpack@cpu"]["state"] == "Published" and len(rows["xnnpack@cpu"]["manifest"]) == 12
    # Read at 1600 px: the reason before the bundle's columns, no 64-hex column, no "-" (a bullet in the UI).
    assert list(rows["xnnpack@cpu"]) == ["build", "state", "bundle", "manifest", "why"]
    assert rows["xnnpack@cpu"]["why"] == "" and rows["tensorrt@cu134-sm100"]["bundle"] == ""
    version = f"1.0.0-{sha[:12]}"
    key = BundleKey(name=MODEL, version=version, target="xnnpack", compat=f"cpu-xnnpack-{os.uname().machine}")
    store = open_store(fleet.store)
    manifest = pull(store, key, tmp_path / "pulled")
    assert manifest.weights_sha256 == sha and manifest.validation.passed
    staging = read_alias(store, MODEL, f"staging-{key.compat}")
    assert staging is not None, "the retrain did not move staging-<compat>"
    assert staging[0].bundle_key() == key and staging[0].validation_passed
    # Before: nothing, or a bundle the staging automation moved it to on an earlier publish.
    assert staging[0].previous is None or staging[0].previous.version != version
    # The retrain's own publish is not the staging automation's: the retrain promotes once its matrix validated.
    assert [r for r in _runs_of(fleet, "promote-bundle/staging") if r.parameters.get("version") == version] == []


def test_worker_refuses_a_run_for_a_channel_it_lacks(fleet: Fleet) -> None:
    spec = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())["definitions"]["small_convnet_spec"]
    flow_run_id = _run(fleet, "build-bundle/gpu-cu132", queue="sm90", parameters={
        "spec": spec, "store": fleet.store, "placement": {"channel": "cu132", "sm": "sm90"}})
    worker = fleet.start("worker-cu132", [*CLI, "worker", "--pool", "gpu-cu132", "--queue", "sm90", "--run-once"])
    worker.wait(120)
    run = _wait_final(fleet, flow_run_id, timeout=30)
    log = tail(fleet.home / "worker-cu132.log")
    assert run.state.is_failed(), log
    message = run.state.message
    assert "needs CUDA channel cu132 (parameter placement.channel)" in message
    assert "needs GPU arch sm90" in message
    assert f"this worker is no CUDA (torch {torch.__version__})" in message
    assert "--index-url https://download.pytorch.org/whl/nightly/cu132" in message
    # The worker's terminal shows what Prefect's own worker would: its start and the refused run.
    printed = (fleet.home / "worker-cu132.log").read_text(errors="replace")
    assert "needs CUDA channel cu132" in printed and "toolchain:" in printed, printed[-4000:]
    assert run.labels["executorch.cuda_channel"] == "cpu"
    assert not [o.key for o in open_store(fleet.store).list(f"{MODEL}/") if "cu132" in o.key]  # nothing was built


def test_a_crashing_build_fails_its_run_and_the_worker_takes_the_next(fleet: Fleet) -> None:
    spec = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())["definitions"]["small_convnet_spec"]
    worker = next(proc for proc in fleet.procs if "--pool" in proc.args and "cpu" in proc.args)  # type: ignore[operator]
    crashing = {**spec, "version": "crashes", "model": f"{ROOT / 'tests' / 'models.py'}:aborts",
                "methods": {"forward": {"inputs": [{"name": "x", "shape": [2, 3]}]}}}
    failed = _wait_final(fleet, _run(fleet, "build-bundle/cpu", {"spec": crashing, "store": fleet.store}), 240)
    assert failed.state.is_failed(), tail(fleet.home / "worker-cpu.log")
    assert "ExportFailed" in failed.state.message and "SIGABRT" in failed.state.message
    assert worker.poll() is None, "the worker died with the export child"
    after = _wait_final(fleet, _run(fleet, "build-bundle/cpu", {"spec": {**spec, "version": "after-crash"},
                                                                  "store": fleet.store}), 240)
    assert after.state.is_completed(), f"{after.state.message}\n{tail(fleet.home / 'worker-cpu.log')}"
    published = {o.key.split("/")[1] for o in open_store(fleet.store).list(f"{MODEL}/")}
    assert "after-crash" in published and "crashes" not in published


LOST_RUN = """
import time
from prefect import flow, tags

@flow(name="lost-node-probe")
def hang() -> None:
    time.sleep(3600)

with tags("executorch"):
    hang()
"""


class LostNode(threading.Thread):
    """A flow run whose process is SIGKILLed once it runs, as when a node is lost: no worker is left to report it.

    Started with the fleet, so that the automation's 90 s of silence pass while the module's other tests run."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(daemon=True)
        self.fleet = fleet
        self.process = fleet.start("lost-run", [sys.executable, "-c", LOST_RUN], PREFECT_FLOWS_HEARTBEAT_FREQUENCY="30")
        self.flow_run_id: Any = None
        self.killed_at: datetime.datetime | None = None
        self.start()

    def run(self) -> None:
        from prefect.client.schemas.filters import FlowFilter, FlowFilterName

        deadline = time.monotonic() + 120
        with _client(self.fleet) as client:
            while time.monotonic() < deadline:
                runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["lost-node-probe"])))
                if runs and runs[0].state and runs[0].state.is_running():
                    os.kill(self.process.pid, signal.SIGKILL)
                    self.flow_run_id, self.killed_at = runs[0].id, datetime.datetime.now(datetime.UTC)
                    return
                time.sleep(1)


def _build_of(fleet: Fleet, version: str, target: str = "xnnpack", timeout: float = 240) -> Any:
    """The run of ``build-bundle/cpu`` for ``version`` and ``target``, once it runs and has its process id."""
    deadline = time.monotonic() + timeout
    while True:
        runs = [r for r in _runs_of(fleet, "build-bundle/cpu")
                if r.parameters["spec"]["version"] == version and r.parameters["spec"]["target"]["kind"] == target]
        if runs and runs[0].state.is_running() and runs[0].infrastructure_pid:
            return runs[0]
        assert time.monotonic() < deadline, f"no build of {version} running:\n{tail(fleet.home / 'worker-cpu.log')}"
        time.sleep(0.5)


def _matrix(fleet: Fleet, version: str, cells: int = 1, **spec: Any) -> Any:
    """Start the nightly matrix deployment for ``version`` with its first ``cells`` cells (xnnpack, then portable:
    the cpu pool's)."""
    config = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())["definitions"]
    targets = config["small_convnet_targets"][:cells]
    assert all(cell["placement"]["channel"] == "cpu" for cell in targets)
    return _run(fleet, "build-matrix/small-convnet-nightly", {
        "spec": {**config["small_convnet_spec"], "version": version, **spec}, "targets": targets, "store": fleet.store})


def _pid(run: Any) -> int:
    return int(str(run.infrastructure_pid).rsplit(":", 1)[-1])


def _tree(pid: int) -> set[int]:
    """``pid`` and every process under it, from /proc."""
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        found.add(current)
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo.extend(int(child) for child in children.read_text().split())
            except OSError:
                pass
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_build_runs_again_exactly_once_and_its_matrix_completes(fleet: Fleet) -> None:
    """The flow-run process of a matrix's build dies (SIGKILL, as by the OOM killer), with two workers of the pool
    polling: Crashed once, retried once, run by one worker, Completed; no task run of the dead attempt left Running.

    Prefect's process worker used to report one exit as Crashed twice, and the retry automation answered both: the
    build ran twice at once on two workers. A matrix of both CPU cells: its two builds killed at once."""
    second = fleet.start("worker-cpu-2", [*CLI, "worker", "--pool", "cpu", "--limit", "4"])
    try:
        names = _worker_names(fleet, "cpu", count=2)
        assert len(set(names)) == 2 and all(re.search(r"-pid\d+$", name) for name in names), names
        matrix = _matrix(fleet, "crash-retry", cells=2)
        with ThreadPoolExecutor(2) as pool:
            killed = list(pool.map(partial(_kill_build, fleet, "crash-retry"), ("xnnpack", "portable")))
        assert _wait_final(fleet, matrix, 300).state.is_completed(), tail(fleet.home / "worker-cpu.log")
        for build, task_run in killed:
            _check_rerun(fleet, build, task_run)
        # The killed attempts' build folders were swept (a staging promotion started by a publish may still run).
        assert not list((fleet.home / "tmp").glob("prefect-executorch-build-*")), "a scratch directory outlived its run"
        # One line per build in the worker terminals: what it builds and how it ended.
        _workers_say(fleet, ("worker-cpu", "worker-cpu-2"), (
            r"picked up small-convnet crash-retry xnnpack \(build-small-convnet-crash-retry-xnnpack",
            r"finished small-convnet crash-retry xnnpack \(.*\): Crashed in \d+ s",
            r"finished small-convnet crash-retry portable \(.*\): Completed in \d+ s"))
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(30)


def _workers_say(fleet: Fleet, names: tuple[str, ...], patterns: tuple[str, ...], timeout: float = 60) -> None:
    """Wait until the terminals of the workers ``names`` hold a line for each pattern. A run's "finished" line comes
    once its process has exited: after its final state, and so its matrix's, may have reached the server."""
    def said() -> str:
        return "".join((fleet.home / f"{name}.log").read_text(errors="replace") for name in names)

    missing = settled(lambda: [pattern for pattern in patterns if not re.search(pattern, said())], timeout=timeout,
                      interval=0.5)
    assert not missing, f"the workers never said {missing}:\n{said()[-3000:]}"


def _worker_names(fleet: Fleet, pool: str, count: int, timeout: float = 120) -> list[str]:
    """The names of the pool's workers once ``count`` of them have polled."""
    deadline = time.monotonic() + timeout
    with _client(fleet) as client:
        while len(workers := client.read_workers_for_work_pool(pool)) < count:
            assert time.monotonic() < deadline, f"{len(workers)} workers of {pool} polled"
            time.sleep(1)
    return [worker.name for worker in workers]


def _running_task(fleet: Fleet, flow_run_id: Any, timeout: float = 120) -> Any:
    """The id of the build's ``build-and-publish`` task run once it runs (export, validation and publish: seconds,
    so a kill right after lands inside it; a short task, such as check-published, may end first)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + timeout
    with _client(fleet) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            running = [run for run in runs if run.state and run.state.is_running()
                       and run.name.startswith("build-and-publish")]
            if running:
                return running[0].id
            assert time.monotonic() < deadline, f"no task run of {flow_run_id} ran: {[r.state_name for r in runs]}"
            time.sleep(0.2)


def _kill_build(fleet: Fleet, version: str, target: str) -> tuple[Any, Any]:
    """SIGKILL the process of the build of ``version`` for ``target`` inside build-and-publish: its flow run and the
    id of the task run that was running."""
    build = _build_of(fleet, version, target)
    running = _running_task(fleet, build.id)
    os.kill(_pid(build), signal.SIGKILL)
    return build, running


def _check_rerun(fleet: Fleet, build: Any, running: Any) -> None:
    """The killed build was Crashed once, retried once and Completed, no task run of it left open, its bundle
    published."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with _client(fleet) as client:
        states = client.read_flow_run_states(build.id)
        build = client.read_flow_run(build.id)
    history = [s.name for s in states]
    told = "\n".join(f"{s.timestamp} {s.name}: {s.message}" for s in states)
    assert history[history.index("Crashed"):] == ["Crashed", "AwaitingRetry", "Pending", "Submitting", "Running", "Completed"], told
    assert build.run_count == 2 and build.state.is_completed(), told
    # The worker tidies the dead attempt's task runs once its process has exited, and task runs are recorded from
    # events: either may come after the retry's Completed.
    def killed_of(task_runs: list[Any]) -> Any:
        return next((t for t in task_runs if t.id == running), None)

    def tidied(task_runs: list[Any]) -> bool:
        killed = killed_of(task_runs)
        return killed is not None and killed.state.is_crashed() and all(t.state.is_final() for t in task_runs)

    with _client(fleet) as client:
        task_runs = settled(
            lambda: client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[build.id]))),
            until=tidied, timeout=60, interval=1)
    left = [f"{t.name}: {t.state_name} (attempt {t.flow_run_run_count})" for t in task_runs if not t.state.is_final()]
    killed = killed_of(task_runs)
    assert left == [], told
    assert killed is not None, f"the killed attempt's task run {running} is gone"
    assert killed.state.is_crashed() and killed.flow_run_run_count == 1, f"{killed.name}: {killed.state_name}"
    spec = build.parameters["spec"]
    target = spec["target"]["kind"]
    key = BundleKey(name=MODEL, version=spec["version"], target=target, compat=f"cpu-{target}-{os.uname().machine}")
    assert read_manifest(open_store(fleet.store), key)[0].validation.passed


def _docs_block(path: Path, after: str) -> str:
    """The first ```bash block of ``path`` after the line containing ``after``."""
    text = path.read_text()
    block = text[text.index(after):].split("```bash\n", 1)[1]
    return block.split("```", 1)[0]


def test_the_docs_deployment_commands_run_as_written(fleet: Fleet) -> None:
    """docs/fleet.md's build and promote through deployments, pasted as an operator would (in a shell with the
    project's environment active; the build's store is this server's)."""
    commands = _docs_block(ROOT / "docs" / "fleet.md", "**One build through a deployment**")
    build, promote = commands.split("prefect deployment run promote-bundle")
    promote = "prefect deployment run promote-bundle" + promote
    shell = {**fleet.env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for command, ends in ((build.replace("s3://bundles/prod", fleet.store), "build"), (promote, "promote")):
        ran = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=ROOT, env=shell, capture_output=True,
                             text=True, timeout=120)
        assert ran.returncode == 0, f"{ends}: {ran.stdout}{ran.stderr}"
        done = _wait_final(fleet, _created_run(ran.stdout), 300)
        assert done.state.is_completed(), f"{ends}: {done.state.message}"
    prod = read_alias(open_store(fleet.store), "small-convnet", "prod")
    assert prod is not None and prod[0].bundle_key().version == "1.0.0"


def _created_run(output: str) -> str:
    """The flow run id ``prefect deployment run`` printed."""
    found = re.search(r"UUID: ([0-9a-f-]{36})", output)
    assert found, output
    return found.group(1)


def test_a_cancelled_matrix_cancels_the_build_it_sent(fleet: Fleet) -> None:
    from prefect.states import Cancelling

    matrix = _matrix(fleet, "cancelled", model=f"{ROOT / 'tests' / 'models.py'}:hangs",
                     methods={"forward": {"inputs": [{"name": "x", "shape": [2, 3]}]}})
    build = _build_of(fleet, "cancelled")
    deadline = time.monotonic() + 120
    while len(processes := _tree(_pid(build))) < 2:  # the export child, which hangs in the model's builder
        assert time.monotonic() < deadline, f"no export child under {build.name}"
        time.sleep(0.5)
    with _client(fleet) as client:
        asked = client.set_flow_run_state(matrix, Cancelling(message="cancelled by the e2e test"), force=True).state
    cancelled = _wait_final(fleet, matrix, 120).state
    assert cancelled.is_cancelled()
    # Its process left on the worker's SIGTERM: Prefect's SIGKILL comes 30 s after it (its dispatch thread, still
    # polling the build, once kept it alive until then).
    assert asked is not None and (cancelled.timestamp - asked.timestamp).total_seconds() < 20, (asked, cancelled)
    build = _wait_final(fleet, build.id, 120)
    assert build.state.is_cancelled(), f"{build.state.name}: {build.state.message}"
    # Its process and the export child it was waiting on are gone, and so is its scratch directory.
    assert [pid for pid in processes if _alive(pid)] == []
    assert not list((fleet.home / "tmp").glob("prefect-executorch-build-*"))
    assert not [o.key for o in open_store(fleet.store).list(f"{MODEL}/cancelled/")]


def _runs_of(fleet: Fleet, deployment: str) -> list[Any]:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with _client(fleet) as client:
        dep = client.read_deployment_by_name(deployment)
        return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])))


def _staging_run(fleet: Fleet, version: str, timeout: float = 240) -> Any:
    """The staging automation's run for the publish of ``version`` (its parameters come from the event), once it
    has Completed."""
    runs = settled(lambda: [r for r in _runs_of(fleet, "promote-bundle/staging") if r.parameters.get("version") == version],
                   until=lambda runs: bool(runs) and runs[0].state is not None and runs[0].state.is_final(),
                   timeout=timeout, interval=1)
    assert runs and runs[0].state.is_final(), f"no staging run finished for {version}:\n{tail(fleet.home / 'worker-cpu.log')}"
    (run,) = runs
    assert run.state.is_completed(), f"{run.state.message}\n{tail(fleet.home / 'worker-cpu.log')}"
    return run


def test_a_publish_event_moves_staging(fleet: Fleet) -> None:
    spec = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())["definitions"]["small_convnet_spec"]
    built = _wait_final(fleet, _run(fleet, "build-bundle/cpu", {"spec": {**spec, "version": "by-event"},
                                                                  "store": fleet.store}), 240)
    assert built.state.is_completed(), f"{built.state.message}\n{tail(fleet.home / 'worker-cpu.log')}"
    key = BundleKey(name=MODEL, version="by-event", target="xnnpack", compat=f"cpu-xnnpack-{os.uname().machine}")
    store = open_store(fleet.store)
    run = _staging_run(fleet, "by-event")
    assert run.parameters["compat"] == key.compat and run.parameters["target"] == "xnnpack"
    assert run.parameters["name"] == MODEL and run.parameters["alias"] == f"staging-{key.compat}"
    staging = read_alias(store, MODEL, f"staging-{key.compat}")
    assert staging is not None and staging[0].bundle_key() == key, "the publish event did not move staging-<compat>"


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        _Hook.received.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_failed_validation_notifies_the_configured_block(fleet: Fleet, tmp_path: Path) -> None:
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with _client(fleet):
            CustomWebhookNotificationBlock(name="e2e", url=f"http://127.0.0.1:{server.server_port}/hook",
                                           json_data={"text": "{{subject}}\n{{body}}"}).save("e2e-alerts", overwrite=True)
        env = {**fleet.env, "PREFECT_EXECUTORCH_NOTIFY_BLOCK": "custom-webhook/e2e-alerts"}
        deployed = subprocess.run([*CLI, "deploy", "--prefect-file", str(_variant(tmp_path)), "--name",
                                   "manual"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        assert "automation prefect-executorch-validation-failed" in deployed.stdout
        with _client(fleet) as client:
            (automation,) = client.read_automations_by_name("prefect-executorch-validation-failed")
        assert automation.actions[0].type == "send-notification"

        # Zero tolerance on portable kernels: the build fails its validation, nothing is published.
        tight = {"name": MODEL, "version": "too-tight", "model": f"{ROOT / 'tests' / 'models.py'}:mixed",
                 "target": {"kind": "portable"},
                 "methods": {"forward": {"inputs": [{"name": "x", "shape": [2, 16]}]}},
                 "validation": {"samples": 1, "latency_runs": 0, "outputs": {"['logits']": {"atol": 0, "rtol": 0}}}}
        failed = _wait_final(fleet, _run(fleet, "build-bundle/cpu", {"spec": tight, "store": fleet.store}), 240)
        assert failed.state.is_failed() and "ValidationFailed" in failed.state.message
        assert "\n" not in failed.state.message  # the one-line cause the CLI prints
        from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

        # Its process sends the last of its logs as it exits, after the final state: read them once it is gone
        # (read at once, CI once found none).
        deadline = time.monotonic() + 60
        while _alive(_pid(failed)):
            assert time.monotonic() < deadline, "the failed build's process did not exit within 60 s"
            time.sleep(0.2)
        with _client(fleet) as client:
            logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[failed.id])))
        errors = [log.message for log in logs if log.level >= 40]
        assert len(errors) == 1 and errors[0].startswith("ValidationFailed: 1 of 1 validation cases failed"), errors
        assert not [log.message for log in logs if "Traceback" in log.message]
        deadline = time.monotonic() + 120
        while not _Hook.received:
            assert time.monotonic() < deadline, f"no notification:\n{tail(fleet.home / 'server.log')}"
            time.sleep(1)
        text = json.loads(_Hook.received[0])["text"]
        assert "validation failed for small-convnet too-tight portable/" in text and "atol=0" in text
        assert f"/runs/flow-run/{failed.id}" in text  # a link to the failed build's run
        assert not [o.key for o in open_store(fleet.store).list(f"{MODEL}/too-tight/")]
    finally:
        server.shutdown()


def _start_worker(fleet: Fleet, name: str, pool: str = "cpu", queue: str = "stop-test") -> subprocess.Popen[bytes]:
    """``prefect-executorch worker`` in a session of its own (a terminal's job, a service's cgroup), on ``queue`` only."""
    with open(fleet.home / f"{name}.log", "wb") as log:
        return subprocess.Popen([*CLI, "worker", "--pool", pool, "--queue", queue, "--limit", "1", "--name", name],
                                cwd=fleet.cwd, env=fleet.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop_within(fleet: Fleet, worker: subprocess.Popen[bytes], name: str, signum: int, bound: float) -> float:
    """Signal the worker's whole group as Ctrl-C and ``systemctl stop`` do; seconds until it was gone (killed after 60)."""
    sent = time.monotonic()
    os.killpg(worker.pid, signum)
    try:
        worker.wait(60)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    took = time.monotonic() - sent
    assert took < bound, f"{name} took {took:.1f} s to stop:\n{tail(fleet.home / f'{name}.log')}"
    return took


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_worker_stops_within_seconds_of_its_signal(fleet: Fleet, signum: int) -> None:
    """While it starts (probe, pool, Prefect's first poll) and once it polls, with a CPU-bound process beside it:
    Prefect's own worker start outlived its Ctrl-C in CI."""
    with cpu_burner():
        for delay in (1.5, 7.0):  # starting (probe, pool, first poll), then polling
            name = f"stop-{signal.Signals(signum).name.lower()}-{delay:g}"
            worker = _start_worker(fleet, name)
            time.sleep(delay)
            _stop_within(fleet, worker, name, signum, bound=10)


def test_a_stopped_worker_ends_the_build_it_runs(fleet: Fleet) -> None:
    """SIGTERM to a worker mid-build: the worker, the run's process and its export child are gone within 10 s, and
    the run is Crashed, not left Running for something to wait on."""
    worker = _start_worker(fleet, "stop-inflight", pool="cpu-stop-test", queue="default")
    deadline = time.monotonic() + 120
    while b"started!" not in (fleet.home / "stop-inflight.log").read_bytes():  # it has made its pool
        assert worker.poll() is None and time.monotonic() < deadline, tail(fleet.home / "stop-inflight.log")
        time.sleep(0.5)
    with _client(fleet) as client:
        shipped = client.read_deployment_by_name("build-bundle/cpu")
        deployment = client.create_deployment(
            flow_id=shipped.flow_id, name="stop-test", work_pool_name="cpu-stop-test", entrypoint=shipped.entrypoint,
            path=shipped.path, pull_steps=shipped.pull_steps, parameter_openapi_schema=shipped.parameter_openapi_schema)
        run = client.create_flow_run_from_deployment(deployment, parameters={"store": fleet.store, "spec": {
            "name": "stop-test", "version": "1", "model": f"{ROOT / 'tests' / 'models.py'}:hangs",
            "methods": {"forward": {"inputs": [{"name": "x", "shape": [2, 3]}]}}, "target": "xnnpack"}})
        while not ((current := client.read_flow_run(run.id)).state.is_running() and current.infrastructure_pid):
            assert time.monotonic() < deadline, f"{current.state_name}:\n{tail(fleet.home / 'stop-inflight.log')}"
            time.sleep(0.5)
    while len(processes := _tree(_pid(current))) < 2:  # the export child, which hangs in the model's builder
        assert time.monotonic() < deadline, f"no export child under {current.name}"
        time.sleep(0.5)
    _stop_within(fleet, worker, "stop-inflight", signal.SIGTERM, bound=10)
    assert settled(lambda: [pid for pid in processes if _alive(pid)]) == []
    ended = _wait_final(fleet, run.id, 30)
    assert ended.state.is_crashed(), f"{ended.state.name}: {ended.state.message}"


# Last: by now the automation has had its 90 s of silence, which passed while the tests above ran.
def test_a_flow_run_whose_process_dies_is_marked_crashed(fleet: Fleet) -> None:
    """No worker is left to report it (as when a node is lost): the deployed automation sees the heartbeats stop."""
    lost = fleet.lost_node
    lost.join(timeout=120)
    assert lost.killed_at is not None, f"the probe never ran:\n{tail(fleet.home / 'lost-run.log')}"
    run = _wait_final(fleet, lost.flow_run_id, 300)
    assert run.state.is_crashed(), f"{run.state.name}: {run.state.message}"
    assert "No heartbeat for 90 s" in (run.state.message or "")
    # As docs/fleet.md says: Crashed 90 s after the run's last sign of life (a heartbeat, or entering Running),
    # plus the server's lag (proactive triggers every 5 s, then the action; up to LOST_NODE_LAG_S on a busy CI host).
    last_sign = _last_sign_of_life(fleet, lost.flow_run_id)
    silence = (run.state.timestamp - last_sign).total_seconds()
    since_kill = (run.state.timestamp - lost.killed_at).total_seconds()
    told = f"Crashed {silence:.0f} s after its last heartbeat, {since_kill:.0f} s after the kill"
    assert 90 <= silence <= 90 + LOST_NODE_LAG_S, told
    assert 60 <= since_kill <= 90 + LOST_NODE_LAG_S, told  # heartbeats every 30 s: the last came 0-30 s before


#: What docs/fleet.md allows the server beyond the automation's 90 s: its 5 s evaluation and the action's own time.
LOST_NODE_LAG_S = 30


def _last_sign_of_life(fleet: Fleet, flow_run_id: Any) -> datetime.datetime:
    """When the run last sent a heartbeat, or entered Running where no heartbeat came (as the automation reads it)."""
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter, EventResourceFilter

    with _client(fleet) as client:
        since = client.read_flow_run(flow_run_id).start_time
        page = client.read_events(EventFilter(
            occurred=EventOccurredFilter(since=since - datetime.timedelta(minutes=1)),
            event=EventNameFilter(name=["prefect.flow-run.heartbeat", "prefect.flow-run.Running"]),
            resource=EventResourceFilter(id=[f"prefect.flow-run.{flow_run_id}"])), limit=50)
    assert page.events, f"no heartbeat or Running event of {flow_run_id}"
    return max(event.occurred for event in page.events)
