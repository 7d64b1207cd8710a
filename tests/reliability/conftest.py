"""Fault bookkeeping: every reliability test records what it injected and what survived.

The session ends with a summary table (quoted in README's reliability section).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import pytest


@dataclass
class Fault:
    """One injected fault and its outcome."""

    area: str
    fault: str
    injected: int
    survived: int
    objects_lost: int = 0


FAULTS: list[Fault] = []


@pytest.fixture
def record_fault() -> Callable[..., None]:
    """Record a fault; call it after the assertions that prove it was survived."""

    def record(area: str, fault: str, injected: int = 1, survived: int | None = None, objects_lost: int = 0) -> None:
        FAULTS.append(Fault(area, fault, injected, injected if survived is None else survived, objects_lost))

    return record


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FAULTS:
        return
    write = terminalreporter.write_line
    write("")
    write("reliability summary")
    write(f"{'area':<14} {'fault':<58} {'injected':>8} {'survived':>8} {'lost':>5}")
    for f in FAULTS:
        write(f"{f.area:<14} {f.fault:<58} {f.injected:>8} {f.survived:>8} {f.objects_lost:>5}")
    write(f"{'total':<14} {'':<58} {sum(f.injected for f in FAULTS):>8} "
          f"{sum(f.survived for f in FAULTS):>8} {sum(f.objects_lost for f in FAULTS):>5}")
