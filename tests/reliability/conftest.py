"""Fault bookkeeping: every reliability test counts what it injected, what survived and what was lost.

The session ends with a summary table (quoted in README's reliability section).
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from prefect_executorch.artifacts.manifest import BundleKey
from prefect_executorch.artifacts.publishing import prepare_bundle, pull, verify_bundle_dir
from prefect_executorch.artifacts.store import ObjectStore
from prefect_executorch.errors import PrefectExecutorchError
from prefect_executorch.export.exporter import export_program
from prefect_executorch.machine.toolchain import probe
from prefect_executorch.spec.buildspec import parse_spec
from prefect_executorch.validate.validator import validate_program

import ledger
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

    ``survived``: injected faults whose operation ended as it must (a typed error, or a clean retry), in a
    test whose later checks of what the faults left (nothing written, a 403, the retry's bytes) passed too;
    ``verified``: bundles in the store after the fault (published before it, a race's winners, restored
    bytes), pulled and verified after it; ``lost``: those of them that no longer pull and verify.
    """

    area: str
    fault: str
    injected: int = 0
    survived: int = 0
    verified: int = 0
    lost: int = 0

    @contextmanager
    def expect(self, error: type[BaseException] | tuple[type[BaseException], ...], match: str | None = None) -> Iterator[Any]:
        """Inject one fault here, whose operation must end in ``error``; counted survived when it does (see ``settle``)."""
        self.injected += 1
        with pytest.raises(error, match=match) as info:
            yield info
        self.survived += 1

    def outcome(self, injected: int, survived: int) -> None:
        """Faults injected and survived as the test counted them (a race's outcome, a fault proxy's hits)."""
        self.injected += injected
        self.survived += survived

    def settle(self, test_passed: bool) -> None:
        """The test's end: survivals stand only where every check after the faults passed too (else none do)."""
        if not test_passed:
            self.survived = 0

    def check_intact(self, store: ObjectStore, keys: list[BundleKey], scratch: Path) -> None:
        """Pull and verify each bundle in the store after the fault; count those that no longer do."""
        for key in keys:
            self.verified += 1
            dest = scratch / f"intact-{uuid.uuid4().hex[:8]}"
            try:
                pull(store, key, dest)
                verify_bundle_dir(dest)
            except PrefectExecutorchError:
                self.lost += 1


#: Whether a test's call phase passed, for its ``faults`` to settle on at teardown.
CALL_PASSED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[CALL_PASSED] = report.passed
    return report


@pytest.fixture
def faults(request: pytest.FixtureRequest) -> Iterator[Callable[..., Fault]]:
    """Start the ledger of one kind of fault; its row reaches the summary whatever the test's outcome, settled on
    it (not when ``planted``: the ledger's own checks plant losses, which are no fault of the product's)."""
    started: list[Fault] = []

    def start(area: str, fault: str, planted: bool = False) -> Fault:
        entry = Fault(area, fault)
        if not planted:
            started.append(entry)
        return entry

    yield start
    for entry in started:
        entry.settle(request.node.stash.get(CALL_PASSED, False))
        ledger.append(ledger.FAULTS, asdict(entry))


@pytest.fixture
def record_parser() -> Callable[[str, int, int, int], None]:
    """Record a parser's property-test counts, as observed (the test fails afterwards on a violation)."""

    def record(parser: str, seen: int, refused: int, violations: int) -> None:
        ledger.append(ledger.PARSERS, {"parser": parser, "seen": seen, "refused": refused, "violations": violations})

    return record
