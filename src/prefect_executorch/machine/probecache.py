"""The toolchain probe's answer, cached on disk under a key of everything that can change it.

The probe imports torch in a child (seconds); an unchanged rebuild needs its answer only to compute
the build's fingerprint. The key is gathered without importing anything heavy (a few milliseconds):
the interpreter, ``sys.path`` and every distribution installed on it (name, version, and its RECORD
file's mtime and size, which any install, upgrade or reinstall rewrites), where torch's and
ExecuTorch's packages are and their ``version.py``, the NVIDIA driver (``/proc/driver/nvidia``), the
boot, the environment that decides what CUDA sees and where nvcc is, nvcc itself, the host and the
user, and the probe's own source. Any change to one of them is a different key, so an entry is never
stale; entries are written atomically, and one that cannot be read counts as a miss.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import importlib.util
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from prefect_executorch.machine.toolchain import Toolchain, probe_isolated

#: Where entries live, under the user's cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``).
CACHE_SUBDIR = Path("prefect-executorch") / "toolchain-probe"
#: Entries neither read nor written for this long are removed when another is written.
RETIRE_AFTER_S = 30 * 86400

#: Environment variables that change what torch, CUDA or the nvcc lookup see.
_ENV_NAMES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "CUDA_HOME", "CUDA_PATH")
_ENV_PREFIXES = ("CUDA_", "NVIDIA_", "TORCH_", "PYTORCH_")

#: Files whose content is part of the key: the driver (its version and its GPUs) and the boot.
_SYSTEM_FILES = ("/proc/driver/nvidia/version", "/proc/sys/kernel/random/boot_id")


def cache_dir() -> Path:
    """The directory holding the probe's cached answers."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / CACHE_SUBDIR


def _stat(path: str | Path) -> list[int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return [found.st_mtime_ns, found.st_size, found.st_ino]


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return None


def _search_path() -> list[str]:
    """``sys.path`` less the working directory, which ``python -m`` puts first: a rebuild from another folder is the
    same machine (what a folder could shadow is keyed by where the packages the probe reads are found)."""
    try:
        cwd = os.getcwd()
    except FileNotFoundError:  # the folder was deleted under a running process: nothing of it can shadow a package
        cwd = ""
    return [entry for entry in sys.path if entry not in ("", cwd)]


def _distributions() -> list[list[Any]]:
    """Every ``*.dist-info``/``*.egg-info`` on the search path with its RECORD's stat (pip rewrites it on any
    install)."""
    found: list[list[Any]] = []
    for entry in _search_path():
        try:
            listing = sorted(os.scandir(entry), key=lambda item: item.name)
        except OSError:
            continue
        for item in listing:
            if item.name.endswith((".dist-info", ".egg-info")):
                found.append([entry, item.name, _stat(Path(item.path) / "RECORD") or _stat(item.path)])
    return found


def _package(name: str) -> list[Any] | None:
    """Where a package would be imported from, and its version.py (torch's and ExecuTorch's version live there)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    return [str(folder), _stat(folder / "version.py")]


def _nvidia_gpus() -> list[str]:
    try:
        return sorted(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return []


def _nvcc() -> list[Any]:
    from prefect_executorch.machine.hostprobe import find_nvcc

    path = find_nvcc()
    return [path, _stat(path) if path else None]


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def probe_key() -> str:
    """sha256 of everything the probe's answer depends on, gathered without importing torch."""
    own = Path(__file__).parent
    facts = {
        "python": [sys.executable, os.path.realpath(sys.executable), sys.version, sys.prefix],
        "sys_path": _search_path(),
        "distributions": _distributions(),
        "packages": {name: _package(name) for name in ("torch", "executorch", "torch_tensorrt", "tensorrt", "triton")},
        "files": {path: _read(path) for path in _SYSTEM_FILES},
        "nvidia_gpus": _nvidia_gpus(),
        "env": {name: value for name, value in sorted(os.environ.items())
                if name in _ENV_NAMES or name.startswith(_ENV_PREFIXES)},
        "nvcc": _nvcc(),
        "host": [socket.gethostname(), _user(), os.getuid()],
        # A changed probe (new fields, other facts) must not read answers written by the old one.
        "probe_source": [hashlib.sha256((own / name).read_bytes()).hexdigest()
                         for name in ("hostprobe.py", "toolchain.py", "probecache.py")],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def cached_toolchain(key: str | None = None) -> Toolchain | None:
    """The probe's answer stored under this machine's current key, or None (never probed, or something changed)."""
    path = cache_dir() / f"{key or probe_key()}.json"
    try:
        return Toolchain.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        return None


def store_toolchain(toolchain: Toolchain, key: str) -> None:
    """Keep ``toolchain`` under ``key``, and drop entries unused for a month (a reboot or an install retires
    a key); a cache that cannot be written only costs the next probe."""
    folder = cache_dir()
    written: Path | None = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # Written whole, then renamed: a reader sees the old entry, none, or the new one.
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as handle:
            written = Path(handle.name)
            handle.write(toolchain.model_dump_json())
        os.replace(written, folder / f"{key}.json")
    except OSError:
        if written is not None:
            with contextlib.suppress(OSError):
                written.unlink(missing_ok=True)
        return
    retired = time.time() - RETIRE_AFTER_S
    for entry in folder.glob("*.json"):
        with contextlib.suppress(OSError):
            stat = entry.stat()
            if max(stat.st_atime, stat.st_mtime) < retired:
                entry.unlink()


def probe_cached(timeout_s: float = 300) -> Toolchain:
    """The probe's cached answer for this machine as it is now, else a fresh probe (in a child), then cached."""
    key = probe_key()
    toolchain = cached_toolchain(key)
    if toolchain is None:
        toolchain = probe_isolated(timeout_s=timeout_s)
        # The key is taken before the probe: an install during the probe leaves an entry no one asks for.
        # A GPU that CUDA did not start is the probing process's state (a bad fork, a memory limit), not the
        # machine's: kept, it would refuse every later build until the key changed.
        if toolchain.cuda_error is None:
            store_toolchain(toolchain, key)
    return toolchain
