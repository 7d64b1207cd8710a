"""Export children that die, hang or run out of memory fail the task, and the caller lives on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prefect_executorch.errors import ExportFailed, SpecError
from prefect_executorch.export.exporter import export_program
from prefect_executorch.validate.validator import validate_program


def _nothing_left(out: Path) -> bool:
    return not out.exists() or list(out.iterdir()) == []


@pytest.mark.parametrize(
    ("factory", "overrides", "expected"),
    [
        ("kills_itself", {}, "was killed by SIGKILL"),
        ("aborts", {}, "was killed by SIGABRT"),
        ("hangs", {"export_timeout_s": 5}, "timed out after 5 s and was killed"),
        ("allocates_too_much", {"export_memory_limit_mib": 6144}, "ran out of memory (memory limit 6144 MiB)"),
    ],
)
def test_export_child_faults_become_failed_exports(make_spec, faults, tmp_path: Path, factory: str,
                                                   overrides: dict, expected: str) -> None:
    out = tmp_path / "out"
    with faults("process", f"export child: {factory}").expect(ExportFailed, match=re.escape(expected)):
        export_program(make_spec(factory, **overrides), out)
    assert _nothing_left(out), list(out.iterdir())


def test_factory_that_raises_is_a_spec_error_naming_the_model(make_spec, faults, tmp_path: Path) -> None:
    with faults("bad input", "factory raises").expect(
            SpecError, match="model: factory .* raised RuntimeError: factory exploded on purpose"):
        export_program(make_spec("raises"), tmp_path / "out")
    assert _nothing_left(tmp_path / "out")


def test_the_process_builds_again_after_a_crashed_export(make_spec, faults, tmp_path: Path) -> None:
    with faults("process", "crash, then the next export in the same process").expect(ExportFailed):
        export_program(make_spec("aborts"), tmp_path / "out")
    spec = make_spec("mlp", methods={"forward": {"inputs": [{"name": "x", "shape": [2, 32]}]}}, target="portable")
    result = export_program(spec, tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == [result.path.name]
    # The program built after the crash is whole: it loads and matches eager at every case.
    report = validate_program(spec, result.path, result.data_files, scratch_dir=tmp_path)
    assert report.passed and report.cases and all(case.outputs for case in report.cases)
