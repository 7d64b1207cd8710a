"""What every benchmark shares: machine facts, the RESULT line, the JSON result file."""

from __future__ import annotations

import atexit
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

#: Where results go: ``benchmarks/results`` (ignored by git; ``benchmarks/publish`` copies a run into
#: ``benchmarks/published/``), or ``$PREFECT_EXECUTORCH_BENCHMARK_RESULTS`` (the smoke test's own folder).
RESULTS = Path(os.environ.get("PREFECT_EXECUTORCH_BENCHMARK_RESULTS") or Path(__file__).parent / "results")


def scratch(prefix: str) -> Path:
    """A fresh temporary folder, removed when the benchmark exits (the runs' exports and stores are no result)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, True)
    return path


#: The tree a copy without ``.git`` ran from (a GPU host's copy), as its sender's ``git describe --dirty`` said.
TREE_ENV = "PREFECT_EXECUTORCH_BENCHMARK_TREE"


def _commit() -> str | None:
    """The tree that ran: the one its sender named (a copy sent to another machine, whose own .git, if any, is not
    this tree's), else ``git describe --always --dirty`` (a full hash; ``-dirty`` when files differ from it)."""
    if os.environ.get(TREE_ENV):
        return os.environ[TREE_ENV]
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=40"], capture_output=True,
                              text=True, timeout=10, cwd=Path(__file__).parent)
    except OSError:
        done = None
    return (done.stdout.strip() if done else "") or None


def _installed(distribution: str) -> str | None:
    """Its version; None where it is not installed (a bare GPU host runs ``inductor_gemm.py`` on its torch alone)."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """Cores, memory, load, versions and the commit, read when the result is written."""
    with open("/proc/meminfo") as handle:
        mem_kib = int(handle.readline().split()[1])
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "load_average_1_5_15m": [round(load, 2) for load in os.getloadavg()],
        "python": platform.python_version(),
        "versions": {name: _installed(name) for name in ("torch", "executorch", "prefect", "boto3", "prefect-executorch")},
        "commit": _commit(),
        **_torch_facts(),
    }


def _torch_facts() -> dict[str, Any]:
    """Torch's thread count and the GPU, where this benchmark loaded torch (read, never imported here)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    facts: dict[str, Any] = {"torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name(0)
    return facts


def native_output_to_stderr() -> None:
    """What C++ (ExecuTorch's runtime and runner) prints to the process's stdout, flushed whenever, goes to stderr;
    ``sys.stdout`` keeps the real stdout, so that the RESULT line stays its last."""
    sys.stdout.flush()
    sys.stdout = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (MiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def spread(seconds: list[float], digits: int = 2, unit: str = "s") -> dict[str, Any]:
    """Median, min and max of repeated runs (goals are judged on the median), with every run."""
    ordered = sorted(seconds)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return {f"median_{unit}": round(median, digits), f"min_{unit}": round(ordered[0], digits),
            f"max_{unit}": round(ordered[-1], digits), f"runs_{unit}": [round(value, digits) for value in seconds]}


def interleaved(sides: dict[str, Callable[[int], T]], runs: int) -> dict[str, list[T]]:
    """Run every side once per round, ``runs`` rounds (round index passed in), so that load hits all alike."""
    results: dict[str, list[T]] = {name: [] for name in sides}
    for index in range(runs):
        for name, call in sides.items():
            results[name].append(call(index))
    return results


#: Set by the smoke test: every goal counts as missed, so a benchmark that ignores its verdict shows (it exits 0).
PLANT_MISS_ENV = "PREFECT_EXECUTORCH_BENCHMARK_PLANT_MISS"


def report(name: str, ratio: float, goal: str, figures: dict[str, Any], checks: dict[str, bool] | None = None) -> bool:
    """Write results/<name>.json and print the closing RESULT line; return whether the goal is met and every check
    (a bound beside the ratio: memory, a validation) passed.

    A smoke run plants the miss in the goal itself (a bound no ratio meets), so the comparison makes the FAIL.
    """
    op, bound = goal[:2] if goal[1] == "=" else goal[:1], float(goal[2:] if goal[1] == "=" else goal[1:])
    if os.environ.get(PLANT_MISS_ENV) == "1":
        bound = math.nan  # no ratio compares true with nan, inf included
        figures = {**figures, "planted_miss": "goal planted as missed: a bound no ratio meets (smoke test)"}
    met = {"<=": ratio <= bound, ">=": ratio >= bound, "<": ratio < bound, ">": ratio > bound}[op]
    checks = checks or {}
    failed = [check for check, ok in checks.items() if not ok]
    passed = met and not failed
    RESULTS.mkdir(exist_ok=True)
    payload = {"name": name, "benchmark": Path(sys.argv[0]).name, "ratio": ratio, "goal": goal, "passed": passed,
               "checks": checks, "figures": figures,
               "machine": machine(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2))
    for key, value in figures.items():
        print(f"  {key}: {value}")
    for check in failed:
        print(f"  check failed: {check}")
    print(f"RESULT {name} ratio={ratio:.3f} goal={goal} {'PASS' if passed else 'FAIL'}")
    return passed
