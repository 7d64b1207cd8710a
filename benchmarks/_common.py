"""What every benchmark shares: machine facts, the RESULT line, the JSON result file."""

from __future__ import annotations

import json
import os
import platform
import resource
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def machine() -> dict[str, Any]:
    """Cores, memory and versions, recorded with every result."""
    with open("/proc/meminfo") as handle:
        mem_kib = int(handle.readline().split()[1])
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "python": platform.python_version(),
        "versions": {name: version(name) for name in ("torch", "executorch", "prefect", "boto3", "prefect-executorch")},
    }


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (MiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def spread(seconds: list[float]) -> dict[str, Any]:
    """Median, min and max of repeated runs (goals are judged on the median), with every run."""
    ordered = sorted(seconds)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return {"median_s": round(median, 2), "min_s": round(ordered[0], 2), "max_s": round(ordered[-1], 2),
            "runs_s": [round(value, 2) for value in seconds]}


def report(name: str, ratio: float, goal: str, figures: dict[str, Any]) -> bool:
    """Write results/<name>.json and print the closing RESULT line; return whether the goal is met."""
    op, bound = goal[:2] if goal[1] == "=" else goal[:1], float(goal[2:] if goal[1] == "=" else goal[1:])
    passed = {"<=": ratio <= bound, ">=": ratio >= bound, "<": ratio < bound, ">": ratio > bound}[op]
    RESULTS.mkdir(exist_ok=True)
    payload = {"name": name, "ratio": ratio, "goal": goal, "passed": passed, "figures": figures,
               "machine": machine(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2))
    for key, value in figures.items():
        print(f"  {key}: {value}")
    print(f"RESULT {name} ratio={ratio:.3f} goal={goal} {'PASS' if passed else 'FAIL'}")
    return passed
