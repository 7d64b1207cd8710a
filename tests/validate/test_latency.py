"""Windowed latency: stops once consecutive windows agree, says so when they never do, times pairs alike."""

from __future__ import annotations

import time

import pytest

from prefect_executorch.validate.latency import AGREEING_WINDOWS, agree, measure_together, percentile


def busy(seconds: float) -> None:
    """Spin (not sleep) for ``seconds``: a call that costs CPU like a program does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_agreement_needs_enough_windows_within_ten_percent() -> None:
    assert agree([10.0, 10.5, 10.9])
    assert not agree([10.0, 10.5, 11.5])  # 15% apart
    assert not agree([10.0, 10.0])  # too few windows
    assert agree([50.0, 10.0, 10.2, 10.1])  # only the last three count


def test_percentiles_are_inclusive_and_ordered() -> None:
    times = [float(v) for v in range(1, 101)]
    assert percentile(times, 50) == pytest.approx(50.5)
    assert percentile(times, 99) == pytest.approx(99.01)
    assert percentile([3.0], 90) == 3.0


def test_a_steady_call_stabilises_with_its_percentiles() -> None:
    (stats,) = measure_together([lambda: busy(0.001)], min_runs=5, warmup=1, max_seconds=20)
    assert stats.stable, stats.describe()
    assert stats.windows >= AGREEING_WINDOWS and stats.runs == stats.windows * stats.runs_per_window
    assert len(stats.window_medians_ms) == stats.windows
    assert 1.0 <= stats.p50_ms <= stats.p90_ms <= stats.p95_ms <= stats.p99_ms
    assert stats.p50_ms < 1.5


def test_a_drifting_call_never_stabilises_and_stops_at_the_cap() -> None:
    calls = [0]

    def slower_each_time() -> None:
        calls[0] += 1
        busy(0.0002 * calls[0])

    started = time.monotonic()
    (stats,) = measure_together([slower_each_time], min_runs=3, warmup=0, max_seconds=0.5)
    assert not stats.stable and "NOT stable" in stats.describe()
    assert time.monotonic() - started < 3
    assert stats.window_medians_ms == sorted(stats.window_medians_ms)  # it really drifted


def test_two_calls_measured_together_are_timed_in_alternate_windows() -> None:
    fast, slow = measure_together([lambda: busy(0.001), lambda: busy(0.003)], min_runs=5, warmup=1, max_seconds=20)
    assert fast.windows == slow.windows  # interleaved: one window each per round
    assert fast.p50_ms >= 1.0 and slow.p50_ms >= 3.0
    # Each kept its own timings: the longer call's median stays the longer one. (A busy neighbour stretches the longer
    # spin the more: 8 ms against 1 ms seen with three processes on two cores, so no upper bound.)
    assert slow.p50_ms / fast.p50_ms >= 2.5
