"""Run crash-prone work (export, loading a program) in a child process with a timeout.

Children are forked from a forkserver that has already imported torch and ExecuTorch, so a child
starts in milliseconds instead of paying those imports again; ``warm_up()`` starts that server
early, in the background. Each child gets its own session, log file and optional memory bound: an
address-space limit (RLIMIT_AS) for CPU work, or, for children that initialise CUDA (which reserves
huge virtual ranges, so even 16 GiB of address space makes ``cudaGetDeviceCount`` fail), a watch
on the resident memory of the child's process group that kills it above the bound. The parent passes a pydantic request through a JSON file and reads the result (or a typed
error) back. A crash, a signal or a timeout becomes ``ChildProcessFailed`` carrying the child's
stderr tail, and the parent process lives on. ``PREFECT_EXECUTORCH_CHILD_START=spawn`` starts each
child as a fresh interpreter instead.
"""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import multiprocessing.forkserver
import os
import pkgutil
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field

from prefect_executorch import errors
from prefect_executorch.stopping import kill_descendants

#: Commands a child can run: name -> "module:function" taking the request JSON, returning a model.
COMMANDS: dict[str, str] = {
    "export": "prefect_executorch.export.exporter:export_in_child",
    "validate": "prefect_executorch.validate.validator:validate_in_child",
    "probe": "prefect_executorch.machine.toolchain:probe_in_child",
    "verify-bundled": "prefect_executorch.runtime.bundled_cases:verify_bundled_in_child",
    "side_by_side": "prefect_executorch.validate.sidebyside:side_by_side_in_child",
    "triage": "prefect_executorch.validate.triage:triage_in_child",
    "verify-generation": "prefect_executorch.validate.generation:verify_generation_in_child",
    "generate": "prefect_executorch.runtime.llm_runner:generate_in_child",
    "verify-transcription": "prefect_executorch.validate.transcription:verify_transcription_in_child",
    "transcribe": "prefect_executorch.runtime.speech:transcribe_in_child",
    "write-cpp-cases": "prefect_executorch.runtime.cpp_consumer:write_cases_in_child",
}
#: What the forkserver imports once, so that children do not (missing ones are skipped). Never the
#: ExecuTorch runtime: the TensorRT delegate package must swap in its own before the stock one loads.
PRELOAD = [
    "prefect_executorch.forkserver_env",  # first: the environment the imports below need
    "torch",
    "executorch.exir",
    "executorch.backends.xnnpack.partition.xnnpack_partitioner",
    # Delegation facts, bundled programs and triage (~0.8 s each child otherwise); loads no runtime.
    "executorch.devtools",
    "prefect_executorch.export.exporter",
    "prefect_executorch.validate.validator",
]
#: Preloaded last by a process that exports (a build: its probe or export child starts the server, or the CLI's
#: build command): one tiny export, so that each export child starts warm (``forkserver_warm``: ~7 s of CPU saved
#: a child, ~9 s spent once). A process that only runs programs (verify, generate) would not get it back. Not
#: where a GPU is visible: the warm-up's export would initialise CUDA in the server, leaving its children none.
WARM_PRELOAD = "prefect_executorch.forkserver_warm"
#: The children of a build, which start its forkserver warm.
BUILD_COMMANDS = frozenset({"probe", "export"})
#: The forkserver's environment beside the caller's, set in it by its first preload. Its preload imports
#: torchao (through executorch.exir), which calls ``torch.cuda.is_available()`` at import; that CUDA-runtime
#: check marks the process so that every forked child then fails "Cannot re-initialize CUDA in forked
#: subprocess". torch's NVML check answers the same question without that mark.
FORKSERVER_ENV = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
#: IsolationSettings.child_start's variable, for callers that set it for themselves (benchmarks/validation_cost.py).
START_METHOD_ENV = "PREFECT_EXECUTORCH_CHILD_START"


StartMethod = Literal["forkserver", "spawn"]


def _preload(exports: bool) -> list[str]:
    return [*PRELOAD, WARM_PRELOAD] if exports else PRELOAD


