"""Use from Python: a plain script drives the library; one without a main guard fails at once, saying so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PROBE = "from prefect_executorch.machine.toolchain import probe_isolated\n"


def _script(path: Path, body: str) -> subprocess.CompletedProcess[str]:
    path.write_text(body)
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=path.parent, timeout=300)


def test_a_script_without_a_main_guard_fails_at_once_naming_the_fix(tmp_path: Path) -> None:
    result = _script(tmp_path / "unguarded.py", PROBE + "print(probe_isolated().torch)\n")
    assert result.returncode != 0
    assert "MissingMainGuard" in result.stderr and 'if __name__ == "__main__":' in result.stderr
    assert "child process exited" not in result.stderr  # refused before any child started


def test_a_guarded_script_runs_children(tmp_path: Path) -> None:
    import torch

    result = _script(tmp_path / "guarded.py", PROBE + 'if __name__ == "__main__":\n    print(probe_isolated().torch)\n')
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == torch.__version__


BUILD_TWICE = '''
import sys
from prefect_executorch.flows.build import build_bundle
from prefect_executorch.spec.buildspec import parse_spec

if __name__ == "__main__":
    spec = parse_spec({"name": "mlp", "version": "1", "model": sys.argv[1], "target": "portable",
                       "methods": {"forward": {"inputs": [{"name": "x", "shape": [3, 32]}]}},
                       "validation": {"samples": 1}})
    for _ in range(2):
        print("cache hit" if build_bundle(spec, store=sys.argv[2]).cache_hit else "fresh build", flush=True)
'''


def test_two_builds_from_python_print_no_prefect_tracebacks(tmp_path: Path) -> None:
    from helpers import MODELS

    script = tmp_path / "twice.py"
    script.write_text(BUILD_TWICE)
    # Its own Prefect database, as a user's first run has: the ephemeral API starts on it.
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("PREFECT_") or key.startswith("PREFECT_EXECUTORCH_")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180")
    result = subprocess.run([sys.executable, str(script), f"{MODELS}:mlp", str(tmp_path / "store")],
                            capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["fresh", "build", "cache", "hit"]
    assert "database is locked" not in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
