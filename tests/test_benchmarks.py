"""Smoke runs of the benchmarks at small sizes: each must finish and print its RESULT line.

Whether a ratio meets its goal is for the full-size run (`benchmarks/run-all`), not for CI's noise.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize(("script", "args", "name"), [
    ("publish_1gib.py", ["--size-mib", "16"], "publish"),
    ("pull_verify.py", ["--size-mib", "16"], "pull"),
])
def test_benchmark_smoke_run(script: str, args: list[str], name: str) -> None:
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode in (0, 1), result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    assert re.fullmatch(rf"RESULT {name} ratio=\d+\.\d+ goal=>=0\.95 (PASS|FAIL)", last), last
    assert (BENCHMARKS / "results" / f"{name}.json").is_file()
