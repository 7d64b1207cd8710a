"""Stopping when told: once SIGINT or SIGTERM has arrived, the process is gone within a bound.

A command stops by unwinding (``KeyboardInterrupt`` in the CLI, task cancellation in a worker), which
kills its children on the way out. Unwinding can stall where this process does not decide: a thread
that blocks interpreter exit, a cancellation Prefect's code swallows, a request retried against a
server that is going away. ``exit_after`` is the bound: a daemon thread that, if the process still
runs when it wakes, kills every process this one started (children and theirs, each child session's
whole group) and ends the process with the status the signal asks for.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

#: Exit status of a process stopped by ``signum``, as a shell reports it (130 for SIGINT, 143 for SIGTERM).
SIGNAL_EXIT_BASE = 128
#: Seconds the deadline gives the process's last line (what a build left in its store) before saying less.
LAST_WORDS_S = 1.0


def exit_status(signum: int) -> int:
    """128 + the signal's number."""
    return SIGNAL_EXIT_BASE + signum


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (children first, then theirs), read from /proc."""
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                pids = [int(child) for child in children.read_text().split()]
            except OSError:
                continue  # the process ended while we looked
            found.extend(pids)
            todo.extend(pids)
    return found


def kill_descendants(root: int | None = None) -> None:
    """SIGKILL every process under ``root`` (default: this one), and the whole group of each that leads its own session."""
    own_group = os.getpgrp()
    for pid in descendants(root or os.getpid()):
        try:
            group = os.getpgid(pid)
            if group == pid and group != own_group:
                os.killpg(group, signal.SIGKILL)  # what it started in its session goes too
            else:
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def exit_after(seconds: float, status: int, last_words: Callable[[], str], unknown: str) -> None:
    """Unless the process has exited ``seconds`` from now, kill what it started, say ``last_words()`` and exit ``status``.

    ``last_words`` gets ``LAST_WORDS_S`` (it may read a store) and returns "" when all was said already;
    ``unknown`` is said if it takes longer or fails.
    """

    def deadline() -> None:
        threading.Event().wait(seconds)
        try:
            kill_descendants()
            words = _within(LAST_WORDS_S, last_words)
            if words != "":
                print(unknown if words is None else words, file=sys.stderr, flush=True)
            sys.stdout.flush()
        finally:
            os._exit(status)

    threading.Thread(target=deadline, name="stop-deadline", daemon=True).start()


def _within(seconds: float, function: Callable[[], str]) -> str | None:
    """``function()``'s answer if it comes within ``seconds`` without an error, else None."""
    answer: list[str] = []

    def call() -> None:
        try:
            answer.append(function())
        except Exception:  # noqa: BLE001 - the process is going away: say the fallback instead
            pass

    thread = threading.Thread(target=call, name="last-words", daemon=True)
    thread.start()
    thread.join(seconds)
    return answer[0] if answer else None
