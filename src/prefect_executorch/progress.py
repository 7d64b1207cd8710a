"""Stage events of a build (probe, export, validate, publish) for whoever shows them, e.g. the CLI's live view."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: Called with (stage, event, seconds): event is "start", "done", "failed" or "stopped" (Ctrl-C, SIGTERM);
#: seconds since the stage's start.
Listener = Callable[[str, str, float], None]
_listeners: list[Listener] = []


def _emit(name: str, event: str, seconds: float) -> None:
    for listener in list(_listeners):
        listener(name, event, seconds)


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Mark one stage of a build; listeners hear its start and its end (done, failed, or stopped by a signal)."""
    started = time.monotonic()
    _emit(name, "start", 0.0)
    try:
        yield
    except KeyboardInterrupt:
        _emit(name, "stopped", time.monotonic() - started)
        raise
    except BaseException:
        _emit(name, "failed", time.monotonic() - started)
        raise
    _emit(name, "done", time.monotonic() - started)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Hear every stage of this process while the block runs (a plain list: tasks may run in other threads)."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)
