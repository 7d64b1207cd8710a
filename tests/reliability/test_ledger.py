"""The fault ledger counts what it is shown: a loss planted behind the store's back is counted as lost, a fault that
did not end in its error is not survived, and no survival stands in a test whose later checks failed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prefect_executorch.artifacts.publishing import publish
from prefect_executorch.artifacts.store import LocalStore
from prefect_executorch.errors import SpecError

from realbundle import RealBundle


def test_a_planted_loss_and_a_missed_fault_are_counted(real_bundle: Callable[[str], RealBundle], faults: Any,
                                                       tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    convnet = real_bundle("convnet")
    kept = publish(store, *convnet.variant(tmp_path / "a", version="1")).key
    gone = publish(store, *convnet.variant(tmp_path / "b", version="2")).key
    ledger = faults("ledger", "a published program deleted behind the store's back", planted=True)
    (store.root / gone.key("model.pte")).unlink()
    ledger.check_intact(store, [kept, gone], tmp_path / "after")
    assert (ledger.verified, ledger.lost) == (2, 1)
    # A fault whose operation did not end in the expected error: injected, not survived.
    with pytest.raises(pytest.fail.Exception):
        with ledger.expect(SpecError):
            pass  # nothing raised
    assert (ledger.injected, ledger.survived) == (1, 0)


def test_survivals_stand_only_in_a_test_whose_later_checks_pass(faults: Any) -> None:
    """A typed error that came, followed by a check of what the fault left that failed: survived 0 of 2."""
    ledger = faults("ledger", "two faults met, then a failed check", planted=True)
    for _ in range(2):
        with ledger.expect(SpecError):
            raise SpecError("refused as it must be")
    assert (ledger.injected, ledger.survived) == (2, 2)
    ledger.settle(test_passed=False)  # what the teardown does once the test's call failed after these lines
    assert (ledger.injected, ledger.survived) == (2, 0)
