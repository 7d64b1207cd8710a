"""Scratch directories of a run: removed when it ends, and swept by the next run when a killed one left its own.

A run without an output directory (a build, a retrain's weights check, ``validate``) works in a
``prefect-executorch-<kind>-*`` directory of the system's temporary folder. A finished, failed,
interrupted or cancelled run removes it (``finally``); a run killed by SIGKILL or a lost node cannot, so
each directory names its owner (pid and process start time) and every new scratch directory first
removes those whose owner is gone. A directory without an owner file is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PREFIX = "prefect-executorch-"
OWNER = ".owner.json"


def _started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), so a reused pid is not taken for the owner."""
    try:
        # Field 22 of /proc/<pid>/stat; the command name (field 2) may hold spaces, so count from its ')'.
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def _alive(owner: dict[str, object]) -> bool:
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return True  # not ours to judge
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's live process
    started = owner.get("started")
    return started is None or _started(pid) in (None, started)


def sweep(root: Path | None = None) -> list[Path]:
    """Remove the scratch directories under ``root`` (default: the temporary folder) whose owner is gone."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{PREFIX}*"):
        try:
            owner = json.loads((path / OWNER).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(owner, dict) and not _alive(owner):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


@contextmanager
def scratch_dir(kind: str, output: Path | None = None) -> Iterator[Path]:
    """``output`` when given (kept); else a fresh owned scratch directory, removed on the way out."""
    if output is not None:
        yield output
        return
    sweep()
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-"))
    try:
        (path / OWNER).write_text(json.dumps({"pid": os.getpid(), "started": _started(os.getpid())}))
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
