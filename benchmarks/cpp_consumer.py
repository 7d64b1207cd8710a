"""Per-call latency of a bundle in ExecuTorch's C++ runtime (the tested consumer, as a C++ service links it) vs its
Python runtime, on the same bundle and the same cases.

The demo ConvNet is built through the product (export, validation, publish with its bundled cases) into a local
store. Each side runs every bundled case ``--calls`` times after one warm call and keeps the median call:
the C++ side is ``prefect-executorch verify --cpp``'s consumer (``Module::execute``, timed inside the binary
with ``steady_clock``); the Python side is the same program loaded by the runtime extension the product's
validation uses (``_load_for_executorch`` ... ``run_method``, timed with ``perf_counter``), fed the cases'
inputs read from ``model.bpte``. The sides alternate for ``--rounds`` rounds (the load of a shared machine
hits both alike); a case's figure is the median of its rounds' medians.

The last line is ``RESULT cpp_consumer ratio=<worst case of C++ p50 / Python p50> goal=<=1``: a C++ service
must not pay more per call than the Python runtime (which adds its binding's conversions to every call).
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
from _common import interleaved, report, scratch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def build_demo(work: Path) -> Path:
    """The demo ConvNet built and published with its bundled cases; its bundle folder in the store."""
    os.environ.update({"DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                       "PREFECT_HOME": str(work / "prefect-home"),
                       "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"})
    from prefect_executorch.cli.embedded import embedded_settings
    from prefect_executorch.flows.build import build_bundle
    from prefect_executorch.spec.buildspec import load_spec

    with embedded_settings():
        ref = build_bundle(load_spec(ROOT / "examples" / "convnet" / "spec.yaml"), store=str(work / "store"))
    return work / "store" / ref.key.prefix


def bundled_inputs(bundle: Path, manifest: Any) -> dict[str, tuple[str, tuple[Any, ...]]]:
    """Every bundled case's inputs, keyed as the consumer prints them ('METHOD LABEL')."""
    from executorch.devtools.bundled_program.serialize import deserialize_from_flatbuffer_to_bundled_program

    from prefect_executorch.runtime.bundled_cases import BUNDLED_FILE, bundled_tensors

    suites = {suite.method_name: suite for suite in deserialize_from_flatbuffer_to_bundled_program(
        (bundle / BUNDLED_FILE).read_bytes()).method_test_suites}
    return {f"{name} {label.replace(' ', '_')}": (name, tuple(bundled_tensors(suites[name].test_cases[index].inputs)))
            for name, method in manifest.bundled.methods.items() for index, label in enumerate(method.cases)}


def python_side(bundle: Path, manifest: Any, calls: int) -> Any:
    """Median call of each case through ExecuTorch's Python runtime (µs)."""
    from prefect_executorch.runtime.loaded_program import LoadedProgram

    program = LoadedProgram(bundle / manifest.program, bundle / manifest.data_files[0] if manifest.data_files else None)
    cases = bundled_inputs(bundle, manifest)

    def timed(_: int) -> dict[str, float]:
        medians = {}
        for key, (method, inputs) in cases.items():
            program.execute(method, inputs)  # warm
            micros = []
            for _ in range(calls):
                started = time.perf_counter()
                program.execute(method, inputs)
                micros.append((time.perf_counter() - started) * 1e6)
            medians[key] = statistics.median(micros)
        return medians

    return timed


def cpp_side(bundle: Path, manifest: Any, calls: int) -> Any:
    """Median call of each case through ExecuTorch's C++ runtime (µs), timed inside the consumer."""
    from prefect_executorch.runtime.cpp_consumer import run_cpp_consumer

    def timed(_: int) -> dict[str, float]:
        return run_cpp_consumer(bundle, manifest, time_calls=calls).p50_us

    return timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="Timed calls of each case per round.")
    parser.add_argument("--rounds", type=int, default=5, help="Alternating rounds of the two sides (at least 3).")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds must be at least 3")
    from prefect_executorch.artifacts.publishing import verify_bundle_dir

    bundle = build_demo(scratch("bench-cpp-"))
    manifest = verify_bundle_dir(bundle)
    rounds = interleaved({"python": python_side(bundle, manifest, args.calls),
                          "cpp": cpp_side(bundle, manifest, args.calls)}, args.rounds)
    cases = sorted(rounds["python"][0])
    if sorted(rounds["cpp"][0]) != cases:
        raise SystemExit(f"the sides timed other cases: C++ {sorted(rounds['cpp'][0])}, Python {cases}")
    per_case = {case: {side: statistics.median(r[case] for r in rounds[side]) for side in ("python", "cpp")}
                for case in cases}
    ratios = {case: times["cpp"] / times["python"] for case, times in per_case.items()}
    figures: dict[str, Any] = {
        "bundle": manifest.key.prefix, "calls_per_round": args.calls, "rounds": args.rounds,
        **{f"{case} p50_us (C++, Python)": (round(t["cpp"], 1), round(t["python"], 1)) for case, t in per_case.items()},
        "C++ / Python per case": {case: round(ratio, 3) for case, ratio in ratios.items()},
    }
    return 0 if report("cpp_consumer", max(ratios.values()), "<=1", figures) else 1


if __name__ == "__main__":
    sys.exit(main())
