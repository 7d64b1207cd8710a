"""The CLI: bad input exits 2 with a message naming the field and no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import MODELS

CLI = [sys.executable, "-m", "prefect_executorch.cli"]


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PREFECT_EXECUTORCH_STORE": str(cwd / "store")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def test_unknown_field_exits_2_without_traceback(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: m\nversion: '1'\nmodel: {MODELS}:convnet\ncolour: blue\n"
                    "methods: {forward: {inputs: [{name: x, shape: [2, 3, 8, 8]}]}}\n")
    result = _run("build", str(spec), cwd=tmp_path)
    assert result.returncode == 2
    assert "colour: unknown field" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "store").exists()


def test_missing_factory_exits_2(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"name": "m", "version": "1", "model": f"{MODELS}:missing",
                                "methods": {"forward": {"inputs": [{"name": "x", "shape": [2, 3]}]}}}))
    result = _run("build", str(spec), cwd=tmp_path)
    assert result.returncode == 2 and "defines no top-level 'missing'" in result.stderr


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = _run("--debug", "build", str(tmp_path / "absent.yaml"), cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_probe_json_describes_this_machine(tmp_path: Path) -> None:
    result = _run("probe", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    import torch

    assert facts["torch"] == torch.__version__
    assert facts["cuda_available"] is torch.cuda.is_available()
    assert facts["executorch"] == "1.4.1"


def test_inspect_refuses_a_directory_without_manifest(tmp_path: Path) -> None:
    result = _run("inspect", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 1 and "has no manifest.json" in result.stderr
