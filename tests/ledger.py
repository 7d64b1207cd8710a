"""The session's summary tables (faults injected, parser inputs), kept as rows in files.

Every test process appends its rows to one folder (``$PREFECT_EXECUTORCH_TEST_LEDGER``, made by the
first process, inherited by pytest-xdist's workers), and the process that prints the session's summary
reads them all: one table whether the suite ran in one process or several.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

LEDGER_ENV = "PREFECT_EXECUTORCH_TEST_LEDGER"
FAULTS, PARSERS = "faults", "parsers"


def start_session() -> bool:
    """Make the ledger folder unless a parent process made it (xdist workers inherit it); True if made here."""
    if os.environ.get(LEDGER_ENV):
        return False
    os.environ[LEDGER_ENV] = tempfile.mkdtemp(prefix="prefect-executorch-ledger-")
    return True


def end_session() -> None:
    """Remove the ledger folder (by the process that made it, once the tables are printed)."""
    folder = os.environ.pop(LEDGER_ENV, None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def append(kind: str, row: dict[str, Any]) -> None:
    """Add one row (a line of JSON: one short append, whole even with several writers)."""
    with open(Path(os.environ[LEDGER_ENV]) / f"{kind}.jsonl", "a") as file:
        file.write(json.dumps(row) + "\n")


def rows(kind: str) -> list[dict[str, Any]]:
    """Every row of ``kind`` written this session, by every process."""
    folder = os.environ.get(LEDGER_ENV)
    path = Path(folder) / f"{kind}.jsonl" if folder else None
    if path is None or not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _parser_table(write: Callable[[str], None], runs: list[dict[str, Any]]) -> None:
    table: list[tuple[Any, ...]] = [(r["parser"], r["seen"], r["refused"], r["seen"] - r["refused"], r["violations"])
                                    for r in runs]
    table.append(("total", *(sum(column) for column in list(zip(*table, strict=False))[1:])))
    width = max(len(row[0]) for row in table)
    write("")
    write("parser property tests (every generated input judged; violations as counted, a failed test's too)")
    for row in [("parser", "inputs", "refused", "accepted", "violations"), *table]:
        write(f"{row[0]:<{width}} " + " ".join(f"{value:>10}" for value in row[1:]))


def _fault_table(write: Callable[[str], None], faults: list[dict[str, Any]]) -> None:
    width = max(len(f["fault"]) for f in faults)
    header = f"{'injected':>8} {'survived':>8} {'verified':>8} {'lost':>5}"

    def counts(some: list[dict[str, Any]]) -> str:
        return " ".join(f"{sum(f[k] for f in some):>{w}}" for k, w in
                        (("injected", 8), ("survived", 8), ("verified", 8), ("lost", 5)))

    write("")
    write("reliability summary (counted by each test: survived = ended in a typed error or a clean retry, in a test "
          "whose later checks passed too; "
          "verified = bundles in the store after the fault (published before it, a race's winners, restored bytes), "
          "pulled and verified after it; lost = those of them that failed)")
    write(f"{'area':<12} {'fault':<{width}} {header}")
    for f in faults:
        write(f"{f['area']:<12} {f['fault']:<{width}} {counts([f])}")
    write(f"{'total':<12} {'':<{width}} {counts(faults)}")
    write("")
    write("by area")
    write(f"{'area':<12} {'kinds':>5} {header}")
    for area in sorted({f["area"] for f in faults}):
        in_area = [f for f in faults if f["area"] == area]
        write(f"{area:<12} {len(in_area):>5} {counts(in_area)}")


def print_tables(write: Callable[[str], None]) -> None:
    """The parser and fault tables of the whole session (nothing when no such test ran)."""
    # Sorted: with several processes the rows arrive in the order their tests finished.
    runs = sorted(rows(PARSERS), key=lambda r: r["parser"])
    faults = sorted(rows(FAULTS), key=lambda f: (f["area"], f["fault"]))
    if runs:
        _parser_table(write, runs)
    if faults:
        _fault_table(write, faults)
