"""Bad input of every kind: a clear error naming what is wrong, exit 2 for usage, no traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from prefect_executorch.artifacts.aliases import read_alias
from prefect_executorch.artifacts.s3 import S3Store
from prefect_executorch.artifacts.store import LocalStore
from prefect_executorch.errors import ExportFailed, SpecError
from prefect_executorch.export.exporter import export_program
from prefect_executorch.spec.buildspec import load_spec, parse_spec
from prefect_executorch.spec.modelref import load_model

from helpers import MODELS, spec_data
from models import NeedsPickle


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: [unclosed\n", "not valid YAML/JSON"),
        ('{"name": "m", "version": ', "not valid YAML/JSON"),
        ("- just\n- a list\n", "expected a mapping of fields, got list"),
        ("name: m\nversion: '1'\nmodel: m:f\nmethods: {forward: {inputs: [{name: x, shape: abc}]}}\n",
         "methods.forward.inputs.0.shape: Input should be a valid list"),
        ("name: m\nversion: '1'\nmodel: m:f\nmethods: {}\n", "methods: give at least one method"),
        ("name: m\nversion: '1'\nmodel: m:f\nmethods: {forward: {inputs: [{name: x, shape: [2]}]}}\n"
         "validation: {samples: -1}\n", "validation.samples: Input should be greater than or equal to 1"),
    ],
)
def test_malformed_specs(tmp_path: Path, faults, text: str, expected: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with faults("bad input", f"malformed spec: {expected[:40]}").expect(SpecError, match=re.escape(expected)):
        load_spec(path)


@pytest.mark.parametrize("value", ["../escape", "/abs", "a/b", "nul\x00byte", "x" * 129, "", "."])
def test_path_traversal_in_names(faults, value: str) -> None:
    fault = faults("bad input", f"unsafe name {value[:20]!r}")
    for field in ("name", "version"):
        with fault.expect(SpecError, match=f"{field}: .*not a valid name"):
            parse_spec(spec_data(**{field: value}))


def test_weights_that_need_pickle_are_refused(make_spec, faults, tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    torch.save({"fc1.weight": NeedsPickle()}, path)
    spec = make_spec("mlp", weights=str(path))
    with faults("bad input", "weights file needs pickle").expect(
            SpecError, match="cannot be loaded with weights_only=True .*needs pickle"):
        load_model(spec)


def test_weights_that_are_not_a_state_dict(make_spec, faults, tmp_path: Path) -> None:
    fault = faults("bad input", "weights: not a state dict / wrong keys")
    path = tmp_path / "weights.pt"
    torch.save([torch.zeros(2)], path)
    with fault.expect(SpecError, match="holds list, expected a state dict"):
        load_model(make_spec("mlp", weights=str(path)))
    torch.save({"fc1.weight": torch.zeros(3, 3)}, path)
    with fault.expect(SpecError, match="does not fit the model"):
        load_model(make_spec("mlp", weights=str(path)))


def test_input_shapes_that_do_not_fit_the_model(make_spec, faults, tmp_path: Path) -> None:
    spec = make_spec("mlp", methods={"forward": {"inputs": [{"name": "x", "shape": [2, 7]}]}})
    with faults("bad input", "input shape does not fit the model").expect(
            ExportFailed, match=r"(?s)method 'forward' with inputs \(x: float32 \[2, 7\]\).*check that methods.forward.inputs"):
        export_program(spec, tmp_path / "out")


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        (["build", "missing.yaml"], 2, "cannot read 'missing.yaml'"),
        (["build"], 2, "Missing argument"),
        (["no-such-command"], 2, "No such command"),
    ],
)
def test_cli_exit_codes(tmp_path: Path, faults, args: list[str], code: int, expected: str) -> None:
    fault = faults("bad input", f"cli {' '.join(args)[:40]}")
    result = subprocess.run([sys.executable, "-m", "prefect_executorch.cli", *args], capture_output=True, text=True,
                            cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"}, timeout=120)
    fault.outcome(injected=1, survived=int(result.returncode == code and expected in result.stderr
                                           and "Traceback" not in result.stderr))
    assert result.returncode == code
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_failed_build_exits_1(tmp_path: Path, faults) -> None:
    fault = faults("process", "cli build whose export aborts")
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: m\nversion: '1'\nmodel: {MODELS}:aborts\nmethods: {{forward: {{inputs: [{{name: x, shape: [2, 3]}}]}}}}\n")
    result = subprocess.run([sys.executable, "-m", "prefect_executorch.cli", "build", str(spec), "--store",
                             str(tmp_path / "store")], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    fault.outcome(injected=1, survived=int(result.returncode == 1 and "ExportFailed" in result.stderr))
    assert result.returncode == 1, result.stderr[-2000:]
    assert "ExportFailed" in result.stderr and "SIGABRT" in result.stderr
    assert not (tmp_path / "store").exists()


def test_factory_that_returns_the_wrong_type(make_spec, faults, tmp_path: Path) -> None:
    with faults("bad input", "factory returns a dict").expect(
            SpecError, match=r"model: factory .*not_a_module' returned dict, expected a torch.nn.Module"):
        export_program(make_spec("not_a_module"), tmp_path / "out")
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


@pytest.mark.parametrize("value", ["../escape", "/abs", "a/b", "nul\x00byte", "x" * 129, "..", ""])
def test_unsafe_aliases_and_store_prefixes(faults, tmp_path: Path, value: str) -> None:
    fault = faults("bad input", f"unsafe alias / store prefix {value[:20]!r}")
    store = LocalStore(tmp_path / "store")
    with fault.expect(SpecError, match="alias: .*not a valid name"):
        read_alias(store, "convnet", value)
    if value.strip("/"):  # an empty prefix is the bucket's root, which is allowed
        with fault.expect(SpecError, match="store key .* is not a relative path of plain segments|not a valid"):
            S3Store("bucket", value + "/..")
    assert not (tmp_path / "store").exists()
