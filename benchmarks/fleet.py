"""Fleet throughput on PostgreSQL: K workers taking N small builds submitted at once through the deployment.

A real PostgreSQL (Debian's, started here on loopback as user ``nobody``, in a temporary folder, trust
auth) under ``prefect server start``; ``prefect-executorch deploy`` of the ``build-bundle/cpu``
deployment (pool ``cpu``, type ``executorch``); K = 1 … the machine's cores ``prefect-executorch
worker --pool cpu --limit 1`` processes; N builds of the demo ConvNet (each its own version: no cache
hit) created at once. For each K: the makespan (first creation to last end), throughput (builds per
minute), p50/p95 queue wait (a run's start minus its creation) and each run's final state, counted as
observed: completed, failed, crashed, and stuck (not final at the deadline). Then a batch of its own
(``--kill-builds`` builds on 2 workers) where, once the first build completed, one worker and every process
under it (its flow runs' processes too) are killed with SIGKILL while it has a build running: that build must
be run again (the shipped automations mark it Crashed and retry it) and complete, which the batch shows as
the in-flight run's final state and run count; its runs are counted like any other (a lost run shows as
crashed or stuck), apart from the throughput figures, which a killed worker would halve.

The last line is ``RESULT fleet ratio=<throughput(K max) / (K max × throughput(K=1))> goal=>=0.8``:
workers must add throughput close to linearly up to the machine's cores, with no run lost or stuck
(a stuck or lost run fails the goal whatever the ratio; so does a kill batch whose in-flight build did not
run again and complete, or that found no build in flight to kill). ``--smoke``: N=2, K=1 only (the harness runs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from _common import report  # noqa: E402

from prefect_executorch.stopping import descendants, kill_descendants  # noqa: E402
from prefect_executorch.testing.prefect_server import CLI, PrefectServer  # noqa: E402
from prefect_executorch.testing.seaweedfs import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
GOAL = 0.8
#: Seconds a worker may take to stop after SIGINT (README: a worker stops within 10 s).
WORKER_STOP_S = 10.0


class Fleet(PrefectServer):
    """PostgreSQL, a Prefect server on it, and the workers, all under one temporary folder."""

    def __init__(self, root: Path) -> None:
        (root / "home").mkdir()
        self.root, self.pg_port = root, free_port()
        super().__init__(root / "home", f"postgresql+asyncpg://prefect@127.0.0.1:{self.pg_port}/postgres", ROOT,
                         PREFECT_EXECUTORCH_STORE=str(root / "store"))

    def start_postgres(self) -> None:
        data, sockets = self.root / "pg", self.root / "sock"
        sockets.mkdir()
        os.chmod(self.root, 0o755)
        os.chmod(sockets, 0o777)
        data.mkdir()
        shutil.chown(data, 65534, 65534)
        subprocess.run([*NOBODY, "initdb", "-D", str(data), "-U", "prefect", "--auth=trust", "-E", "UTF8"],
                       check=True, capture_output=True, env={**os.environ, "HOME": str(self.root)})
        subprocess.run([*NOBODY, "pg_ctl", "-D", str(data), "-w", "-l", str(data / "postgres.log"), "-o",
                        f"-h 127.0.0.1 -p {self.pg_port} -k {sockets} -c max_connections=200", "start"],
                       check=True, capture_output=True)

    def stop_postgres(self) -> None:
        subprocess.run([*NOBODY, "pg_ctl", "-D", str(self.root / "pg"), "-m", "fast", "stop"], capture_output=True)

    def deploy(self) -> None:
        config = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
        config["deployments"] = [d for d in config["deployments"] if d["name"] == "cpu"]
        path = self.root / "prefect.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        # With the shipped automations: a run whose process dies is marked Crashed (and run again), not left Running.
        done = self.cli("deploy", "--prefect-file", str(path), timeout=300)
        if done.returncode != 0:
            raise RuntimeError(done.stdout + done.stderr)

    def stop(self) -> None:
        self.stop_all()
        self.stop_postgres()


def spec(version: str) -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "examples" / "convnet" / "spec.yaml").read_text())
    model = data["model"].split(":")
    return {**data, "version": version, "model": f"{ROOT / 'examples' / 'convnet' / model[0]}:{model[1]}",
            "validation": {**data.get("validation", {}), "samples": 1, "latency_runs": 0}}


def run_batch(fleet: Fleet, workers: int, builds: int, kill_one: bool, deadline_s: float) -> dict[str, Any]:
    """Start ``workers`` workers, create ``builds`` runs at once, wait for them; every run's outcome."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    procs = [fleet.start(f"worker-k{workers}-{i}", [*CLI, "worker", "--pool", "cpu", "--limit", "1",
                                                     "--name", f"bench-k{workers}-{i}"]) for i in range(workers)]
    with temporary_settings(updates={PREFECT_API_URL: fleet.url}), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("build-bundle/cpu")
        started = time.time()
        ids = [client.create_flow_run_from_deployment(
            deployment.id, parameters={"spec": spec(f"k{workers}-{i}-{int(started)}"), "store": str(fleet.root / "store")}).id
            for i in range(builds)]
        killed, in_flight = None, []
        deadline = time.monotonic() + deadline_s
        while True:
            runs = [client.read_flow_run(i) for i in ids]
            final = [r for r in runs if r.state and r.state.is_final()]
            if kill_one and killed is None and any(r.state.is_completed() for r in final):
                in_flight = _running_under(procs[0].pid, runs)
                if in_flight:  # kill while it has a build running: the case a retry must recover
                    kill_descendants(procs[0].pid)
                    procs[0].kill()
                    killed = time.time() - started
            if len(final) == len(runs) or time.monotonic() > deadline:
                break
            time.sleep(1)
        recovered = [client.read_flow_run(run.id) for run in in_flight]
    stops = [stop_worker(proc) for proc in procs if proc.poll() is None]
    states = [r.state.type.value if r.state and r.state.is_final() else "STUCK" for r in runs]
    waits = [(r.start_time - r.created).total_seconds() for r in runs if r.start_time and r.created]
    ends = [r.end_time.timestamp() for r in runs if r.end_time]
    makespan = (max(ends) - started) if ends else float("nan")
    completed = states.count("COMPLETED")
    return {
        "workers": workers, "builds": builds, "makespan_s": round(makespan, 1),
        "throughput_per_min": round(60 * completed / makespan, 2) if ends else 0.0,
        "queue_wait_p50_s": round(statistics.median(waits), 1) if waits else None,
        "queue_wait_p95_s": round(sorted(waits)[min(len(waits) - 1, int(0.95 * len(waits)))], 1) if waits else None,
        "completed": completed, "failed": states.count("FAILED"), "crashed": states.count("CRASHED"),
        "stuck": states.count("STUCK"), "other": len(states) - completed - states.count("FAILED")
        - states.count("CRASHED") - states.count("STUCK"),
        "worker_killed_at_s": round(killed, 1) if killed is not None else None,
        "in_flight_on_killed_worker": [{"final": run.state.type.value if run.state else None,
                                        "run_count": run.run_count} for run in recovered],
        "worker_stop_s": max(stops) if stops else None,
    }


