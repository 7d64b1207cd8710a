"""Quantization: program size, build time and latency of float32, int8-dynamic and int8da4w XNNPACK builds.

One weight-heavy MLP (two 1024 x 1024 linears, 8 MiB of float32 weights; ``--smoke``: 256 x 256) is
exported and validated in three schemes: float32, int8-dynamic (int8 weights per channel) and
int8da4w (int4 weights in groups of 32), ``--builds`` times each (at least 3, the schemes interleaved);
build times are the median, min and max of those builds. Each build is validated against the float
eager model with its scheme's default gates. The three programs are then loaded into this process
and timed in interleaved rounds (so machine load hits all three alike); each one's latency is the
median, min and max of its rounds' medians, and the median is set against the float32 program's.
Program sizes must be the same in every build (the run fails otherwise).

The last line is ``RESULT quantization ratio=<worst size ratio / its goal> goal=<=1 PASS|FAIL``:
int8 <= 0.35x and int8da4w <= 0.22x of the float32 program, so a ratio <= 1 meets both; a build
that fails its gates makes the run fail whatever the sizes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import interleaved, report, scratch, spread  # noqa: E402

from prefect_executorch.export.exporter import export_program  # noqa: E402
from prefect_executorch.spec.buildspec import parse_spec  # noqa: E402
from prefect_executorch.validate.validator import validate_program  # noqa: E402

#: ``wide_<width>``: two square linears (tests/models.py's ``Wide``), 8 MiB of float32 weights at 1024.
MODELS = Path(__file__).resolve().parents[1] / "tests" / "models.py"
#: Program size of each quantized build over the float32 program's, at most.
GOALS = {"int8-dynamic": 0.35, "int8da4w": 0.22}


def build(scheme: str | None, width: int, work: Path) -> dict[str, Any]:
    """Export and validate one build; its size, times, gate result and latency."""
    spec = parse_spec({
        "name": "quantization", "version": scheme or "float32", "model": f"{MODELS}:wide_{width}", "target": "xnnpack",
        "methods": {"forward": {"inputs": [{"name": "x", "shape": [8, width]}]}},
        "validation": {"samples": 2, "latency_runs": 0},
        **({"quantization": {"scheme": scheme}} if scheme else {}),
    })
    started = time.perf_counter()
    export = export_program(spec, work / "out")
    exported = time.perf_counter()
    result = validate_program(spec, export.path, export.data_files, scratch_dir=work / "out")
    validated = time.perf_counter()
    summary = result.summary()
    return {
        "program": str(export.path / export.program),
        "program_bytes": (export.path / export.program).stat().st_size,
        "export_s": round(exported - started, 2), "validate_s": round(validated - exported, 2),
        "build_s": round(validated - started, 2), "passed": result.passed,
        "min_cosine_vs_float": summary.min_cosine_seen, "worst": summary.worst,
        "quantization_rel_error": summary.quantization_rel_error, "lowering_rel_error": summary.lowering_rel_error,
    }


def interleaved_latency(programs: dict[str, str], width: int, rounds: int, runs: int) -> dict[str, list[float]]:
    """Each round's median ms per call of each program, timed round-robin in this process (``runs`` calls per round)."""
    import torch

    from prefect_executorch.runtime.loaded_program import LoadedProgram

    loaded = {name: LoadedProgram(Path(path)) for name, path in programs.items()}
    inputs = (torch.rand(8, width) * 2 - 1,)
    medians: dict[str, list[float]] = {name: [] for name in loaded}
    for program in loaded.values():
        program.execute("forward", inputs)  # first call initialises XNNPACK: not timed
    for _ in range(rounds):
        for name, program in loaded.items():
            times = []
            for _ in range(runs):
                started = time.perf_counter()
                program.execute("forward", inputs)
                times.append((time.perf_counter() - started) * 1000)
            medians[name].append(statistics.median(times))
    return medians


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="Width 256 (0.5 MiB of weights): the small size CI runs.")
    parser.add_argument("--rounds", type=int, default=10, help="Interleaved timing rounds.")
    parser.add_argument("--runs", type=int, default=20, help="Timed calls of each program per round.")
    parser.add_argument("--builds", type=int, default=3, help="Builds of each scheme (at least 3).")
    args = parser.parse_args()
    if args.builds < 3 or args.rounds < 3:
        parser.error("--builds and --rounds must be at least 3 (medians of 3 or more runs are compared)")
    width = 256 if args.smoke else 1024
    os.environ.setdefault("DO_NOT_TRACK", "1")
    work = scratch("bench-quantization-")
    # The first export of a process pays the export server's imports: not a cost of any scheme.
    warm_up_s = build(None, 256, work)["build_s"]
    schemes = {"float32": None, "int8-dynamic": "int8-dynamic", "int8da4w": "int8da4w"}
    builds = interleaved({name: lambda _, scheme=scheme: build(scheme, width, work) for name, scheme in schemes.items()},
                         args.builds)
    sizes = {name: {row["program_bytes"] for row in runs} for name, runs in builds.items()}
    if any(len(found) != 1 for found in sizes.values()):
        raise SystemExit(f"program sizes differ between builds of one scheme: {sizes}")
    rows = {name: {**runs[0], **{key: spread([row[key] for row in runs]) for key in ("export_s", "validate_s", "build_s")},
                   "passed": all(row["passed"] for row in runs)} for name, runs in builds.items()}
    latency = interleaved_latency({name: row.pop("program") for name, row in rows.items()}, width, args.rounds, args.runs)
    for name, row in rows.items():
        row["program_latency"] = spread(latency[name], digits=4, unit="ms")
    base = rows["float32"]
    for name, row in rows.items():
        row["size_vs_float32"] = round(row["program_bytes"] / base["program_bytes"], 4)
        row["build_time_vs_float32"] = round(row["build_s"]["median_s"] / base["build_s"]["median_s"], 3)
        row["latency_vs_float32"] = round(row["program_latency"]["median_ms"] / base["program_latency"]["median_ms"], 3)
        print(name, row)
    worst = max(rows[name]["size_vs_float32"] / goal for name, goal in GOALS.items())
    failed = [name for name, row in rows.items() if not row["passed"]]
    figures: dict[str, Any] = {"weights_mib": round(2 * width * (width + 1) * 4 / 2**20, 2), **rows,
                               "goals": {name: f"size <= {goal}x float32" for name, goal in GOALS.items()},
                               "failed_gates": failed, "warm_up_s": warm_up_s}
    # A build that fails its gates fails the run, whatever its size.
    return 0 if report("quantization", worst if not failed else float("inf"), "<=1", figures) else 1


if __name__ == "__main__":
    sys.exit(main())
