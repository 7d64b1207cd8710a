"""Smoke runs of the benchmarks at small sizes: they judge the harness, not the goal.

A smoke run must finish by itself, print a RESULT line that parses, write the same ratio to its results
file, and report only finite figures with every check of its own (``checks``: a memory bound, a validation)
true. Its goal is planted as missed (``PLANT_MISS_ENV``: the goal's bound becomes one no ratio meets, so the
benchmark's own comparison makes the FAIL), and it must end FAIL with exit 1: a benchmark that ignored its
own verdict would exit 0. Whether a ratio meets its goal is for the full-size
run (``benchmarks/run-all``).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
PLANT_MISS_ENV = "PREFECT_EXECUTORCH_BENCHMARK_PLANT_MISS"  # benchmarks/_common.py's
RESULT_LINE = re.compile(r"RESULT (?P<name>\w+) ratio=(?P<ratio>\S+) goal=(?P<goal>\S+) (?P<verdict>PASS|FAIL)")
NUMBER = re.compile(r"-?(?:\d+\.?\d*|nan|inf)", re.IGNORECASE)


#: Benchmarks whose ratio is a slope (scaling: marginal seconds per MB against a bound): at smoke sizes, build-time
#: noise can make it zero or negative (CI saw -0.792 at 1-5 MB and -0.410 at 1-40 MB beside a CPU burner).
SLOPES = {"scaling"}
#: How far a result file's mtime may fall before the run's start and still be the run's (s).
MTIME_SLACK_S = 1.0


def judge_smoke_run(result: subprocess.CompletedProcess[str], name: str, started: float,
                    results: Path = BENCHMARKS / "results") -> list[str]:
    """What is wrong with a smoke run of benchmark ``name`` (empty when the harness worked)."""
    if result.returncode not in (0, 1) or "Traceback" in result.stderr:
        return [f"crashed (exit {result.returncode}): {result.stderr[-3000:]}"]
    lines = result.stdout.strip().splitlines()
    match = RESULT_LINE.fullmatch(lines[-1]) if lines else None
    if match is None or match["name"] != name:
        return [f"last line is not a RESULT line of {name}: {lines[-1:]}; stderr: {result.stderr[-3000:]}"]
    problems = []
    ratio = float(match["ratio"])
    if not (math.isfinite(ratio) and (ratio > 0 or name in SLOPES)):
        problems.append(f"ratio {match['ratio']} is not a positive finite number")
    if (match["verdict"] == "PASS") != (result.returncode == 0):
        problems.append(f"{match['verdict']} with exit {result.returncode}")
    saved = results / f"{name}.json"
    payload = json.loads(saved.read_text()) if saved.is_file() else {}
    # A file's mtime comes from the kernel's coarse clock, up to a tick behind time.time(): a file written right
    # after ``started`` (the judge's own test) could look older than the run. An earlier run's file is minutes old.
    if not payload or saved.stat().st_mtime < started - MTIME_SLACK_S:
        return [*problems, f"{saved} was not written by this run"]
    if f"{payload['ratio']:.3f}" != match["ratio"] or payload["passed"] != (match["verdict"] == "PASS"):
        problems.append(f"{saved} says ratio {payload['ratio']} passed={payload['passed']}, the RESULT line {lines[-1]}")
    for figure, value in payload["figures"].items():
        if any(not math.isfinite(float(n)) for n in NUMBER.findall(str(value))):
            problems.append(f"figure {figure!r} is not finite: {value}")
    problems += [f"check {check!r} failed" for check, ok in payload.get("checks", {}).items() if not ok]
    return problems


#: Every benchmark at its smallest size (run apart from the suite: `.ci/run` runs `-m benchmark_smoke`).
SMOKE_RUNS = [
    ("publish_1gib.py", ["--size-mib", "16"], "publish"),
    ("pull_verify.py", ["--size-mib", "16"], "pull"),
    ("cache_hit.py", [], "cache_hit"),
    ("cli.py", ["--rounds", "3"], "cli_overhead"),
    ("orchestration_overhead.py", ["--repeat", "3"], "orchestration_overhead"),
    ("validation_cost.py", ["--repeats", "3"], "validation_cost"),
    ("scaling.py", ["--sizes-mb", "1", "5"], "scaling"),
    ("quantization.py", ["--smoke", "--rounds", "3", "--runs", "5"], "quantization"),
    ("fleet.py", ["--smoke"], "fleet"),
    ("llm.py", ["--smoke", "--rounds", "3", "--new-tokens", "16"], "llm"),
    ("asr.py", ["--smoke", "--rounds", "3"], "asr"),
    ("cpp_consumer.py", ["--calls", "20", "--rounds", "3"], "cpp_consumer"),
]


@pytest.mark.benchmark_smoke
@pytest.mark.parametrize(("script", "args", "name"), SMOKE_RUNS, ids=[run[0] for run in SMOKE_RUNS])
def test_benchmark_smoke_run_reports_a_planted_miss(script: str, args: list[str], name: str, tmp_path: Path) -> None:
    # The goal is planted as missed: the run must still finish by itself with every figure sound, and exit 1
    # on the FAIL (a benchmark that ignored its verdict would exit 0); goals themselves are judged by run-all.
    started = time.time()
    # Its results go to a folder of its own: benchmarks/results holds full-size runs only.
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True,
                            timeout=1800, env={**os.environ, PLANT_MISS_ENV: "1",
                                               "PREFECT_EXECUTORCH_BENCHMARK_RESULTS": str(tmp_path)})
    problems = judge_smoke_run(result, name, started, results=tmp_path)
    assert not problems, "\n".join(problems)
    assert result.returncode == 1 and result.stdout.rstrip().endswith("FAIL"), result.stdout[-500:]


def test_the_smoke_judge_refuses_a_crash_and_a_failed_check(tmp_path: Path) -> None:
    started = time.time()
    crash = subprocess.CompletedProcess([], 1, "", "Traceback (most recent call last):\n  ...\nKeyError: 'x'\n")
    assert judge_smoke_run(crash, "publish", started)[0].startswith("crashed (exit 1)")
    killed = subprocess.CompletedProcess([], -9, "  size_mib: 16\n", "")
    assert judge_smoke_run(killed, "publish", started)[0].startswith("crashed (exit -9)")
    cut = subprocess.CompletedProcess([], 0, "  size_mib: 16\n", "")
    assert "is not a RESULT line of publish" in judge_smoke_run(cut, "publish", started)[0]
    lying = subprocess.CompletedProcess([], 0, "RESULT publish ratio=nan goal=>=0.95 FAIL\n", "")
    problems = judge_smoke_run(lying, "publish", started, results=tmp_path)
    assert "ratio nan is not a positive finite number" in problems and "FAIL with exit 0" in problems
    # A slope may come out negative at smoke sizes; a ratio of times may not, and no ratio may be nan.
    for name, ratio, flagged in (("scaling", "-0.410", False), ("publish", "-0.410", True), ("scaling", "nan", True)):
        line = subprocess.CompletedProcess([], 1, f"RESULT {name} ratio={ratio} goal=<=1 FAIL\n", "")
        judged = judge_smoke_run(line, name, started, results=tmp_path)
        assert (f"ratio {ratio} is not a positive finite number" in judged) is flagged, (name, ratio, judged)
    assert problems[-1] == f"{tmp_path / 'publish.json'} was not written by this run"
    # A FAIL whose own checks failed too is not the accepted one: the ratio is not the only reason.
    (tmp_path / "publish.json").write_text(json.dumps({"ratio": 0.5, "passed": False, "figures": {
        "size_mib": 16, "S3Store.put_file": "nan s, inf MiB/s"}, "checks": {"memory within bound": False}}))
    failed = subprocess.CompletedProcess([], 1, "  size_mib: 16\nRESULT publish ratio=0.500 goal=>=0.95 FAIL\n", "")
    assert judge_smoke_run(failed, "publish", started, results=tmp_path) == [
        "figure 'S3Store.put_file' is not finite: nan s, inf MiB/s", "check 'memory within bound' failed"]
