"""Fault bookkeeping: every reliability test records what it injected and what survived.

The session ends with a summary table (quoted in README's reliability section).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from prefect_executorch.artifacts.registry import prepare_bundle
from prefect_executorch.exporter import export_program
from prefect_executorch.spec import parse_spec
from prefect_executorch.toolchain import probe
from prefect_executorch.validator import validate_program

from helpers import spec_data
from realbundle import SHAPES, RealBundle


@pytest.fixture(scope="session")
def real_bundle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], RealBundle]]:
    """Export, validate and prepare (not publish) a model of ``SHAPES``; once per session."""
    made: dict[str, RealBundle] = {}

    def make(factory: str) -> RealBundle:
        if factory not in made:
            spec = parse_spec(spec_data(factory, external_weights=True,
                                        methods={"forward": {"inputs": [{"name": "x", "shape": SHAPES[factory]}]}}))
            root = tmp_path_factory.mktemp(factory)
            export = export_program(spec, root / "export")
            report = validate_program(spec, export.path, export.data_files, scratch_dir=root)
            manifest = prepare_bundle(spec, probe(), export, report)
            made[factory] = RealBundle(spec=spec, dir=export.path, manifest=manifest)
        return made[factory]

    yield make
    for bundle in made.values():
        shutil.rmtree(bundle.dir, ignore_errors=True)


@dataclass
class Fault:
    """One injected fault and its outcome."""

    area: str
    fault: str
    injected: int
    survived: int
    objects_lost: int = 0


FAULTS: list[Fault] = []


@dataclass
class ParserRun:
    """Generated inputs one parser saw in a property test, how many it refused with a typed error, and how many
    broke an invariant (accepted nonsense, did not round-trip, raised an untyped error)."""

    parser: str
    seen: int
    refused: int
    violations: int


PARSER_RUNS: list[ParserRun] = []


@pytest.fixture
def record_fault() -> Callable[..., None]:
    """Record a fault; call it after the assertions that prove it was survived."""

    def record(area: str, fault: str, injected: int = 1, survived: int | None = None, objects_lost: int = 0) -> None:
        FAULTS.append(Fault(area, fault, injected, injected if survived is None else survived, objects_lost))

    return record


@pytest.fixture
def record_parser() -> Callable[[str, int, int, int], None]:
    """Record a parser's property-test counts, as observed (the test fails afterwards on a violation)."""

    def record(parser: str, seen: int, refused: int, violations: int) -> None:
        PARSER_RUNS.append(ParserRun(parser, seen, refused, violations))

    return record


def _parser_summary(write: Callable[[str], None]) -> None:
    rows: list[tuple[Any, ...]] = [(r.parser, r.seen, r.refused, r.seen - r.refused, r.violations) for r in PARSER_RUNS]
    rows.append(("total", *(sum(column) for column in list(zip(*rows, strict=False))[1:])))
    width = max(len(row[0]) for row in rows)
    write("")
    write("parser property tests (every generated input judged; violations as counted, a failed test's too)")
    for row in [("parser", "inputs", "refused", "accepted", "violations"), *rows]:
        write(f"{row[0]:<{width}} " + " ".join(f"{value:>10}" for value in row[1:]))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    write = terminalreporter.write_line
    if PARSER_RUNS:
        _parser_summary(write)
    if not FAULTS:
        return
    width = max(len(f.fault) for f in FAULTS)
    write("")
    write("reliability summary (a row is written once its test's assertions have passed)")
    write(f"{'area':<12} {'fault':<{width}} {'injected':>8} {'survived':>8} {'lost':>5}")
    for f in FAULTS:
        write(f"{f.area:<12} {f.fault:<{width}} {f.injected:>8} {f.survived:>8} {f.objects_lost:>5}")
    write(f"{'total':<12} {'':<{width}} {sum(f.injected for f in FAULTS):>8} "
          f"{sum(f.survived for f in FAULTS):>8} {sum(f.objects_lost for f in FAULTS):>5}")
    write("")
    write("by area")
    write(f"{'area':<12} {'kinds':>5} {'injected':>8} {'survived':>8} {'lost':>5}")
    for area in sorted({f.area for f in FAULTS}):
        rows = [f for f in FAULTS if f.area == area]
        write(f"{area:<12} {len(rows):>5} {sum(f.injected for f in rows):>8} {sum(f.survived for f in rows):>8} "
              f"{sum(f.objects_lost for f in rows):>5}")
