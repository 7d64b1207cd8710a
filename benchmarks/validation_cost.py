"""Validation cost: the isolated validating child vs the same validation run in this (warm) process.

Each variant validates the same small XNNPACK program (export once, not timed):

* ``in-process``: ``validate_in_child`` called here after a warm-up call (imports and caches warm);
* ``child (forkserver)``: ``validate_program`` as the build flow runs it: a child forked from the
  preloaded forkserver (its one-time start is reported apart);
* ``child (spawn)``: ``PREFECT_EXECUTORCH_CHILD_START=spawn``, a plain fresh interpreter per validation
  with the same imports (torch, the runtime extension and this package's light modules);
* ``python + import torch``: the floor of any fresh interpreter that runs a torch model.

The timed validations check outputs only (``latency_runs: 0``): validation's latency measurement runs
windows of calls until they are stable (up to ``latency_max_s``), so its length is the measurement's, not the
isolation's, and it varies with the machine's load (profiled in a child on 2026-12-05: 88% of a validation of
0.34 s was in ``measure_latency``, 6,201 eager and 3,435 program calls). One forkserver child with the default
latency measurement is reported beside them, not compared.

Run: ``python benchmarks/validation_cost.py [--repeats 3]`` (at least 3: each variant reports the median,
min and max of its runs, and the ratio is taken on the medians).
The last line is ``RESULT validation_cost ratio=<forkserver child / spawned child> goal=<=0.1 PASS|FAIL``.
Why that goal: every validation, bundled check and side-by-side is a child, and a user waits for each
start; the forkserver must make it at least 10x cheaper than starting a plain interpreter with the same
imports, or isolation would cost seconds per check. The child against in-process validation is printed
too; for a model that validates in ~10 ms it is dominated by the child's fixed cost (fork, request and
response files), so it is reported, not the goal.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _common import report, spread  # noqa: E402

from prefect_executorch.isolation import START_METHOD_ENV  # noqa: E402

#: Goal for forkserver child / spawned child: a fork and the request files, not the imports (see the docstring).
GOAL = 0.1


class SmallModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 128), nn.Linear(128, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def small_model() -> nn.Module:
    """The benchmark's model (the spec points here)."""
    torch.manual_seed(0)
    return SmallModel()


def _seconds(call: Callable[[], Any], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="Timed validations per variant.")
    parser.add_argument("--samples", type=int, default=2, help="Random samples per shape (min/opt/max).")
    args = parser.parse_args()
    if args.repeats < 3:
        parser.error("--repeats must be at least 3 (the median of 3 or more runs is compared)")
    work = Path(tempfile.mkdtemp(prefix="validation-cost-"))
    try:
        return _measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure(args: argparse.Namespace, work: Path) -> int:
    from prefect_executorch.export.exporter import export_program
    from prefect_executorch.spec.buildspec import parse_spec
    from prefect_executorch.validate.validator import ValidateRequest, validate_in_child, validate_program

    spec = parse_spec({
        "name": "validation-cost", "version": "1", "model": f"{Path(__file__).resolve()}:small_model", "target": "xnnpack",
        "methods": {"forward": {"inputs": [{"name": "x", "shape": [4, 64], "dynamic": {0: {"min": 1, "max": 16}}}]}},
        "validation": {"samples": args.samples, "latency_runs": 0},
    })
    started = time.perf_counter()
    export = export_program(spec, work)
    print(f"export (once, not compared): {time.perf_counter() - started:.1f} s")
    request = ValidateRequest(spec=spec, bundle_dir=export.out_dir, data_files=export.data_files,
                              delegation=export.delegation).model_dump(mode="json")

    def child() -> None:
        assert validate_program(spec, export.path, export.data_files, scratch_dir=work, delegation=export.delegation).passed

    assert validate_in_child(request).passed  # warm-up: imports, kernels, caches
    figures = {"in-process": _seconds(lambda: validate_in_child(request), args.repeats)}
    figures["first forked validation"] = _seconds(child, 1)
    figures["child (forkserver)"] = _seconds(child, args.repeats)
    saved = dict(os.environ)
    try:
        os.environ[START_METHOD_ENV] = "spawn"
        figures["child (spawn)"] = _seconds(child, args.repeats)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    timed = spec.model_copy(update={"validation": spec.validation.model_copy(update={"latency_runs": 5})})
    figures["child (forkserver), latency measured too"] = _seconds(
        lambda: validate_program(timed, export.path, export.data_files, scratch_dir=work, delegation=export.delegation), 1)
    figures["python + import torch"] = _seconds(
        lambda: subprocess.run([sys.executable, "-c", "import torch"], check=True), args.repeats)

    spreads = {name: spread(times, digits=3) for name, times in figures.items()}
    medians = {name: statistics.median(times) for name, times in figures.items()}
    spawn = medians["child (spawn)"]
    ratio = medians["child (forkserver)"] / spawn
    figures_out = {
        **{f"{name} s": spreads[name] for name in figures},
        "forkserver child / in-process": round(medians["child (forkserver)"] / medians["in-process"], 1),
        "forkserver child overhead s": round(medians["child (forkserver)"] - medians["in-process"], 3),
        "spawn child / in-process": round(spawn / medians["in-process"], 1),
    }
    return 0 if report("validation_cost", ratio, f"<={GOAL:g}", figures_out) else 1


if __name__ == "__main__":
    sys.exit(main())
