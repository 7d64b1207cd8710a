"""What Ctrl-C and SIGTERM do to a command, installed before the CLI's imports (seconds on a busy machine).

The first signal raises ``KeyboardInterrupt`` (children killed on the way out, one line); later ones are
not raised again, so that nothing interrupts that cleanup. ``stopping.exit_after`` ends the process if
unwinding stalls (a request to an API that is busy, a thread that holds exit), with the same line, within
``STOP_DEADLINE_S``.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from prefect_executorch.stopping import LAST_WORDS_S, exit_after, exit_status, kill_descendants

#: Seconds from Ctrl-C or SIGTERM to a command's exit, at the latest.
STOP_DEADLINE_S = 4.0
#: What a build leaves until it knows its store (and whenever nothing reached it): publishing is all or nothing.
NOTHING_PUBLISHED = "nothing published"


class Stop:
    """The signal received, what the command left (said when it stops) and whether it has said so."""

    signum: int | None = None
    note: Callable[[], str] = staticmethod(lambda: "stopped; its child processes with it")
    said = False
    _raised = False
    _armed = threading.Lock()

    @classmethod
    def arm(cls, signum: int) -> bool:
        """Start the deadline for ``signum``, once; whether this call started it."""
        if not cls._armed.acquire(blocking=False):
            return False
        cls.signum = signum
        exit_after(STOP_DEADLINE_S - LAST_WORDS_S, cls.exit_code(), lambda: "" if cls.said else f"interrupted: {cls.note()}",
                   "interrupted: stopped; what it left was not read in time")
        return True

    @classmethod
    def on_signal(cls, signum: int, frame: Any) -> None:
        """The Python handler of both signals (main thread): unwind once (the wakeup thread may have armed first)."""
        cls.arm(signum)
        if not cls._raised:
            cls._raised = True
            raise KeyboardInterrupt

    @classmethod
    def exit_code(cls) -> int:
        """128 + the signal: 130 for Ctrl-C, 143 for SIGTERM."""
        return exit_status(cls.signum or signal.SIGINT)


def stopped() -> NoReturn:
    """Say what a stop left, unless said, and end the process now: 130 (143 for SIGTERM).

    Exit's first two steps run as the interpreter runs them (thread hooks and joins: Prefect's log and event
    workers send what they hold; then ``atexit``: Prefect's API stops), its teardown does not. A stop lands
    anywhere, mid-import or with a daemon thread inside native code, and that teardown once killed a stopped
    build with SIGABRT after its line (CI, under load: exit -6, not 130). What is left running is killed.
    """
    if not Stop.said:
        print(f"interrupted: {Stop.note()}", file=sys.stderr, flush=True)
        Stop.said = True
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx calls first; not in typeshed
        atexit._run_exitfuncs()
    finally:
        kill_descendants()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(Stop.exit_code())


def install(args: list[str]) -> None:
    """Handle SIGINT and SIGTERM with ``Stop`` from here on; ``args`` (the command line) say what a stop leaves."""
    command = next((arg for arg in args if not arg.startswith("-")), None)
    if command == "build":
        Stop.note = staticmethod(lambda: NOTHING_PUBLISHED)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, Stop.on_signal)
    # The Python handler runs only when the main thread next runs Python code; a main thread blocked in a C call
    # that retries past the signal never did (a build under heavy load did not exit in 60 s). The C-level handler
    # writes each signal to this pipe at once, and a thread that reads it arms the deadline.
    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    threading.Thread(target=_arm_on_wakeup, args=(read,), name="stop-watch", daemon=True).start()


def _arm_on_wakeup(read: int) -> None:
    """Arm ``Stop``'s deadline as soon as SIGINT or SIGTERM arrives, whatever the main thread is doing."""
    while True:
        for signum in os.read(read, 64):
            if signum in (signal.SIGINT, signal.SIGTERM):
                Stop.arm(signum)
