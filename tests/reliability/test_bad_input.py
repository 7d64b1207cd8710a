"""Bad input of every kind: a clear error naming what is wrong, exit 2 for usage, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from prefect_executorch.artifacts.aliases import read_alias
from prefect_executorch.artifacts.s3 import S3Store
from prefect_executorch.artifacts.store import LocalStore
from prefect_executorch.errors import ExportFailed, SpecError
from prefect_executorch.exporter import export_program
from prefect_executorch.modelref import load_model
from prefect_executorch.spec import load_spec, parse_spec

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
        ("name: m\nversion: '1'\nmodel: m:f\nmethods: {}\n", "methods: Dictionary should have at least 1 item"),
        ("name: m\nversion: '1'\nmodel: m:f\nmethods: {forward: {inputs: [{name: x, shape: [2]}]}}\n"
         "validation: {samples: -1}\n", "validation.samples: Input should be greater than or equal to 1"),
    ],
)
def test_malformed_specs(tmp_path: Path, record_fault, text: str, expected: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert expected in str(info.value)
    record_fault("bad input", f"malformed spec: {expected[:40]}")


@pytest.mark.parametrize("value", ["../escape", "/abs", "a/b", "nul\x00byte", "x" * 129, "", "."])
def test_path_traversal_in_names(record_fault, value: str) -> None:
    for field in ("name", "version"):
        with pytest.raises(SpecError, match=f"{field}: .*not a valid name"):
            parse_spec(spec_data(**{field: value}))
    record_fault("bad input", f"unsafe name {value[:20]!r}", injected=2)


def test_weights_that_need_pickle_are_refused(make_spec, record_fault, tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    torch.save({"fc1.weight": NeedsPickle()}, path)
    spec = make_spec("mlp", weights=str(path))
    with pytest.raises(SpecError, match="cannot be loaded with weights_only=True .*needs pickle"):
        load_model(spec)
    record_fault("bad input", "weights file needs pickle")


def test_weights_that_are_not_a_state_dict(make_spec, record_fault, tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    torch.save([torch.zeros(2)], path)
    with pytest.raises(SpecError, match="holds list, expected a state dict"):
        load_model(make_spec("mlp", weights=str(path)))
    torch.save({"fc1.weight": torch.zeros(3, 3)}, path)
    with pytest.raises(SpecError, match="does not fit the model"):
        load_model(make_spec("mlp", weights=str(path)))
    record_fault("bad input", "weights: not a state dict / wrong keys", injected=2)


def test_input_shapes_that_do_not_fit_the_model(make_spec, record_fault, tmp_path: Path) -> None:
    spec = make_spec("mlp", methods={"forward": {"inputs": [{"name": "x", "shape": [2, 7]}]}})
    with pytest.raises(ExportFailed, match=r"(?s)method 'forward' with inputs \(x: float32 \[2, 7\]\).*check that methods.forward.inputs"):
        export_program(spec, tmp_path / "out")
    record_fault("bad input", "input shape does not fit the model")


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        (["build", "missing.yaml"], 2, "cannot read 'missing.yaml'"),
        (["build"], 2, "Missing argument"),
        (["no-such-command"], 2, "No such command"),
    ],
)
def test_cli_exit_codes(tmp_path: Path, record_fault, args: list[str], code: int, expected: str) -> None:
    result = subprocess.run([sys.executable, "-m", "prefect_executorch.cli", *args], capture_output=True, text=True,
                            cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"}, timeout=120)
    assert result.returncode == code
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    record_fault("bad input", f"cli {' '.join(args)[:40]}")


def test_cli_failed_build_exits_1(tmp_path: Path, record_fault) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: m\nversion: '1'\nmodel: {MODELS}:aborts\nmethods: {{forward: {{inputs: [{{name: x, shape: [2, 3]}}]}}}}\n")
    result = subprocess.run([sys.executable, "-m", "prefect_executorch.cli", "build", str(spec), "--store",
                             str(tmp_path / "store")], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "ExportFailed" in result.stderr and "SIGABRT" in result.stderr
    assert not (tmp_path / "store").exists()
    record_fault("process", "cli build whose export aborts")


def test_factory_that_returns_the_wrong_type(make_spec, record_fault, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"model: factory .*not_a_module' returned dict, expected a torch.nn.Module"):
        export_program(make_spec("not_a_module"), tmp_path / "out")
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []
    record_fault("bad input", "factory returns a dict")


@pytest.mark.parametrize("value", ["../escape", "/abs", "a/b", "nul\x00byte", "x" * 129, "..", ""])
def test_unsafe_aliases_and_store_prefixes(record_fault, tmp_path: Path, value: str) -> None:
    store = LocalStore(tmp_path / "store")
    with pytest.raises(SpecError, match="alias: .*not a valid name"):
        read_alias(store, "convnet", value)
    if value.strip("/"):  # an empty prefix is the bucket's root, which is allowed
        with pytest.raises(SpecError, match="store key .* is not a relative path of plain segments|not a valid"):
            S3Store("bucket", value + "/..")
    assert not (tmp_path / "store").exists()
    record_fault("bad input", f"unsafe alias / store prefix {value[:20]!r}", injected=2 if value.strip("/") else 1)