def _context(method: StartMethod | None = None, exports: bool = False) -> Any:
    # Imported here: the children import this module, and the settings import Prefect.
    from prefect_executorch.settings import get_settings

    settings = get_settings()
    method = method or settings.isolation.child_start
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(_preload(exports))  # read only by the server's start
        _ensure_forkserver(quiet=not settings.debug)
    return context


#: Held while fd 2 points elsewhere: two threads starting children at once would otherwise interleave their
#: saves and restores of fd 2, and the last restore could leave this process's stderr at /dev/null.
_STDERR_SWAP = threading.Lock()


def _ensure_forkserver(quiet: bool) -> None:
    """Start the forkserver (once); its first preload sets ``FORKSERVER_ENV`` in it, not here.

    ``quiet`` sends the forkserver's own stderr to /dev/null: its imports print C-level notes and
    library warnings (cpuinfo, torchao's optional kernels, torch's _pytree) that a terminal user cannot
    act on; each child logs to its own file anyway.
    """
    if not quiet:
        multiprocessing.forkserver.ensure_running()
        return
    # The forkserver inherits fd 2 when it is spawned, so point fd 2 elsewhere for that moment only.
    with _STDERR_SWAP:
        stderr = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 2)
            multiprocessing.forkserver.ensure_running()
        finally:
            os.dup2(stderr, 2)
            os.close(stderr)
            os.close(devnull)


