"""Nonsense refused at the door: each input below is refused with a SpecError naming the field, the value and the rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prefect_executorch.errors import SpecError
from prefect_executorch.export.exporter import export_program
from prefect_executorch.spec.buildspec import BuildSpec, check_input_budget, load_spec, parse_spec
from prefect_executorch.validate.validator import validate_program

from helpers import spec_data

INPUT = "methods.forward.inputs.0"


def with_input(**fields: Any) -> dict[str, Any]:
    """A spec mapping whose one input ``x`` has ``fields`` set (``shape`` defaults to [4, 3])."""
    return spec_data(methods={"forward": {"inputs": [{"name": "x", "shape": [4, 3], **fields}]}})


def refusal(data: dict[str, Any]) -> str:
    """The SpecError message ``data`` is refused with."""
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return str(info.value)


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        (with_input(name=""), f"{INPUT}.name", "'' is not a valid input name; use an ASCII identifier"),
        (with_input(name="input-ids"), f"{INPUT}.name", "'input-ids' is not a valid input name"),
        (with_input(name="x | y"), f"{INPUT}.name", "'x | y' is not a valid input name"),
        (with_input(name="a\nb"), f"{INPUT}.name", "is not a valid input name"),
        (with_input(shape=[2**63]), f"{INPUT}.shape.0", "less than or equal to 2147483647 (got 9223372036854775808)"),
        (with_input(shape=[4, 0]), f"{INPUT}.shape.1", "greater than or equal to 1 (got 0)"),
        (with_input(shape=[4, True]), f"{INPUT}.shape.1", "valid integer (got True)"),
        (with_input(shape=[4, 3.0]), f"{INPUT}.shape.1", "valid integer (got 3.0)"),
        (with_input(low=float("nan")), f"{INPUT}.low", "finite number (got nan)"),
        (with_input(high=float("inf")), f"{INPUT}.high", "finite number (got inf)"),
        (with_input(low=1e308), f"{INPUT}.low", "1e+308 is outside the finite range of float32"),
        (with_input(dtype="float16", high=1e5), f"{INPUT}.high", "outside the finite range of float16 [-65504, 65504]"),
        (with_input(low=-3e38, high=3e38), f"{INPUT}.high", "high - low = 6e+38 overflows float32"),
        (with_input(low=2.0, high=1.0), f"{INPUT}.high", "1.0 must be > low (2.0)"),
        (with_input(low=5.0), INPUT, "low (5.0) must be < high (1.0)"),
        (with_input(dtype="int8", high=1000), f"{INPUT}.high", "1000 must be a whole number within [-128, 128] for int8"),
        (with_input(dtype="uint8", low=-1), f"{INPUT}.low", "-1 must be a whole number within [0, 255] for uint8"),
        (with_input(dtype="int32", low=0.5), f"{INPUT}.low", "0.5 must be a whole number"),
        (with_input(low="0"), f"{INPUT}.low", "valid number (got '0')"),
        (with_input(dynamic={3: {"min": 2, "max": 8}}), f"{INPUT}.dynamic", "dim 3 is outside the shape [4, 3]"),
        (with_input(dynamic={-1: {"min": 2, "max": 8}}), f"{INPUT}.dynamic", "dim -1 is outside the shape"),
        (with_input(dynamic={0: {"min": 2, "max": 2**40}}), f"{INPUT}.dynamic.0.max", "less than or equal to 2147483647"),
        (with_input(dynamic={0: {"min": 0, "max": 8}}), f"{INPUT}.dynamic.0.min", "greater than or equal to 1 (got 0)"),
        (with_input(dynamic={"x": {"min": 2, "max": 8}}), f"{INPUT}.dynamic.x.[key]", "valid integer (got 'x')"),
        (with_input(dynamic={0: {"min": 4, "max": 4}}), f"{INPUT}.dynamic.0", "min (4) must be < max (4)"),
        (with_input(dynamic={0: {"min": 2, "max": 8, "name": "a b"}}), f"{INPUT}.dynamic.0.name",
         "'a b' is not a valid dim name"),
        (spec_data(methods={"forward": {"inputs": [
            {"name": "a", "shape": [4], "dynamic": {0: {"min": 2, "max": 8, "name": "batch"}}},
            {"name": "b", "shape": [4], "dynamic": {0: {"min": 2, "max": 16, "name": "batch"}}}]}}),
         "methods.forward.inputs", "dynamic dims named 'batch' must share one range and one example size; found "
         "[2, 8] at size 4 and [2, 16] at size 4"),
        (spec_data(methods={"forward": {"inputs": [
            {"name": "a", "shape": [4], "dynamic": {0: {"min": 2, "max": 8, "name": "batch"}}},
            {"name": "b", "shape": [3], "dynamic": {0: {"min": 2, "max": 8, "name": "batch"}}}]}}),
         "methods.forward.inputs", "[2, 8] at size 4 and [2, 8] at size 3"),
        (spec_data(validation={"samples": True}), "validation.samples", "valid integer (got True)"),
        (spec_data(name="m\n"), "name", "'m\\n' is not a valid name"),
        (spec_data(version="1\n"), "version", "'1\\n' is not a valid name"),
        (spec_data(validation={"samples": 2.0}), "validation.samples", "valid integer (got 2.0)"),
        (spec_data(validation={"samples": "2"}), "validation.samples", "valid integer (got '2')"),
        (spec_data(validation={"seed": -1}), "validation.seed", "greater than or equal to 0 (got -1)"),
        (spec_data(validation={"atol": float("nan")}), "validation.atol", "finite number (got nan)"),
        (spec_data(validation={"timeout_s": float("inf")}), "validation.timeout_s", "finite number (got inf)"),
        (spec_data(validation={"timeout_s": "60"}), "validation.timeout_s", "valid number (got '60')"),
        (spec_data(external_weights="yes"), "external_weights", "valid boolean (got 'yes')"),
        (spec_data(external_weights=1), "external_weights", "valid boolean (got 1)"),
        (spec_data(methods={"forward": {"inputs": [{"name": "x", "shape": [2]}, {"name": "x", "shape": [2]}]}}),
         "methods.forward.inputs", "input names must be unique within a method; ['x'] appear more than once"),
        (spec_data(methods={"class": {"inputs": [{"name": "x", "shape": [2]}]}}), "methods",
         "'class' is not a valid method name; use an ASCII identifier"),
        (spec_data(methods={"été": {"inputs": [{"name": "x", "shape": [2]}]}}), "methods", "'été' is not a valid method name"),
        (spec_data(methods={"forward": {"inputs": [{"name": "x", "shape": [2]}], "attribute": "a.b"}}),
         "methods.forward.attribute", "'a.b' is not a valid method name"),
        (spec_data(validation={"methods": {"forward": {"extra_shapes": [[[2, 3, 8, 2**31]]]}}}),
         "validation.methods.forward.extra_shapes.0.0.3", "less than or equal to 2147483647"),
    ],
)
def test_nonsense_is_refused_naming_the_field(data: dict[str, Any], field: str, message: str) -> None:
    text = refusal(data)
    assert text.startswith("invalid build spec:\n")
    line = next((line.strip() for line in text.splitlines() if line.strip().startswith(f"{field}: ")), None)
    assert line is not None, f"no line for {field!r} in {text!r}"
    assert message in line


def test_json_spec_with_string_dim_keys_is_accepted(tmp_path: Path) -> None:
    # JSON has only string keys, so a .json spec spells a dynamic dim's index "0"; that is not coercion.
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(with_input(dynamic={"0": {"min": 2, "max": 8}})))
    assert list(load_spec(path).methods["forward"].inputs[0].dynamic) == [0]


def test_yaml_spellings_that_pydantic_used_to_coerce(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    text = f"name: m\nversion: '1'\nmodel: {spec_data()['model']}\nmethods: {{forward: {{inputs: [{{name: x, shape: [2]}}]}}}}\n"
    path.write_text(text + "validation: {samples: true}\n")
    with pytest.raises(SpecError, match=r"validation\.samples: Input should be a valid integer \(got True\)"):
        load_spec(path)
    path.write_text(text + "validation: {atol: .nan}\n")
    with pytest.raises(SpecError, match=r"validation\.atol: Input should be a finite number \(got nan\)"):
        load_spec(path)
    # An unquoted version is a YAML number, not a name.
    path.write_text(text.replace("version: '1'", "version: 1"))
    with pytest.raises(SpecError, match=r"version: Input should be a valid string \(got 1\)"):
        load_spec(path)


def test_sensible_edges_are_accepted() -> None:
    spec = parse_spec(spec_data(methods={"forward": {"inputs": [
        {"name": "ids", "shape": [2, 2**31 - 1], "dtype": "int8", "low": -128, "high": 128},
        {"name": "_x2", "shape": [3], "dtype": "float16", "low": -65504, "high": 0},
        {"name": "mask", "shape": [4], "dynamic": {"0": {"min": 2, "max": 2**31 - 1}}, "dtype": "bool"},
    ]}}, validation={"seed": 2**63 - 1, "samples": 1}))
    inputs = spec.methods["forward"].inputs
    assert [i.name for i in inputs] == ["ids", "_x2", "mask"]
    assert inputs[2].bounds() == [(2, 2**31 - 1)]
    assert parse_spec(json.loads(spec.canonical_json())) == spec


def budget_spec(max_batch: int, dtype: str = "float32") -> BuildSpec:
    """A spec whose input is [B, 1024, 1024] with B dynamic up to ``max_batch``."""
    return parse_spec(spec_data(methods={"forward": {"inputs": [
        {"name": "x", "shape": [2, 1024, 1024], "dtype": dtype, "dynamic": {0: {"min": 1, "max": max_batch}}}]}}))


def test_input_budget_counts_every_dynamic_dim_at_its_max() -> None:
    mib = 2**20
    check_input_budget(budget_spec(16), 64 * mib, "validation.memory_limit_mib")  # 16 x 1 MiB x 4 B = 64 MiB
    check_input_budget(budget_spec(2**20), None, "export_memory_limit_mib")  # no limit, nothing to check
    with pytest.raises(SpecError) as info:
        check_input_budget(budget_spec(17), 64 * mib, "validation.memory_limit_mib")
    assert str(info.value).startswith(f"{INPUT}: input 'x' at its largest shape [17, 1024, 1024] (float32, every "
                                      "dynamic dim at its max) takes 68 MiB, more than the 64 MiB of "
                                      "validation.memory_limit_mib")
    check_input_budget(budget_spec(64, "int8"), 64 * mib, "validation.memory_limit_mib")


def test_export_refuses_an_input_over_budget_before_any_child_starts(tmp_path: Path) -> None:
    spec = budget_spec(2**20)  # 4 TiB at its largest
    roomy = spec.validation.model_copy(update={"memory_limit_mib": 2**23})
    spec = spec.model_copy(update={"export_memory_limit_mib": 1024, "validation": roomy})
    with pytest.raises(SpecError, match=r"takes 4,194,304 MiB, more than the 1,024 MiB of export_memory_limit_mib"):
        export_program(spec, tmp_path / "out")
    # Refused before fresh_export_dir: no export directory, no child, nothing written.
    assert not (tmp_path / "out").exists()
    # No export limit, but validation (next in every build) would hold 4 TiB in its default 8 GiB.
    with pytest.raises(SpecError, match=r"more than the 8,192 MiB of validation\.memory_limit_mib"):
        export_program(budget_spec(2**20), tmp_path / "out")
    assert not (tmp_path / "out").exists()



def test_validation_refuses_an_input_over_budget_before_any_child_starts(tmp_path: Path) -> None:
    spec = budget_spec(256)
    spec = spec.model_copy(update={"validation": spec.validation.model_copy(update={"memory_limit_mib": 512})})
    with pytest.raises(SpecError, match=r"\[256, 1024, 1024\] .* takes 1,024 MiB, more than the 512 MiB of "
                                        r"validation\.memory_limit_mib"):
        validate_program(spec, tmp_path / "no-bundle", [], scratch_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_deployment_parameters_take_a_target_by_name_as_a_spec_file_does() -> None:
    # Prefect checks a deployment run's parameters against the flow's schema before the flow starts.
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools import ValidationError, validate

    from prefect_executorch.flows.build import build_bundle

    schema = parameter_schema(build_bundle).model_dump_for_openapi()
    spec = {"name": "m", "version": "1", "model": "m.py:f", "methods": {"forward": {"inputs": [{"name": "x", "shape": [2]}]}}}
    for target in ("xnnpack", "cuda", {"kind": "xnnpack"}, {"kind": "cuda", "precision": "bf16"}):
        validate({"spec": {**spec, "target": target}, "store": "./bundles"}, schema, raise_on_error=True)
    with pytest.raises(ValidationError, match="spec.target"):
        validate({"spec": {**spec, "target": "vulkan"}, "store": "./bundles"}, schema, raise_on_error=True)
