"""What Ctrl-C and SIGTERM do to a command, installed before the CLI's imports (seconds on a busy machine).

The first signal raises ``KeyboardInterrupt`` (children killed on the way out, one line); later ones are
not raised again, so that nothing interrupts that cleanup. ``stopping.exit_after`` ends the process if
unwinding stalls (a request to an API that is busy, a thread that holds exit), with the same line, within
``STOP_DEADLINE_S``.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from prefect_executorch.stopping import LAST_WORDS_S, exit_after, exit_status

#: Seconds from Ctrl-C or SIGTERM to a command's exit, at the latest.
STOP_DEADLINE_S = 4.0
#: What a build leaves until it knows its store (and whenever nothing reached it): publishing is all or nothing.
NOTHING_PUBLISHED = "nothing published"


class Stop:
    """The signal received, what the command left (said when it stops) and whether it has said so."""

    signum: int | None = None
    note: Callable[[], str] = staticmethod(lambda: "stopped; its child processes with it")
    said = False

    @classmethod
    def on_signal(cls, signum: int, frame: Any) -> None:
        """The handler of both signals."""
        if cls.signum is not None:
            return
        cls.signum = signum
        exit_after(STOP_DEADLINE_S - LAST_WORDS_S, cls.exit_code(), lambda: "" if cls.said else f"interrupted: {cls.note()}",
                   "interrupted: stopped; what it left was not read in time")
        raise KeyboardInterrupt

    @classmethod
    def exit_code(cls) -> int:
        """128 + the signal: 130 for Ctrl-C, 143 for SIGTERM."""
        return exit_status(cls.signum or signal.SIGINT)


def install(args: list[str]) -> None:
    """Handle SIGINT and SIGTERM with ``Stop`` from here on; ``args`` (the command line) say what a stop leaves."""
    command = next((arg for arg in args if not arg.startswith("-")), None)
    if command == "build":
        Stop.note = staticmethod(lambda: NOTHING_PUBLISHED)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, Stop.on_signal)
