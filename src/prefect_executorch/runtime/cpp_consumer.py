"""A bundle run as a C++ service runs it: ExecuTorch's ``Module`` from the installed wheel's own libraries.

The consumer (``prefect_executorch/consumer``: ``main.cpp`` and a ``CMakeLists.txt`` that finds the wheel's
``executorch-config.cmake``) is built once per ExecuTorch version, install location and source, under the user's cache directory.
The bundle's ``model.bpte`` cases are written out as raw tensors for it (ExecuTorch's wheel ships no C++
bundled-program library), and it prints one line per case and a verdict; its exit status says which failed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from prefect_executorch.errors import ToolchainMismatch, ValidationFailed
from prefect_executorch.hashing import sha256_bytes
from prefect_executorch.isolation import describe_exit, run_isolated
from prefect_executorch.runtime.bundled_cases import BUNDLED_FILE, BundledFacts
from prefect_executorch.scratch import scratch_dir

if TYPE_CHECKING:
    from prefect_executorch.artifacts.manifest import Manifest

#: The consumer's sources, shipped in the package.
SOURCE_DIR = Path(__file__).resolve().parents[1] / "consumer"
BINARY = "bundle_consumer"
#: Limits of building the consumer and of one run of it (s).
BUILD_TIMEOUT_S = 600.0
RUN_TIMEOUT_S = 600.0
#: An error line of ExecuTorch's C++ logger: ``E 00:00:00.006159 executorch:method.cpp:85] Backend X is not registered.``
_RUNTIME_ERROR = re.compile(r"^E [\d:.]+ executorch:[\w./-]+:\d+\] (.+)$")
#: How many calls of each case the consumer times (main.cpp reads it; 0: none).
TIME_CALLS_ENV = "BUNDLE_CONSUMER_TIME_CALLS"
#: The consumer's exit statuses (main.cpp).
EXIT_MISMATCH, EXIT_LOAD, EXIT_CASES = 1, 2, 3
INSTALL = "install CMake and a C++17 compiler (`apt install cmake g++`, or `pip install cmake` beside a compiler)"


class CasesRequest(BaseModel):
    """What the child that writes a bundle's cases out gets."""

    bundle_dir: str
    facts: BundledFacts
    out: str


class CasesWritten(BaseModel):
    """How many cases the child wrote."""

    count: int


class CppCheck(BaseModel):
    """A bundle's cases run by the C++ consumer."""

    lines: list[str]
    cases: int
    binary: str
    p50_us: dict[str, float] = Field(default_factory=dict, description="With timed calls: each case's median call "
                                     "(key 'METHOD LABEL'), in microseconds.")


def cache_root() -> Path:
    """Where consumers are built: the user's cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "prefect-executorch" / "cpp-consumer"


def executorch_cmake_dir() -> Path:
    """The folder of the installed ExecuTorch's ``executorch-config.cmake``."""
    spec = find_spec("executorch")
    locations = list(spec.submodule_search_locations or []) if spec else []  # a namespace package: no origin
    if not locations:
        raise ToolchainMismatch("the C++ consumer links the installed ExecuTorch, and none is installed; "
                                "pip install executorch==1.5.1")
    found = Path(locations[0]) / "share" / "cmake"
    if not (found / "executorch-config.cmake").is_file():
        raise ToolchainMismatch(f"the installed ExecuTorch {version('executorch')} ships no executorch-config.cmake "
                                f"(looked in {found}); the C++ consumer needs ExecuTorch 1.5 or newer")
    return found


