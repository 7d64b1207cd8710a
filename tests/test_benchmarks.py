"""Smoke runs of the benchmarks at small sizes: they judge the harness, not the goal.

A smoke run must finish by itself (exit 0 for PASS, 1 for FAIL, nothing else), print a RESULT line
that parses, write the same ratio to its results file, and report only finite figures with every
check of its own (a boolean figure such as the memory bound) true. The one FAIL it accepts is the
ratio missing its goal (``SMOKE_RATIO_REASON``); whether a ratio meets its goal is for the
full-size run (``benchmarks/run-all``).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
#: Why a smoke run may miss its ratio goal and still pass this test.
SMOKE_RATIO_REASON = ("at 16 MiB the fixed per-object costs (create-only check, checksum set-up) and a shared "
                      "machine's noise decide the ratio; its goal is judged at 1 GiB by benchmarks/run-all")
RESULT_LINE = re.compile(r"RESULT (?P<name>\w+) ratio=(?P<ratio>\S+) goal=(?P<goal>\S+) (?P<verdict>PASS|FAIL)")
NUMBER = re.compile(r"-?(?:\d+\.?\d*|nan|inf)", re.IGNORECASE)


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
    if not (math.isfinite(ratio) and ratio > 0):
        problems.append(f"ratio {match['ratio']} is not a positive finite number")
    if (match["verdict"] == "PASS") != (result.returncode == 0):
        problems.append(f"{match['verdict']} with exit {result.returncode}")
    saved = results / f"{name}.json"
    payload = json.loads(saved.read_text()) if saved.is_file() else {}
    if not payload or saved.stat().st_mtime < started:
        return [*problems, f"{saved} was not written by this run"]
    if f"{payload['ratio']:.3f}" != match["ratio"] or payload["passed"] != (match["verdict"] == "PASS"):
        problems.append(f"{saved} says ratio {payload['ratio']} passed={payload['passed']}, the RESULT line {lines[-1]}")
    for figure, value in payload["figures"].items():
        if isinstance(value, bool):
            if not value:
                problems.append(f"check {figure!r} failed")
        elif any(not math.isfinite(float(n)) for n in NUMBER.findall(str(value))):
            problems.append(f"figure {figure!r} is not finite: {value}")
    return problems


@pytest.mark.parametrize(("script", "args", "name"), [
    ("publish_1gib.py", ["--size-mib", "16"], "publish"),
    ("pull_verify.py", ["--size-mib", "16"], "pull"),
])
def test_benchmark_smoke_run(script: str, args: list[str], name: str) -> None:
    started = time.time()
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True,
                            timeout=600)
    problems = judge_smoke_run(result, name, started)
    assert not problems, "\n".join(problems)
    if result.returncode == 1:
        # The only FAIL judge_smoke_run lets through: every check passed, the ratio missed its goal.
        print(f"{name}: ratio below its goal at smoke size, accepted: {SMOKE_RATIO_REASON}")


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
    assert problems[-1] == f"{tmp_path / 'publish.json'} was not written by this run"
    # A FAIL whose own checks failed too is not the accepted one: the ratio is not the only reason.
    (tmp_path / "publish.json").write_text(json.dumps({"ratio": 0.5, "passed": False, "figures": {
        "size_mib": 16, "S3Store.put_file": "nan s, inf MiB/s", "memory within bound": False}}))
    failed = subprocess.CompletedProcess([], 1, "  size_mib: 16\nRESULT publish ratio=0.500 goal=>=0.95 FAIL\n", "")
    assert judge_smoke_run(failed, "publish", started, results=tmp_path) == [
        "figure 'S3Store.put_file' is not finite: nan s, inf MiB/s", "check 'memory within bound' failed"]