def _running_under(pid: int, runs: list[Any]) -> list[Any]:
    """The runs in state Running whose flow-run process is ``pid`` or under it."""
    tree = {pid, *descendants(pid)}
    return [run for run in runs if run.state and run.state.is_running() and run.infrastructure_pid
            and int(str(run.infrastructure_pid).rsplit(":", 1)[-1]) in tree]


def stop_worker(proc: subprocess.Popen[bytes]) -> float:
    """SIGINT, as an operator's Ctrl-C; seconds until the worker was gone (killed, and counted, past the bound)."""
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(WORKER_STOP_S * 3)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return round(time.monotonic() - sent, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", type=int, default=24)
    parser.add_argument("--kill-builds", type=int, default=6, help="builds of the batch in which a worker is killed")
    parser.add_argument("--smoke", action="store_true", help="2 builds, 1 worker: the harness runs, the goal is not judged")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    counts = [1] if args.smoke else sorted({1, *range(2, cores + 1)})
    builds = 2 if args.smoke else args.builds
    root = Path(tempfile.mkdtemp(prefix="prefect-executorch-fleet-"))
    fleet = Fleet(root)
    figures: dict[str, Any] = {"cores": cores, "database": "PostgreSQL (loopback, trust auth)"}
    try:
        fleet.start_postgres()
        fleet.start_server()
        fleet.deploy()
        batches = [run_batch(fleet, k, builds, kill_one=False, deadline_s=60 * builds) for k in counts]
        killed = None if args.smoke else run_batch(fleet, 2, args.kill_builds, kill_one=True,
                                                    deadline_s=60 * args.kill_builds + 180)
    finally:
        fleet.stop()
        logs = {p.name: p.read_text(errors="replace")[-2000:] for p in fleet.home.glob("*.log")}
        shutil.rmtree(root, ignore_errors=True)
    figures["batches"] = batches
    figures["worker_killed"] = killed
    print(json.dumps({"batches": batches, "worker_killed": killed}, indent=2))
    one, most = batches[0], batches[-1]
    ratio = most["throughput_per_min"] / (most["workers"] * one["throughput_per_min"]) if one["throughput_per_min"] else 0.0
    lost = sum(b["stuck"] + b["crashed"] + b["failed"] + b["other"] for b in [*batches, *([killed] if killed else [])])
    figures["runs_not_completed"] = lost
    slowest_stop = max((b["worker_stop_s"] or 0.0) for b in [*batches, *([killed] if killed else [])])
    checks = {f"workers stopped within {WORKER_STOP_S:g} s of SIGINT": slowest_stop <= WORKER_STOP_S,
              "no run lost or stuck": not lost}
    if killed is not None:
        recovered = killed["in_flight_on_killed_worker"]
        checks["the build in flight on the killed worker ran again and completed"] = bool(recovered) and all(
            run["final"] == "COMPLETED" and run["run_count"] >= 2 for run in recovered)
    if not all(checks.values()):
        figures["logs_tail"] = logs
    return 0 if report("fleet", ratio, f">={GOAL:g}", figures, checks) else 1


if __name__ == "__main__":
    sys.exit(main())
