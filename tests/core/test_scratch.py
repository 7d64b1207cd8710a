"""Scratch directories go with their run: removed when it ends, swept by the next run when it was killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prefect_executorch.scratch import OWNER, PREFIX, scratch_dir, sweep

ROOT = Path(__file__).resolve().parents[2]


def _owned(root: Path, name: str, owner: object) -> Path:
    path = root / f"{PREFIX}{name}"
    path.mkdir()
    (path / "weights.pt").write_bytes(b"x" * 1024)
    (path / OWNER).write_text(json.dumps(owner))
    return path


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_directories_of_gone_owners_are_swept(tmp_path: Path) -> None:
    gone = _owned(tmp_path, "build-gone", {"pid": _dead_pid(), "started": "1"})
    live = _owned(tmp_path, "build-live", {"pid": os.getpid()})
    # This process's pid with another start time: the owner died and its pid was given to someone else.
    reused = _owned(tmp_path, "build-reused", {"pid": os.getpid(), "started": "0"})
    unowned = tmp_path / f"{PREFIX}build-unowned"
    unowned.mkdir()
    other = tmp_path / "someone-else"
    other.mkdir()
    (other / OWNER).write_text(json.dumps({"pid": _dead_pid()}))
    assert sorted(sweep(tmp_path)) == sorted([gone, reused])
    assert live.is_dir() and unowned.is_dir() and other.is_dir()
    assert not gone.exists() and not reused.exists()


def test_a_scratch_directory_is_removed_whatever_ends_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    with pytest.raises(KeyboardInterrupt), scratch_dir("build") as path:
        assert path.parent == tmp_path and json.loads((path / OWNER).read_text())["pid"] == os.getpid()
        assert sweep(tmp_path) == [] and path.is_dir()  # its owner, this process, is alive: start time and all
        raise KeyboardInterrupt
    assert not path.exists()
    kept = tmp_path / "out"
    with scratch_dir("build", kept) as given:
        assert given == kept
    assert list(tmp_path.iterdir()) == []  # the given directory is the caller's: not created, not removed


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_killed_builds_scratch_is_removed_by_the_next_run(tmp_path: Path) -> None:
    """SIGKILL (as the OOM killer or a lost node's reboot): no finally runs, so the next run sweeps it."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "PREFECT_HOME": str(tmp_path / "home")}
    build = subprocess.Popen([sys.executable, "-m", "prefect_executorch.cli", "build", "examples/convnet/spec.yaml",
                              "--store", str(tmp_path / "store")], cwd=ROOT, env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not list(tmp_path.glob(f"{PREFIX}build-*/{OWNER}")):
        assert build.poll() is None, build.stderr.read().decode() if build.stderr else ""
        assert time.monotonic() < deadline, "the build made no scratch directory"
        time.sleep(0.2)
    os.killpg(build.pid, signal.SIGKILL)
    build.wait(30)
    (left,) = [p.parent for p in tmp_path.glob(f"{PREFIX}build-*/{OWNER}")]
    assert sweep(tmp_path) == [left] and not left.exists()
    # Prefect's API ran in a session of its own, which the kill did not reach: it leaves by itself.
    marker, deadline = f"TMPDIR={tmp_path}".encode(), time.monotonic() + 15
    while running := [e.parent.name for e in Path("/proc").glob("[0-9]*/environ") if _reads(e, marker)]:
        assert time.monotonic() < deadline, f"still running after the build was killed: {running}"
        time.sleep(0.5)


def _reads(environ: Path, marker: bytes) -> bool:
    """Whether the process of ``/proc/<pid>/environ`` has ``marker`` in its environment (False once it is gone)."""
    try:
        return marker + b"\0" in environ.read_bytes() + b"\0"
    except OSError:
        return False


def test_every_temporary_folder_of_the_package_is_made_in_a_scratch_folder() -> None:
    """Only scratch.py makes folders in the system's temporary folder (owned, swept after a kill); every other
    temporary folder or file is made inside a folder the caller gave (``dir=``)."""
    import ast

    package = Path(__file__).resolve().parents[2] / "src" / "prefect_executorch"
    makers = {"mkdtemp", "TemporaryDirectory", "mkstemp", "NamedTemporaryFile", "TemporaryFile"}
    loose = []
    for source in sorted(package.rglob("*.py")):
        if source.name == "scratch.py":
            continue
        for node in ast.walk(ast.parse(source.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in makers
                    and not any(keyword.arg == "dir" for keyword in node.keywords)):
                loose.append(f"{source.relative_to(package)}:{node.lineno}")
    assert loose == []


_REPORT_CACHES = '''
import os
import sys
from pathlib import Path

from pydantic import BaseModel

from prefect_executorch import isolation


class Caches(BaseModel):
    inductor: str = ""
    triton: str = ""


def report(request: dict) -> Caches:
    return Caches(inductor=os.environ["TORCHINDUCTOR_CACHE_DIR"], triton=os.environ["TRITON_CACHE_DIR"])


# The spawned child imports this script as __mp_main__ and resolves the command there.
isolation.COMMANDS["report-caches"] = f"{__name__}:report"

if __name__ == "__main__":
    caches = isolation.run_isolated("report-caches", Caches(), Caches, timeout_s=120, scratch_dir=Path(sys.argv[1]),
                                    start="spawn")
    print(caches.model_dump_json())
'''


def test_a_childs_compile_caches_are_its_own_under_scratch(tmp_path: Path) -> None:
    """Inductor's and Triton's caches default to one folder per user, where concurrent builds of one graph race."""
    script, scratch = tmp_path / "report_caches.py", tmp_path / "scratch"
    script.write_text(_REPORT_CACHES)
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "home")}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    done = subprocess.run([sys.executable, str(script), str(scratch)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    caches = json.loads(done.stdout.splitlines()[-1])
    for path in caches.values():
        assert Path(path).parent.parent == scratch and Path(path).parent.name.startswith(".report-caches-"), caches
    assert caches["inductor"] != caches["triton"]
    assert list(scratch.iterdir()) == []  # gone with the child's folder
