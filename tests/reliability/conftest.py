"""Fault bookkeeping: every reliability test counts what it injected, what survived and what was lost.

The session ends with a summary table (quoted in README's reliability section).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from prefect_executorch.artifacts.manifest import BundleKey
from prefect_executorch.artifacts.registry import prepare_bundle, pull, verify_bundle_dir
from prefect_executorch.artifacts.store import ObjectStore
from prefect_executorch.errors import PrefectExecutorchError
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
    """One kind of injected fault and what its test observed: each count is made by the test, none assumed.

    ``survived``: injected faults whose operation ended as it must (a typed error, or a clean retry);
    ``guarded``: bundles published before the fault, pulled and verified after it; ``lost``: those that
    no longer pull and verify.
    """

    area: str
    fault: str
    injected: int = 0
    survived: int = 0
    guarded: int = 0
    lost: int = 0

    @contextmanager
    def expect(self, error: type[BaseException] | tuple[type[BaseException], ...], match: str | None = None) -> Iterator[Any]:
        """Inject one fault here, whose operation must end in ``error``; counted survived when it does."""
        self.injected += 1
        with pytest.raises(error, match=match) as info:
            yield info
        self.survived += 1

    def outcome(self, injected: int, survived: int) -> None:
        """Faults injected and survived as the test counted them (a race's outcome, a fault proxy's hits)."""
        self.injected += injected
        self.survived += survived

    def check_intact(self, store: ObjectStore, keys: list[BundleKey], scratch: Path) -> None:
        """Pull and verify each bundle that was published before the fault; count those that no longer do."""
        for key in keys:
            self.guarded += 1
            dest = scratch / f"intact-{uuid.uuid4().hex[:8]}"
            try:
                pull(store, key, dest)
                verify_bundle_dir(dest)
            except PrefectExecutorchError:
                self.lost += 1


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
def faults() -> Callable[..., Fault]:
    """Start the ledger of one kind of fault (in the summary whatever the test's outcome; not when ``planted``)."""

    def start(area: str, fault: str, planted: bool = False) -> Fault:
        ledger = Fault(area, fault)
        if not planted:  # the ledger's own checks plant losses: they are no fault of the product's
            FAULTS.append(ledger)
        return ledger

    return start


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
    header = f"{'injected':>8} {'survived':>8} {'guarded':>7} {'lost':>5}"

    def counts(rows: list[Fault]) -> str:
        return (f"{sum(f.injected for f in rows):>8} {sum(f.survived for f in rows):>8} "
                f"{sum(f.guarded for f in rows):>7} {sum(f.lost for f in rows):>5}")

    write("")
    write("reliability summary (counted by each test: survived = ended in a typed error or a clean retry; "
          "guarded = bundles published before the fault, pulled and verified after it; lost = those that failed)")
    write(f"{'area':<12} {'fault':<{width}} {header}")
    for f in FAULTS:
        write(f"{f.area:<12} {f.fault:<{width}} {counts([f])}")
    write(f"{'total':<12} {'':<{width}} {counts(FAULTS)}")
    write("")
    write("by area")
    write(f"{'area':<12} {'kinds':>5} {header}")
    for area in sorted({f.area for f in FAULTS}):
        rows = [f for f in FAULTS if f.area == area]
        write(f"{area:<12} {len(rows):>5} {counts(rows)}")