def check_main_guard() -> None:
    """Refuse to start children from a script without ``if __name__ == "__main__":``.

    forkserver and spawn children import the main script again (as ``__mp_main__``) before they
    run anything; unguarded, that import would build again and the child would die with no output.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or getattr(main, "__spec__", None) is not None or not path or not str(path).endswith(".py"):
        return  # `python -m`, an entry point's guarded stub, or an interactive session
    try:
        source = Path(path).read_text(errors="replace")
    except OSError:
        return
    if "__main__" not in source:
        raise errors.MissingMainGuard(
            f"{path} calls prefect-executorch at import time; its export and validation run in child processes that "
            "import the script again, so put the script's work under `if __name__ == \"__main__\":`"
        )


def warm_up(quiet: bool = False, exports: bool = False) -> None:
    """Start the forkserver now so its imports overlap with the caller's own start-up (``quiet``: see below;
    ``exports``: warm for export children too)."""
    check_main_guard()
    # Started before the start method is read: reading it imports the settings and Prefect (~1 s),
    # which would delay the server's own imports, the longest wait of a build. With child_start=spawn
    # (an escape hatch) the server is then never used and exits with this process.
    multiprocessing.get_context("forkserver").set_forkserver_preload(_preload(exports))
    _ensure_forkserver(quiet)


def stop_forkserver() -> None:
    """Kill the forkserver now (an interrupted command must leave nothing running).

    It ignores SIGINT, and while it still imports its preload it would notice its parent's exit only
    when done. Its children go first: ``run_isolated`` kills the one it started, but one forked while the
    stop came (before the parent learnt its pid) would outlive everything, in a session of its own.
    """
    server: Any = multiprocessing.forkserver._forkserver  # type: ignore[attr-defined]  # CPython's one server
    pid = server._forkserver_pid
    if pid is None:
        return
    kill_descendants(pid)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server._stop()  # reaps it and forgets it: a later child starts a new one


class MemoryLimit(BaseModel):
    """How a child process is bounded: by address space (RLIMIT_AS) or by a watch on its resident memory."""

    mib: int = Field(ge=1)
    kind: Literal["address_space", "resident"]

    def describe(self) -> str:
        """In words, for reports and errors."""
        what = "address space (RLIMIT_AS)" if self.kind == "address_space" else "resident memory (watched, killed above)"
        return f"{what} {self.mib} MiB"


ResultT = TypeVar("ResultT", bound=BaseModel)
#: How often the parent looks at a watched child's resident memory (s).
RSS_POLL_S = 0.1
STDERR_TAIL_CHARS = 4000


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-STDERR_TAIL_CHARS:].decode(errors="replace").strip()


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


def run_isolated(
    command: str,
    request: BaseModel,
    result_type: type[ResultT],
    *,
    timeout_s: float,
    scratch_dir: Path,
    memory_limit: MemoryLimit | None = None,
    what: str | None = None,
    start: StartMethod | None = None,
) -> ResultT:
    """Run ``command`` on ``request`` in a child process and return its typed result.

    ``start`` overrides the ``child_start`` setting for this child (a one-off child in a long-lived process).
    """
    address_space = memory_limit.mib if memory_limit and memory_limit.kind == "address_space" else None
    what = what or command
    check_main_guard()
    scratch_dir.mkdir(parents=True, exist_ok=True)
    ipc = Path(tempfile.mkdtemp(prefix=f".{command}-", dir=scratch_dir))
    try:
        request_path, response_path, log_path = ipc / "request.json", ipc / "response.json", ipc / "stderr.log"
        request_path.write_text(request.model_dump_json())
        proc = _context(start, exports=command in BUILD_COMMANDS).Process(
            target=_child_main,
            args=(command, str(request_path), str(response_path), str(log_path), address_space),
            name=f"prefect-executorch-{command}",
        )
        start_child(proc)
        over_mib: int | None = None
        try:
            if memory_limit is not None and memory_limit.kind == "resident":
                over_mib = _join_watching_rss(proc, timeout_s, memory_limit.mib)
            else:
                proc.join(timeout_s)
            if over_mib is not None:
                proc.join()
                raise errors.ChildProcessFailed(
                    f"{what} used {over_mib} MiB of resident memory, over its limit of {memory_limit.describe()}, "  # type: ignore[union-attr]
                    f"and was killed; raise the spec's memory limit if the model needs more",
                    returncode=proc.exitcode, child_output=_tail(log_path),
                )
            if proc.exitcode is None:
                _kill_group(proc)
                proc.join()
                raise errors.ChildProcessFailed(
                    f"{what} timed out after {timeout_s:g} s and was killed; raise the timeout in the spec "
                    f"if the model needs longer",
                    returncode=None,
                    child_output=_tail(log_path),
                )
        finally:
            # Grandchildren the child left behind must not outlive it.
            _kill_group(proc)
        returncode = proc.exitcode
        stderr_tail = _tail(log_path)
        if returncode != 0 or not response_path.exists():
            hint = ""
            if returncode == -signal.SIGKILL and memory_limit:
                hint = f" (possibly over its memory limit: {memory_limit.describe()})"
            raise errors.ChildProcessFailed(
                f"{what} child process {describe_exit(returncode)}{hint}",
                returncode=returncode,
                child_output=stderr_tail,
            )
        response = json.loads(response_path.read_text())
    finally:
        shutil.rmtree(ipc, ignore_errors=True)
    if "error" in response:
        error_type = getattr(errors, response["error"], None)
        if isinstance(error_type, type) and issubclass(error_type, errors.PrefectExecutorchError):
            if error_type is errors.ChildProcessFailed:
                raise errors.ChildProcessFailed(response["message"], child_output=stderr_tail)
            raise error_type(response["message"], child_output=stderr_tail if response.get("traceback") else "")
        raise errors.ChildProcessFailed(
            f"{what} failed in the child process: {response['message']}", child_output=stderr_tail
        )
    return result_type.model_validate(response["result"])


#: Serialises starting children; see ``start_child``.
_START_LOCK = threading.Lock()


def start_child(proc: Any) -> None:
    """Start ``proc`` so that no other thread ever reads its exit status (CPython gh-130895).

    ``Process.start()`` first polls every child this process started before; with the forkserver, a
    poll reads the exit status off a pipe once, so a thread starting a child just as another thread's
    child exits can take that status, and the owner's own poll then reads end-of-file and reports
    exit code 255 (concurrent builds in one flow run: 73 of 400 children so, four threads here). Each
    child is taken out of that bookkeeping as it starts, under a lock so no start polls it meanwhile;
    ``run_isolated`` joins its own child.
    """
    with _START_LOCK:
        proc.start()
        multiprocessing.process._children.discard(proc)  # type: ignore[attr-defined]  # CPython's registry


def _group_rss_mib(pgid: int) -> int:
    """Resident memory of every process in session/group ``pgid`` (the child and what it started), in MiB."""
    total_kib = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[2]) != pgid:  # fields after the command name: state, ppid, pgrp...
                continue
            for line in (stat.parent / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
                    break
        except (OSError, ValueError, IndexError):
            continue  # the process ended while we looked
    return total_kib // 1024


def _join_watching_rss(proc: Any, timeout_s: float, limit_mib: int) -> int | None:
    """Wait for ``proc`` up to ``timeout_s``; kill its group and return its RSS if that goes over ``limit_mib``."""
    deadline = time.monotonic() + timeout_s
    while proc.exitcode is None and time.monotonic() < deadline:
        proc.join(RSS_POLL_S)
        rss = _group_rss_mib(proc.pid)
        if rss > limit_mib:
            _kill_group(proc)
            return rss
    return None


def _kill_group(proc: Any) -> None:
    """Kill the child's session (it and anything it started); the child itself if it has none yet."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        if proc.exitcode is None:
            proc.kill()


