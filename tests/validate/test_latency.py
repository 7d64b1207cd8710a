"""Windowed latency: stops once consecutive windows agree, says so when they never do, times pairs alike."""

from __future__ import annotations

import time

import pytest

from prefect_executorch.validate.latency import (
    AGREEING_WINDOWS,
    LatencyStats,
    agree,
    measure_together,
    paired_ratio,
    percentile,
)
from prefect_executorch.validate.sidebyside import MethodComparison, SideBySide


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


def test_each_round_times_the_other_callable_first_in_turn() -> None:
    called: list[str] = []
    first, second = measure_together([lambda: called.append("a"), lambda: called.append("b")], min_runs=5, warmup=0,
                                     max_seconds=0.5)
    per_window = {"a": first.runs_per_window, "b": second.runs_per_window}
    assert first.windows == second.windows >= 2
    expected = ["a", "b"]  # each one's sizing call
    for round_ in range(first.windows):
        for name in ("ab" if round_ % 2 == 0 else "ba"):
            expected += [name] * per_window[name]
    assert called == expected


def stats(p50_ms: float, window_medians_ms: list[float], stable: bool = True) -> LatencyStats:
    return LatencyStats(p50_ms=p50_ms, p90_ms=p50_ms, p95_ms=p50_ms, p99_ms=p50_ms, runs=5 * len(window_medians_ms),
                        windows=len(window_medians_ms), runs_per_window=5, stable=stable,
                        window_medians_ms=window_medians_ms)


def test_a_regression_pairs_the_windows_timed_together_and_only_those() -> None:
    # The load rose in the last round: pooled p50s put the candidate 11% behind, each pair of windows agrees.
    current = stats(0.278, [0.40, 0.27, 0.28, 0.30])
    candidate = stats(0.308, [0.25, 0.27, 0.28, 0.30])
    together = MethodComparison(method="forward", cases=1, disagreeing=0, current=current, candidate=candidate)
    assert together.regression == pytest.approx(0.0)  # the last three windows, as both settled
    assert SideBySide(methods=[together]).regressions(0.10) == []
    unsettled = together.model_copy(update={"current": current.model_copy(update={"stable": False})})
    assert unsettled.regression == pytest.approx(0.0)  # all four pairs: 0.625, 1, 1, 1
    apart = together.model_copy(update={"interleaved": False})  # two children, one after the other: no pairs
    assert apart.regression == pytest.approx(0.308 / 0.278 - 1)
    assert SideBySide(methods=[apart]).regressions(0.10) == [
        "forward: +11% slower p50 over p50, limit +10% (p50 0.308 ms vs 0.278 ms now; candidate p50 0.308 ms, "
        "p90 0.308 ms, p99 0.308 ms over 20 runs in 4 windows, stable)"]
    # Paired windows that say slower are named as such beside the pooled p50s, which can say otherwise.
    slower = together.model_copy(update={"candidate": stats(0.278, [0.50, 0.324, 0.336, 0.36])})
    (line,) = SideBySide(methods=[slower]).regressions(0.10)
    assert line.startswith("forward: +20% slower window by window, limit +10% (p50 0.278 ms vs 0.278 ms now; ")
    unrecorded = together.model_copy(update={"current": stats(0.278, []), "candidate": stats(0.308, [])})
    assert unrecorded.regression == pytest.approx(0.308 / 0.278 - 1)  # an old record: no windows to pair
    assert paired_ratio(stats(2.0, [2.2, 2.2, 2.0]), stats(1.0, [1.1, 1.0, 1.0])) == pytest.approx(2.0)  # 2, 2.2, 2