def consumer_binary() -> Path:
    """The consumer built against the installed ExecuTorch (once per version, install location and source).

    The binary links that install's libraries by path: one built against another environment (since deleted, say)
    would not start (exit 127), so the location is part of the key.
    """
    sources = b"".join((SOURCE_DIR / name).read_bytes() for name in ("CMakeLists.txt", "main.cpp"))
    cmake_dir = executorch_cmake_dir()
    build = cache_root() / f"executorch-{version('executorch')}-{sha256_bytes(sources + bytes(cmake_dir))[:12]}"
    if (build / BINARY).is_file():
        return build / BINARY
    cmake = shutil.which("cmake")
    if cmake is None:
        raise ToolchainMismatch(f"building the C++ consumer needs cmake, which is not on PATH; {INSTALL}")
    build.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".building-", dir=build.parent) as scratch:
        for step in ([cmake, "-S", str(SOURCE_DIR), "-B", scratch, f"-Dexecutorch_DIR={cmake_dir}",
                      "-DCMAKE_BUILD_TYPE=Release"], [cmake, "--build", scratch]):
            try:
                done = subprocess.run(step, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise ToolchainMismatch(f"building the C++ consumer took over {BUILD_TIMEOUT_S:g} s") from None
            if done.returncode != 0:
                raise ToolchainMismatch(f"the C++ consumer did not build against ExecuTorch {version('executorch')}: "
                                        f"`{' '.join(step[:2])}` failed; {INSTALL}",
                                        child_output=(done.stdout + done.stderr)[-4000:])
        build.mkdir(exist_ok=True)
        os.replace(Path(scratch) / BINARY, build / BINARY)  # atomic: a concurrent build's binary is the same
    return build / BINARY


def write_cases(bundle_dir: Path, facts: BundledFacts, out: Path) -> int:
    """The ``.bpte``'s cases as ``cases.txt`` and raw tensors in ``out``, with each method's tolerances; their count."""
    from executorch.devtools.bundled_program.serialize import deserialize_from_flatbuffer_to_bundled_program

    from prefect_executorch.runtime.bundled_cases import bundled_tensors

    suites = {suite.method_name: suite for suite in deserialize_from_flatbuffer_to_bundled_program(
        (bundle_dir / BUNDLED_FILE).read_bytes()).method_test_suites}
    lines: list[str] = []
    for name, method in facts.methods.items():
        limits = [method.atol, method.rtol, method.min_cosine, method.max_rel_error]
        for index, label in enumerate(method.cases):
            case = suites[name].test_cases[index]
            lines.append(f"case {name} {label.replace(' ', '_')} " + " ".join("-1" if v is None else repr(v) for v in limits))
            for kind, values in (("in", case.inputs), ("out", case.expected_outputs)):
                for position, tensor in enumerate(bundled_tensors(values)):
                    file = f"{name}-{index}-{kind}{position}.bin"
                    (out / file).write_bytes(tensor.contiguous().numpy().tobytes() if tensor.numel() else b"")
                    dims = " ".join(str(d) for d in tensor.shape)
                    lines.append(f"{kind} {str(tensor.dtype).removeprefix('torch.')} {file} {dims}".rstrip())
    (out / "cases.txt").write_text("\n".join(lines) + "\n")
    return sum(len(method.cases) for method in facts.methods.values())


def write_cases_in_child(request: dict[str, Any]) -> CasesWritten:
    """Child side of ``write_cases`` (decoding the ``.bpte`` imports ExecuTorch's devtools and torch)."""
    req = CasesRequest.model_validate(request)
    return CasesWritten(count=write_cases(Path(req.bundle_dir), req.facts, Path(req.out)))


def run_cpp_consumer(bundle_dir: Path, manifest: Manifest, *, shown_as: Path | None = None,
                     time_calls: int = 0) -> CppCheck:
    """Run a CPU bundle's own cases through the C++ consumer; ``ValidationFailed`` with its lines if one fails.

    ``time_calls``: after each case matches, time that many more calls of it in C++ (``CppCheck.p50_us``).
    """
    where = shown_as or bundle_dir
    facts = manifest.bundled
    if facts is None or facts.file is None:
        why = facts.skipped if facts else "it was published before bundles carried their test cases"
        raise ValidationFailed(f"{where} has no {BUNDLED_FILE} to run in C++ ({why})")
    binary = consumer_binary()
    with scratch_dir("cpp-cases") as scratch:
        cases = scratch / "cases"
        cases.mkdir()
        count = run_isolated("write-cpp-cases", CasesRequest(bundle_dir=str(bundle_dir), facts=facts, out=str(cases)),
                             CasesWritten, timeout_s=RUN_TIMEOUT_S, scratch_dir=scratch,
                             what=f"writing the cases of {where} for C++", start="spawn").count
        command = [str(binary), str(bundle_dir / manifest.program), str(cases),
                   *(str(bundle_dir / data) for data in manifest.data_files)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                                  env={**os.environ, TIME_CALLS_ENV: str(time_calls)})
        except subprocess.TimeoutExpired:
            raise ValidationFailed(f"the C++ consumer ran {where}'s cases for over {RUN_TIMEOUT_S:g} s") from None
    lines = done.stdout.splitlines()
    if done.returncode == 0:
        timed = {" ".join(line.split()[1:3]): float(line.rsplit("=", 1)[1]) for line in lines if line.startswith("time ")}
        return CppCheck(lines=[line for line in lines if not line.startswith("time ")], cases=count, binary=str(binary),
                        p50_us=timed)
    first = next((line for line in lines if line.startswith(("MISMATCH", "LOAD ERROR"))), None)
    what = {EXIT_MISMATCH: "a case did not match its expected outputs", EXIT_LOAD: "the program did not load",
            EXIT_CASES: "it could not read the cases"}.get(done.returncode, f"the consumer {describe_exit(done.returncode)}")
    said = [match[1] for line in done.stderr.splitlines() if (match := _RUNTIME_ERROR.match(line.strip()))]
    raise ValidationFailed(f"ExecuTorch's C++ runtime ran {where}: {what}" + (f": {first}" if first else "")
                           + (f"; the runtime said: {'; '.join(list(dict.fromkeys(said))[:3])}" if said else "")
                           + "; a C++ service linking these libraries would fail the same way",
                           child_output=(done.stdout + done.stderr)[-4000:])
