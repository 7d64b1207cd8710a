"""One engine build per GPU: the slot is a real global concurrency limit on the Prefect server."""

from __future__ import annotations

import socket

import pytest

from prefect_executorch.fleet.gpu_slots import GPU_ENV, gpu_limit_name, gpu_slot

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _limit(name: str):  # type: ignore[no-untyped-def]
    from prefect import get_client

    with get_client(sync_client=True) as client:
        return client.read_global_concurrency_limit_by_name(name)


def test_a_gpu_build_holds_its_gpu_and_a_second_one_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.concurrency.sync import concurrency

    monkeypatch.setenv(GPU_ENV, "3")
    name = gpu_limit_name(socket.gethostname(), 3)
    with gpu_slot(False) as held:
        assert held is None
    with gpu_slot(True) as held:
        assert held == name
        limit = _limit(name)
        assert (limit.limit, limit.active_slots) == (1, 1)
        with pytest.raises(TimeoutError):
            with concurrency(name, occupy=1, timeout_seconds=2, strict=True):
                pass  # a second build on the same GPU would start here
    assert _limit(name).active_slots == 0


def test_limit_names_are_safe() -> None:
    assert gpu_limit_name("GPU-Node_07.example.com", 1) == "gpu-gpu-node-07-example-com-1"
