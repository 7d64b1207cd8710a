"""The CLI: bad input exits 2 with a message naming the field and no traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from helpers import CLI_NOISE, MODELS, session_api, spec_data

CLI = [sys.executable, "-m", "prefect_executorch.cli"]
#: The CLI children report to the session's Prefect API (helpers.session_api).
pytestmark = pytest.mark.usefixtures("prefect_harness")


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **session_api(), "PREFECT_EXECUTORCH_STORE": str(cwd / "store")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.mark.parametrize("debug", ["plain", "--debug", "PREFECT_EXECUTORCH_DEBUG=1"])
def test_bad_input_exits_2_with_and_without_debug(tmp_path: Path, debug: str) -> None:
    """--debug adds the traceback and nothing else: a script's `if` on the exit code must not change with it."""
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    (tmp_path / "unknown.yaml").write_text(f"name: m\nversion: '1'\nmodel: {MODELS}:convnet\ncolour: blue\n")
    env = {**os.environ, "PREFECT_EXECUTORCH_DEBUG": "1"} if debug.startswith("PREFECT") else os.environ
    for spec in ("bad.yaml", "unknown.yaml"):
        args = [*CLI, *(["--debug"] if debug == "--debug" else []), "build", spec]
        result = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
        assert result.returncode == 2, (spec, result.stderr[-1500:])
        assert ("Traceback" in result.stderr) is (debug != "plain"), (spec, result.stderr[-1500:])


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


def _write_spec(tmp_path: Path, factory: str = "convnet", **overrides: Any) -> Path:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(spec_data(factory, **overrides)))
    return spec


@pytest.mark.parametrize(
    ("factory", "overrides", "code", "cause"),
    [
        ("convnet", {"validation": {"samples": 1, "atol": 0, "rtol": 0, "min_cosine": 1.0}}, 1,
         r"ValidationFailed: 1 of 1 validation cases failed; worst: forward\[0\] .* beyond atol=0 \+ rtol=0\*\|eager\| "
         r"from validation \("),
        ("mlp", {"methods": {"forward": {"inputs": [{"name": "x", "shape": [2, 32]}]}}, "target": {"kind": "tensorrt"}},
         2, r"ToolchainMismatch: this worker cannot build target tensorrt"),
        ("raises", {}, 2, r"SpecError: model: factory .*:raises' raised RuntimeError: factory exploded on purpose"),
        ("aborts", {}, 1, r"ExportFailed: export of aborts 1 for xnnpack child process was killed by SIGABRT"),
    ],
    ids=["validation-failure", "toolchain-refusal", "factory-raises", "factory-aborts"],
)
def test_an_expected_failure_is_one_short_message(tmp_path: Path, factory: str, overrides: dict[str, Any], code: int,
                                                  cause: str) -> None:
    result = _run("build", str(_write_spec(tmp_path, factory, **overrides)), cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == code, output
    assert re.search(cause, result.stderr), output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) <= (6 if "tensorrt" in json.dumps(overrides) else 3), output  # tensorrt: one line per problem
    assert not [word for word in CLI_NOISE if word in output], output


def test_debug_shows_the_traceback_of_the_cause(tmp_path: Path) -> None:
    result = _run("--debug", "build", str(_write_spec(tmp_path, "raises")), cwd=tmp_path)
    assert result.returncode == 2  # as without --debug: the factory's failure is bad input
    # The factory's own frame and exception, not only the CLI's re-raise.
    assert 'raise RuntimeError("factory exploded on purpose")' in result.stderr, result.stderr
    assert "RuntimeError: factory exploded on purpose" in result.stderr
    assert "Traceback" in result.stderr
    assert "View at" not in result.stdout + result.stderr  # the embedded API serves no UI to link to
    # Each traceback once: the child's (the factory's frame) and this process's, not again in Prefect's logs.
    assert result.stderr.count('raise RuntimeError("factory exploded on purpose")') == 1, result.stderr


def test_probe_json_describes_this_machine(tmp_path: Path) -> None:
    result = _run("probe", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    import torch

    assert facts["torch"] == torch.__version__
    assert facts["cuda_available"] is torch.cuda.is_available()
    assert facts["executorch"] == version("executorch")


def test_inspect_refuses_a_directory_without_manifest(tmp_path: Path) -> None:
    result = _run("inspect", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 2 and "has no manifest.json" in result.stderr  # a wrong path: bad input


def test_cli_validate_needs_exactly_one_bundle(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from prefect_executorch.cli.main import app

    (tmp_path / "spec.json").write_text(json.dumps(spec_data("mlp")))
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "spec.json")])
    assert result.exit_code == 2 and "give either BUNDLE_DIR or --bundle" in result.output
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "spec.json"), "--bundle", "s3://b/m/1/x/manifest.json"])
    assert result.exit_code == 2 and "names no bucket" in result.output and "[/prefix]" in result.output


def test_every_help_reads_as_plain_text_with_uppercase_arguments() -> None:
    import re

    from typer.testing import CliRunner

    from prefect_executorch.cli.main import app

    names = [command.name or command.callback.__name__ for command in app.registered_commands if command.callback]
    assert "verify" in names and "build" in names
    for args in ([], *([name] for name in names)):
        output = CliRunner().invoke(app, [*args, "--help"]).output
        assert "``" not in output, (args, output)  # reST literals read as noise in a terminal
        usage = next(line for line in output.splitlines() if line.startswith("Usage:"))
        assert all(word.isupper() for word in re.findall(r"[\[{]([A-Za-z_]+)[\]}]", usage) if word != "OPTIONS"), usage


def test_the_live_view_shows_each_stage_once_in_order_and_a_stop_as_stopped() -> None:
    """The CLI probes, starts Prefect, and the flow probes again before it exports: 'probe' once, not a second spinner."""
    import io
    import re

    from rich.console import Console

    from prefect_executorch.cli.render import LiveView
    from prefect_executorch.progress import listening, stage

    terminal = io.StringIO()
    view = LiveView(debug=False, screen=Console(file=terminal, force_terminal=True, width=80))
    with view, listening(view.on_stage):
        for name in ("probe", "start", "probe", "export"):
            with stage(name):
                pass
        with pytest.raises(KeyboardInterrupt), stage("validate"):
            raise KeyboardInterrupt
    # The last frame the terminal drew: what stays on screen (every earlier frame is erased by cursor moves).
    last_frame = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal.getvalue().rsplit("\x1b[1A\x1b[2K", 1)[-1])
    rows = [line.split()[:2] for line in last_frame.splitlines() if line.strip()]
    assert rows == [["probe", "done"], ["start", "done"], ["export", "done"], ["validate", "stopped"]], rows
    assert set(view.seconds) == {"probe", "start", "export", "validate"}
