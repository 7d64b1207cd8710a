"""The pure parts of validation: tolerances, output pairing, inputs, gates, spec checks (no child process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils._pytree import tree_flatten, treespec_dumps

from prefect_executorch.artifacts.locate import parse_manifest_url, resolve_published
from prefect_executorch.artifacts.store import LocalStore
from prefect_executorch.compare import compare_outputs, limits_for
from prefect_executorch.delegation import DelegationFacts
from prefect_executorch.errors import BundleNotFound, InvalidProgram, SpecError
from prefect_executorch.inputs import check_sample, load_samples_file, random_tensor
from prefect_executorch.program import read_program
from prefect_executorch.report import LatencyResult
from prefect_executorch.spec import InputSpec, ValidationSpec, parse_spec
from prefect_executorch.validator import check_gates

from helpers import spec_data


def _error(**overrides: object) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(spec_data("mlp", **overrides))
    return str(info.value)


def test_tolerances_go_from_general_to_specific() -> None:
    spec = ValidationSpec(
        atol=1e-3,
        dtypes={"float32": {"rtol": 1e-2}},
        outputs={"[1]": {"atol": 0.5}},
        methods={"encode": {"outputs": {"[1]": {"min_cosine": 0.9}}}},
    )
    assert limits_for(spec, "forward", "[0]", "float16") == (1e-3, 5e-3, 0.99, "validation", None)
    assert limits_for(spec, "forward", "[0]", "float32") == (1e-3, 1e-2, 0.999, "validation.dtypes.float32", None)
    assert limits_for(spec, "forward", "[1]", "float32") == (0.5, 1e-2, 0.999, "validation.outputs['[1]']", None)
    assert limits_for(spec, "encode", "[1]", "float32") == (0.5, 1e-2, 0.9, "validation.methods.encode.outputs['[1]']", None)
    assert limits_for(ValidationSpec(), "forward", "[0]", "bfloat16") == (1.6e-2, 1.6e-2, 0.99, "default for bfloat16", None)


def test_a_per_output_override_decides_that_output_only() -> None:
    eager = (torch.ones(4), torch.ones(4))
    program = [torch.ones(4) + 0.01, torch.ones(4) + 0.01]
    results = compare_outputs(program, eager, ValidationSpec(outputs={"[1]": {"atol": 0.1}}))
    assert [r.passed for r in results] == [False, True]
    assert "atol=0.0001" in results[0].reason and "from default for float32" in results[0].reason


def test_outputs_pair_by_the_path_the_program_recorded() -> None:
    eager = {"a": torch.zeros(2), "b": {"c": torch.arange(3), "d": torch.tensor([True, False])}}
    # A program that recorded another key order returns its leaves in that order: pairing by path copes.
    reordered = {"b": {"d": torch.tensor([True, False]), "c": torch.arange(3)}, "a": torch.zeros(2)}
    leaves, spec = tree_flatten(reordered)
    results = compare_outputs(leaves, eager, ValidationSpec(), output_spec=treespec_dumps(spec))
    assert [(r.path, r.passed) for r in results] == [("['a']", True), ("['b']['c']", True), ("['b']['d']", True)]
    # Positional pairing (no recorded structure) would compare 'a' with 'd' and fail.
    assert not all(r.passed for r in compare_outputs(leaves, eager, ValidationSpec()))


def test_a_missing_or_extra_output_is_named() -> None:
    eager = {"a": torch.zeros(2), "b": torch.zeros(2)}
    program = {"a": torch.zeros(2), "z": torch.zeros(2)}
    leaves, spec = tree_flatten(program)
    results = compare_outputs(leaves, eager, ValidationSpec(), output_spec=treespec_dumps(spec))
    assert [(r.path, r.passed) for r in results] == [("['a']", True), ("['b']", False), ("['z']", False)]
    assert "the program has no output at ['b']" in results[1].reason
    assert "eager does not" in results[2].reason


def test_integers_and_booleans_must_match_exactly() -> None:
    eager = (torch.tensor([1, 2, 3]), torch.tensor([True, True]))
    results = compare_outputs([torch.tensor([1, 2, 4]), torch.tensor([True, False])], eager, ValidationSpec(atol=10))
    assert [r.passed for r in results] == [False, False]
    assert results[0].reason == "33.33% of elements differ (exact match required for int64)" and results[0].max_abs == 1
    assert "exact match required for bool" in results[1].reason


def test_nan_positions_and_cosine_are_checked() -> None:
    nan = compare_outputs([torch.tensor([1.0, float("nan")])], torch.tensor([1.0, 2.0]), ValidationSpec())
    assert nan[0].reason == "NaN/Inf positions differ from eager"
    flipped = compare_outputs([torch.tensor([1.0, -1.0])], torch.tensor([1.0, 1.0]), ValidationSpec(atol=5, min_cosine=0.5))
    assert flipped[0].cosine == pytest.approx(0.0) and "cosine similarity 0.000000 < min_cosine 0.5" in flipped[0].reason


@pytest.mark.parametrize("fields, low, high", [
    ({"low": 5, "high": 6}, 5, 6),
    ({"distribution": "normal", "low": -2, "high": 2}, -2, 2),
    ({"dtype": "int32", "low": 3, "high": 7}, 3, 6),
    ({"dtype": "uint8", "low": 250, "high": 256}, 250, 255),
    ({"dtype": "float16", "distribution": "int_range", "low": -3, "high": 3}, -3, 2),
])
def test_random_values_stay_within_low_and_high(fields: dict, low: float, high: float) -> None:
    spec = InputSpec(name="x", shape=[64, 64], **fields)
    values = random_tensor(spec, [64, 64], torch.Generator().manual_seed(0))
    assert values.dtype == getattr(torch, spec.dtype)
    assert values.min().item() >= low and values.max().item() <= high
    assert values.min().item() < low + (high - low) / 4 and values.max().item() > high - (high - low) / 4  # spread


def test_normal_values_center_on_the_range() -> None:
    spec = InputSpec(name="x", shape=[100, 100], distribution="normal", low=10, high=16)
    values = random_tensor(spec, [100, 100], torch.Generator().manual_seed(0))
    assert values.mean().item() == pytest.approx(13, abs=0.05) and values.std().item() == pytest.approx(1, abs=0.05)


@pytest.mark.parametrize("fields, message", [
    ({"dtype": "bool", "low": 0}, "low cannot be set for a bool input"),
    ({"dtype": "int64", "distribution": "normal"}, "distribution 'normal' needs a float dtype"),
    ({"dtype": "int64", "low": 0.5}, "low: 0.5 must be a whole number"),
    ({"dtype": "uint8", "low": -1, "high": 3}, "low: -1 must be a whole number within [0, 255] for uint8"),
    ({"distribution": "normal", "low": 0}, "needs both low and high"),
])
def test_bad_value_ranges_are_refused(fields: dict, message: str) -> None:
    inputs = [{"name": "x", "shape": [3, 32], **fields}]
    assert message in _error(methods={"forward": {"inputs": inputs}})


def test_validation_settings_are_checked_against_the_methods() -> None:
    dynamic = {"forward": {"inputs": [{"name": "x", "shape": [3, 32], "dynamic": {0: {"min": 1, "max": 8}}}]}}
    assert "validation.methods.encode: no such method" in _error(
        methods=dynamic, validation={"methods": {"encode": {"extra_shapes": []}}})
    message = _error(methods=dynamic, validation={"methods": {"forward": {"extra_shapes": [[[9, 32]]]}}})
    assert "extra_shapes[0]: input 'x' shape [9, 32] is outside [1..8, 32]" in message
    assert "extra_shapes[0]: 2 shapes for 1 inputs" in _error(
        methods=dynamic, validation={"methods": {"forward": {"extra_shapes": [[[3, 32], [3, 32]]]}}})
    assert "max_latency_ratio needs latency_runs >= 1" in _error(validation={"latency_runs": 0, "max_latency_ratio": 2})
    assert "validation.methods.forward.dataset" in _error(validation={"methods": {"forward": {"dataset": "nocolon"}}})


def test_user_samples_must_fit_the_declared_inputs(tmp_path: Path) -> None:
    spec = parse_spec(spec_data("mlp", methods={"forward": {"inputs": [
        {"name": "x", "shape": [3, 32], "dynamic": {0: {"min": 1, "max": 8}}}]}}))
    method = spec.methods["forward"]
    assert check_sample(method, torch.zeros(2, 32), "s")[0].shape == (2, 32)  # a bare tensor is one input
    with pytest.raises(SpecError, match=r"s: input 'x' is float32 \[9, 32\], the method declares float32 \[1..8, 32\]"):
        check_sample(method, (torch.zeros(9, 32),), "s")
    with pytest.raises(SpecError, match="2 tensors for 1 inputs"):
        check_sample(method, (torch.zeros(2, 32), torch.zeros(2, 32)), "s")
    torch.save({"x": torch.zeros(2, 32)}, tmp_path / "dict.pt")
    with pytest.raises(SpecError, match="holds dict, expected a non-empty list of input tuples"):
        load_samples_file(str(tmp_path / "dict.pt"), method, "validation.methods.forward.samples_file")
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(SpecError, match="cannot be loaded with torch.load"):
        load_samples_file(str(tmp_path / "junk.pt"), method, "f")


def test_gates_fail_on_unknown_or_low_figures() -> None:
    spec = ValidationSpec(min_delegated_fraction=0.5, max_latency_ratio=2)
    delegation = {"forward": DelegationFacts(delegated_ops=1, total_ops=4, undelegated={"aten.sort.default": 3})}
    latency = [LatencyResult(method="forward", shape_label="opt", input_shapes=[[1]], runs=5, eager_median_ms=1,
                             eager_p90_ms=1, program_median_ms=1.5, program_p90_ms=2, ratio=1.5)]
    gates = check_gates(spec, ["forward", "encode"], delegation, latency)
    assert [(g.gate, g.method, g.passed) for g in gates] == [
        ("min_delegated_fraction", "forward", False), ("min_delegated_fraction", "encode", False),
        ("max_latency_ratio", "forward", True), ("max_latency_ratio", "encode", False)]
    assert "0.250 of operators delegated (1 of 4), below 0.5; left outside: aten.sort.default x3" in gates[0].detail
    assert gates[1].detail.startswith("unknown") and gates[3].detail.startswith("not measured")


def test_manifest_urls_split_into_store_and_key() -> None:
    store, key = parse_manifest_url("s3://bucket/pre/fix/m/1.0/xnnpack/cpu-xnnpack-x86_64/manifest.json")
    assert store == "s3://bucket/pre/fix" and key.prefix == "m/1.0/xnnpack/cpu-xnnpack-x86_64"
    assert parse_manifest_url("s3://bucket/m/1/portable/c/manifest.json")[0] == "s3://bucket"
    assert parse_manifest_url("m/1/portable/c/manifest.json")[0] == "."
    for bad, message in [("s3://bucket/m/1/x/c/model.pte", "expected"), ("s3://m/1/x/c/manifest.json", "no bucket"),
                         ("/s/M/1/x/c/manifest.json", "not a valid name")]:
        with pytest.raises(SpecError, match=message):
            parse_manifest_url(bad)


def test_a_name_that_is_neither_version_nor_alias_is_not_found(tmp_path: Path) -> None:
    from prefect_executorch.toolchain import probe

    with pytest.raises(BundleNotFound, match="alias prod of m is not set"):
        resolve_published(LocalStore(tmp_path), "m", "prod", "xnnpack", probe())


def test_a_file_that_is_not_a_program_is_refused(tmp_path: Path) -> None:
    (tmp_path / "junk.pte").write_bytes(b"\x00" * 64)
    with pytest.raises(InvalidProgram, match="no 'ET' file identifier"):
        read_program(tmp_path / "junk.pte")
    (tmp_path / "cut.pte").write_bytes(b"\x1c\x00\x00\x00ET12eh00" + (24).to_bytes(4, "little") + (4096).to_bytes(8, "little") + b"\x00" * 16)
    with pytest.raises(InvalidProgram, match="is truncated"):
        read_program(tmp_path / "cut.pte")


def test_cli_validate_needs_exactly_one_bundle(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from prefect_executorch.cli import app

    (tmp_path / "spec.json").write_text(json.dumps(spec_data("mlp")))
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "spec.json")])
    assert result.exit_code == 2 and "give either BUNDLE_DIR or --bundle" in result.output
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "spec.json"), "--bundle", "s3://b/m/1/x/manifest.json"])
    assert result.exit_code == 2 and "names no bucket" in result.output and "[/prefix]" in result.output