def _limit_note(limit_mib: int | None) -> str:
    return f" (memory limit {limit_mib} MiB)" if limit_mib else ""


def _describe_chain(exc: BaseException) -> str:
    """``Type: message`` of an exception and of every cause under it (the root cause is what helps)."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(parts) < 5:
        parts.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    return "\n  caused by ".join(parts)


def _compile_caches(folder: Path) -> dict[str, str]:
    """The environment that puts a child's Inductor and Triton caches in ``folder`` (its own, under scratch).

    Their default is one folder per user (``/tmp/torchinductor_<user>``, ``~/.triton``) shared by every build on
    the machine: two builds compiling the same graph at once race there (on an H100 one export lost the other's
    ``cubins_combined.o`` mid-link), and a build would write outside its scratch.
    """
    return {"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor-cache"), "TRITON_CACHE_DIR": str(folder / "triton-cache")}


def _resolve(command: str) -> Callable[[dict[str, Any]], BaseModel]:
    return pkgutil.resolve_name(COMMANDS[command])  # type: ignore[no-any-return]


def _child_main(
    command: str, request_path: str, response_path: str, log_path: str, memory_limit_mib: int | None
) -> None:
    """Child side: own session, output to the log file, run the command, write the response."""
    os.setsid()
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    # A crash (SIGSEGV in a runtime, SIGABRT, SIGBUS) prints the Python stack it happened in to the log: the
    # child's output the parent's error carries.
    faulthandler.enable(all_threads=True)
    os.environ.update(_compile_caches(Path(request_path).parent))
    if memory_limit_mib:
        limit = memory_limit_mib * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    started = time.monotonic()
    request = json.loads(Path(request_path).read_text())
    try:
        result = _resolve(command)(request)
        response: dict[str, Any] = {"result": result.model_dump(mode="json")}
    except errors.PrefectExecutorchError as exc:
        # A typed error raised over a library's exception: that exception's traceback is the cause.
        response = {"error": type(exc).__name__, "message": str(exc), "traceback": exc.__cause__ is not None}
        if exc.__cause__ is not None:
            traceback.print_exception(exc.__cause__)
    except MemoryError:
        response = {"error": "ChildProcessFailed", "message": f"{command} ran out of memory{_limit_note(memory_limit_mib)}"}
    except Exception as exc:  # noqa: BLE001 - everything else is reported with its traceback
        traceback.print_exc()
        message = _describe_chain(exc)
        if "can't allocate memory" in message:  # torch's allocator under RLIMIT_AS
            message = f"{command} ran out of memory{_limit_note(memory_limit_mib)}: {message}"
        response = {"error": type(exc).__name__, "message": message}
    tmp = Path(response_path + ".tmp")
    tmp.write_text(json.dumps(response))
    tmp.rename(response_path)
    print(f"{command} child finished in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
