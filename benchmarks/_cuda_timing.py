"""Timing on a CUDA device for the GPU benchmarks: synchronised calls and the profiled events of a call.

Torch only (no prefect-executorch, no ExecuTorch): ``inductor_gemm.py`` runs on a bare GPU host's torch with it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def percentiles(ms: list[float]) -> tuple[float, float]:
    ordered = sorted(ms)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def timed(call: Callable[[], Any], calls: int, warmup: int) -> tuple[float, float]:
    """p50 and p95 (ms) of ``calls`` synchronised calls after ``warmup``."""
    import torch

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - started) * 1000)
    return percentiles(samples)


def top_events(call: Callable[[], Any], calls: int) -> dict[str, list[dict[str, Any]]]:
    """The profiled events of ``calls`` calls that took most self GPU and self host time (µs per call)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(10):
        call()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiled:
        for _ in range(calls):
            call()
    rows = [{"event": event.key[:80], "count_per_call": round(event.count / calls, 2),
             "device_us_per_call": round(event.self_device_time_total / calls, 2),
             "host_us_per_call": round(event.self_cpu_time_total / calls, 2)}
            for event in profiled.key_averages()]
    return {column: sorted(rows, key=lambda row: -row[column])[:12]
            for column in ("device_us_per_call", "host_us_per_call")}
