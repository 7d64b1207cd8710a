"""``model.bpte``: an ExecuTorch BundledProgram of the published program with the validation cases.

The validating child writes it from the cases it has just compared (inputs and eager outputs), so
the cases are drawn once; a separate child loads it with ExecuTorch's own bundled-I/O entry points
and verifies every case at the tolerances validation used (``runtime/bundled_cases.py``). Whoever pulls
the bundle runs the same check (``prefect-executorch verify``), or ``executor_runner --bundleio_path`` from C++.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_executorch.runtime.bundled_cases import (
    BUNDLED_FILE,
    BUNDLED_TARGETS,
    BundledFacts,
    BundledMethod,
    bundled_settings,
)
from prefect_executorch.validate.report import ValidationReport

if TYPE_CHECKING:
    import torch

    from prefect_executorch.settings import BundledSettings
    from prefect_executorch.spec.buildspec import BuildSpec

#: Recorded cases per method: (inputs, eager outputs flattened in the program's output order).
Cases = dict[str, list[tuple[tuple["torch.Tensor", ...], list[Any]]]]


def skip_reason(program: Path, spec: BuildSpec, settings: BundledSettings | None = None) -> str | None:
    """Why ``program`` gets no ``.bpte`` (its target, quantization or size), or None when it gets one."""
    target = spec.target_name
    if target not in BUNDLED_TARGETS:
        return f"bundled cases are built for the {', '.join(BUNDLED_TARGETS)} targets only, not {target!r}"
    limit = (settings or bundled_settings()).bundled_max_program_mib
    size_mib = program.stat().st_size / 2**20
    if size_mib > limit:
        return (f"program is {size_mib:.1f} MiB, above PREFECT_EXECUTORCH_BUNDLED_MAX_PROGRAM_MIB={limit:g}; "
                "raise it to bundle the validation cases")
    return None


def method_cases(report: ValidationReport) -> dict[str, BundledMethod]:
    """Labels and tolerances of the cases validation ran, per method, in the order the ``.bpte`` holds them."""
    def loosest(values: list[float | None], pick: Any) -> float | None:
        given = [value for value in values if value is not None]
        return pick(given) if given else None

    methods: dict[str, BundledMethod] = {}
    for case in report.cases:
        entry = methods.setdefault(case.method, BundledMethod(cases=[]))
        entry.cases.append(f"{case.shape_label}[{case.sample}]")
        outs = case.outputs
        entry.atol = loosest([entry.atol, *(o.atol for o in outs)], max)
        entry.rtol = loosest([entry.rtol, *(o.rtol for o in outs)], max)
        entry.min_cosine = loosest([entry.min_cosine, *(o.min_cosine for o in outs)], min)
        entry.max_rel_error = loosest([entry.max_rel_error, *(o.max_rel_error for o in outs)], max)
    return methods


def bundled_facts(bundle_dir: Path, program: str, spec: BuildSpec, report: ValidationReport) -> BundledFacts:
    """The manifest's record of the bundle's ``.bpte``: its cases, or why there is none."""
    if (bundle_dir / BUNDLED_FILE).is_file():
        return BundledFacts(file=BUNDLED_FILE, methods=method_cases(report))
    return BundledFacts(skipped=skip_reason(bundle_dir / program, spec)
                        or "validation did not write one (an output that is not a tensor, or it was run without)")


def write_bundled(program: Path, cases: Cases, out: Path) -> None:
    """Write ``out``: the exact bytes of ``program`` with every recorded case (child side: imports exir).

    Nothing is written when an input or output is not a tensor: a BundledProgram holds tensor outputs only.
    """
    import torch
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.core import BundledProgram
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    values = [value for recorded in cases.values() for inputs, outputs in recorded for value in (*inputs, *outputs)]
    if not all(isinstance(value, torch.Tensor) for value in values):
        return
    suites = [
        MethodTestSuite(method_name=name, test_cases=[
            MethodTestCase(inputs=[t.contiguous().cpu() for t in inputs],
                           expected_outputs=[t.contiguous().cpu() for t in outputs])
            for inputs, outputs in recorded])
        for name, recorded in cases.items()
    ]
    # From the file, not a program manager: the bundle embeds the published bytes, not a re-serialization.
    bundled = BundledProgram(None, suites, pte_file_path=str(program))
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(serialize_from_bundled_program_to_flatbuffer(bundled))
    tmp.rename(out)


