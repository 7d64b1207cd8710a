"""Use from Python: a plain script drives the library; one without a main guard fails at once, saying so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROBE = "from prefect_executorch.toolchain import probe_isolated\n"


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
