"""Validation cost: the isolated validating child vs the same validation run in this (warm) process.

The child pays for a fresh interpreter and its imports; this measures how much, for a small model:

* ``in-process``: ``validate_in_child`` called here after a warm-up call (imports and caches warm);
* ``child``: ``validate_program``, the child process the build flow runs;
* ``child, old imports``: the same child made to import what it imported before this change
  (``executorch.exir``'s deserializer to read the .pte and ``pybindings.portable_lib``, whose wrapper
  imports all of exir), through a ``sitecustomize`` on its ``PYTHONPATH``;
* ``python + import torch``: the floor any fresh process that runs a torch model pays.

Run: ``python benchmarks/validation_cost.py [--repeats 3]``. The last line is
``RESULT validation_cost ratio=<child / in-process> goal=<=<y> PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

#: Goal for child / in-process. With exir's imports the child measured 70x here, without them 23x
#: (2 loaded cores); what is left is mostly the interpreter and ``import torch``.
GOAL = 40.0
OLD_IMPORTS = "import executorch.exir._serialize._program, executorch.exir.schema, executorch.extension.pybindings.portable_lib\n"


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


def _machine() -> dict[str, Any]:
    from prefect_executorch.toolchain import dist_version

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    return {"cores": os.cpu_count(), "memory_mib": memory, "machine": platform.machine(), "python": platform.python_version(),
            "torch": torch.__version__, "executorch": dist_version("executorch"), "load_avg": os.getloadavg()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="Timed validations per variant.")
    parser.add_argument("--samples", type=int, default=2, help="Random samples per shape (min/opt/max).")
    args = parser.parse_args()

    from prefect_executorch.exporter import export_program
    from prefect_executorch.spec import parse_spec
    from prefect_executorch.validator import ValidateRequest, validate_in_child, validate_program

    work = Path(tempfile.mkdtemp(prefix="validation-cost-"))
    spec = parse_spec({
        "name": "validation-cost", "version": "1", "model": f"{Path(__file__).resolve()}:small_model", "target": "xnnpack",
        "methods": {"forward": {"inputs": [{"name": "x", "shape": [4, 64], "dynamic": {0: {"min": 1, "max": 16}}}]}},
        "validation": {"samples": args.samples, "latency_runs": 5},
    })
    started = time.perf_counter()
    export = export_program(spec, work)
    print(f"export (once, not compared): {time.perf_counter() - started:.1f} s")
    request = ValidateRequest(spec=spec, bundle_dir=export.out_dir, data_files=export.data_files,
                              delegation=export.delegation).model_dump(mode="json")

    def child() -> None:
        assert validate_program(spec, export.path, export.data_files, scratch_dir=work, delegation=export.delegation).passed

    assert validate_in_child(request).passed  # warm-up: imports, kernels, caches
    figures = {"in-process": _seconds(lambda: validate_in_child(request), args.repeats), "child": _seconds(child, args.repeats)}
    old = work / "old-imports"
    old.mkdir()
    (old / "sitecustomize.py").write_text(OLD_IMPORTS)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(old), saved]))
    try:
        figures["child, old imports"] = _seconds(child, args.repeats)
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    figures["python + import torch"] = _seconds(
        lambda: subprocess.run([sys.executable, "-c", "import torch"], check=True), args.repeats)

    medians = {name: statistics.median(times) for name, times in figures.items()}
    for name, median in medians.items():
        print(f"{name:>24}: median {median:7.3f} s  ({', '.join(f'{t:.3f}' for t in figures[name])})")
    ratio = medians["child"] / medians["in-process"]
    before = medians["child, old imports"] / medians["in-process"]
    print(f"child / in-process: {ratio:.1f} (old imports: {before:.1f}); the child got "
          f"{medians['child, old imports'] / medians['child']:.1f}x cheaper; "
          f"child - in-process = {medians['child'] - medians['in-process']:.2f} s vs "
          f"{medians['python + import torch']:.2f} s for python + import torch")
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    (results / "validation_cost.json").write_text(json.dumps(
        {"machine": _machine(), "repeats": args.repeats, "samples": args.samples, "seconds": figures, "medians": medians,
         "ratio": ratio, "ratio_old_imports": before, "goal": GOAL}, indent=2))
    passed = ratio <= GOAL
    print(f"RESULT validation_cost ratio={ratio:.2f} goal=<={GOAL:g} {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
