"""The stop deadline: a process whose unwinding stalls is ended anyway, what it started with it, and says why."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from prefect_executorch.stopping import descendants, exit_status

#: A process that starts a session of its own (as the export child does) and a child of a child (as the
#: forkserver's children are), arms the deadline, then cannot exit: a non-daemon thread holds interpreter exit.
STALLS = """
import subprocess, sys, threading, time
from prefect_executorch.stopping import exit_after
session = subprocess.Popen(["sleep", "300"], start_new_session=True)
nested = subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.Popen(['sleep', '301']).wait()"])
words = {"quick": lambda: "interrupted: nothing published", "slow": lambda: time.sleep(30) or "never said",
         "said already": lambda: ""}
exit_after(3.0, 143, words[sys.argv[1]], "interrupted: what it left was not read in time")
print(session.pid, nested.pid, flush=True)
threading.Thread(target=time.sleep, args=(300,)).start()
sys.exit(0)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize(("words", "said"), [("quick", "interrupted: nothing published"),
                                             ("slow", "interrupted: what it left was not read in time"),
                                             ("said already", "")])
def test_a_stalled_exit_is_ended_at_the_deadline_with_everything_it_started(words: str, said: str) -> None:
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", STALLS, words], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    session, nested = (int(pid) for pid in proc.stdout.readline().split())  # type: ignore[union-attr]
    while not (started_under := descendants(nested)) and proc.poll() is None:
        time.sleep(0.05)  # until the nested child has started its own (the deadline is 3 s away)
    assert started_under, "the nested child's own child never started"
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    took = time.monotonic() - started
    assert proc.returncode == exit_status(15) == 143
    assert err.strip() == said
    assert took < 10, took
    time.sleep(0.5)
    assert not [pid for pid in [session, nested, *started_under] if _alive(pid)]
