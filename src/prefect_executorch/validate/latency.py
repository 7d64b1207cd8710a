"""Latency that means something: timed in windows until consecutive window medians agree, or a time cap.

A handful of timed runs on a busy, shared machine measures the neighbours as much as the program
(five runs once gave latency ratios from 0.0005 to 0.56 for one model). Here each callable is timed
in windows; two callables are measured together with their windows interleaved, so a burst of load
hits both alike. Measuring stops once the last ``AGREEING_WINDOWS`` window medians of every
callable lie within ``AGREEMENT`` of each other, or when the time cap is reached (then the result
says it never stabilised). The thing to time is a callable so that what a call means (a CUDA
synchronisation after a GPU program, for example) stays the caller's business.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

#: How many consecutive windows must agree, and how closely (max/min - 1 of their medians).
AGREEING_WINDOWS = 3
AGREEMENT = 0.10
#: A window lasts at least this long, so that microsecond calls are not timed against the clock's noise.
MIN_WINDOW_S = 0.02


class LatencyStats(BaseModel):
    """Warm latency of one callable, from the windows that agreed (all windows if none did)."""

    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    runs: int = Field(description="Timed runs in all windows, warm-up excluded.")
    windows: int = Field(description="Windows timed.")
    runs_per_window: int
    stable: bool = Field(description=f"Whether {AGREEING_WINDOWS} consecutive window medians agreed within "
                                     f"{AGREEMENT:.0%} before the time cap.")
    window_medians_ms: list[float] = Field(default_factory=list, description="Median of every window, in order.")

    def describe(self) -> str:
        """One line: the percentiles, the runs and whether the figure settled."""
        settled = "stable" if self.stable else f"NOT stable within the time cap (window medians {self._spread()})"
        return (f"p50 {self.p50_ms:.3g} ms, p90 {self.p90_ms:.3g} ms, p99 {self.p99_ms:.3g} ms over {self.runs} runs "
                f"in {self.windows} windows, {settled}")

    def _spread(self) -> str:
        return ", ".join(f"{m:.3g}" for m in self.window_medians_ms[-AGREEING_WINDOWS:]) + " ms"


def percentile(times: list[float], q: int) -> float:
    """The ``q``-th percentile (inclusive method) of ``times``."""
    if len(times) == 1:
        return times[0]
    return statistics.quantiles(times, n=100, method="inclusive")[q - 1]


def agree(medians: list[float], windows: int = AGREEING_WINDOWS, tolerance: float = AGREEMENT) -> bool:
    """Whether the last ``windows`` medians lie within ``tolerance`` of each other."""
    last = medians[-windows:]
    if len(last) < windows:
        return False
    low = min(last)
    return low > 0 and max(last) / low - 1 <= tolerance


def paired_ratio(numerator: LatencyStats, denominator: LatencyStats) -> float:
    """``numerator`` over ``denominator`` as the median of their window medians' ratios, window by window, for two
    callables timed together (``measure_together``): a burst of load falls on both windows of a pair, where pooled
    p50s let it fall on one side. The agreeing windows where both settled, else all."""
    kept = AGREEING_WINDOWS if numerator.stable and denominator.stable else len(numerator.window_medians_ms)
    pairs = zip(numerator.window_medians_ms[-kept:], denominator.window_medians_ms[-kept:], strict=True)
    return statistics.median(top / bottom for top, bottom in pairs if bottom > 0)


class _Timer:
    """The windows of one callable."""

    def __init__(self, call: Callable[[], Any], min_runs: int, warmup: int) -> None:
        self.call = call
        for _ in range(warmup):
            call()
        started = time.perf_counter()
        call()  # one more untimed run sizes the window
        once = time.perf_counter() - started
        self.per_window = max(min_runs, int(MIN_WINDOW_S / once) if once > 0 else min_runs, 1)
        self.windows: list[list[float]] = []

    def window(self) -> None:
        times = []
        for _ in range(self.per_window):
            started = time.perf_counter()
            self.call()
            times.append((time.perf_counter() - started) * 1000)
        self.windows.append(times)

    def medians(self) -> list[float]:
        return [statistics.median(w) for w in self.windows]

    def stats(self, stable: bool) -> LatencyStats:
        kept = self.windows[-AGREEING_WINDOWS:] if stable else self.windows
        times = sorted(t for w in kept for t in w)
        return LatencyStats(
            p50_ms=statistics.median(times), p90_ms=percentile(times, 90), p95_ms=percentile(times, 95),
            p99_ms=percentile(times, 99), runs=sum(len(w) for w in self.windows), windows=len(self.windows),
            runs_per_window=self.per_window, stable=stable, window_medians_ms=self.medians(),
        )


def measure_together(
    calls: list[Callable[[], Any]], *, min_runs: int = 5, warmup: int = 2, max_seconds: float = 5.0
) -> list[LatencyStats]:
    """Time every callable in interleaved windows until each one's last windows agree, or ``max_seconds`` pass."""
    timers = [_Timer(call, min_runs, warmup) for call in calls]
    deadline = time.monotonic() + max_seconds
    rounds = 0
    while True:
        # Every other round in reverse: a callable always timed right after another would carry its wake (caches,
        # frequency) into the comparison.
        for timer in timers if rounds % 2 == 0 else reversed(timers):
            timer.window()
        rounds += 1
        settled = [agree(timer.medians()) for timer in timers]
        if all(settled) or time.monotonic() >= deadline:
            return [timer.stats(stable) for timer, stable in zip(timers, settled, strict=False)]
