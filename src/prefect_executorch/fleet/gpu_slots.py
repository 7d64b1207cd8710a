"""One engine build per GPU: a global concurrency limit of 1 per ``gpu-<host>-<index>``."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from prefect import get_client
from prefect.concurrency.sync import concurrency

from prefect_executorch.settings import get_settings

#: The ``gpu`` setting's variable, set by the worker for the runs it starts: the physical index of the GPU it is pinned to.
GPU_ENV = "PREFECT_EXECUTORCH_GPU"


def gpu_index_from_env() -> int:
    """The GPU this process builds on: ``$PREFECT_EXECUTORCH_GPU``, else a single ``CUDA_VISIBLE_DEVICES``, else 0."""
    pinned = get_settings().gpu
    if pinned is not None:
        return pinned
    # CUDA's own variable, not one of our settings: a single index there names the GPU too.
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return int(visible) if visible.isdigit() else 0


def gpu_limit_name(host: str, index: int) -> str:
    """``gpu-<host>-<index>``, with the host reduced to the characters limit names allow."""
    slug = re.sub(r"[^a-z0-9-]+", "-", host.lower()).strip("-") or "host"
    return f"gpu-{slug}-{index}"


def ensure_gpu_limits(host: str, indexes: list[int]) -> list[str]:
    """Create (or reset to 1) the limit of each GPU of ``host``; return their names."""
    names = [gpu_limit_name(host, index) for index in indexes]
    with get_client(sync_client=True) as client:
        for name in names:
            client.upsert_global_concurrency_limit_by_name(name, 1)
    return names


@contextmanager
def gpu_slot(needs_gpu: bool, timeout_s: float | None = None) -> Iterator[str | None]:
    """Hold this host's GPU for an engine build; a CPU build holds nothing.

    The limit is created if missing and acquired strictly, so a misconfigured fleet waits rather
    than letting two engine builds share a GPU.
    """
    if not needs_gpu:
        yield None
        return
    (name,) = ensure_gpu_limits(socket.gethostname(), [gpu_index_from_env()])
    with concurrency(name, occupy=1, timeout_seconds=timeout_s, strict=True):
        yield name
