"""The embedded API's process: uvicorn serving Prefect's API, gone once the CLI that started it is gone.

It runs in a session of its own (Ctrl-C must not stop it before the CLI's last reports reach it), so no
signal reaches it when the CLI is killed (SIGKILL, the OOM killer): it watches its parent and leaves
with it, instead of serving forever. Run as ``python -m prefect_executorch.cli.apiserver <uvicorn args>``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

#: How often the server looks for its parent (s).
PARENT_POLL_S = 1.0
#: Seconds uvicorn gets to stop on SIGTERM before the process ends anyway.
STOP_GRACE_S = 5.0


def leave_with(parent: int) -> None:
    """Block until ``parent`` is no longer this process's parent, then stop (SIGTERM, uvicorn's own stop)."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(STOP_GRACE_S)
    os._exit(1)


if __name__ == "__main__":
    threading.Thread(target=leave_with, args=(os.getppid(),), name="parent-watch", daemon=True).start()
    from uvicorn.main import main

    sys.exit(main())
