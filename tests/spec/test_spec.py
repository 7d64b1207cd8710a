"""Spec parsing: every bad input names its field and what was expected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prefect_executorch.errors import SpecError
from prefect_executorch.spec.buildspec import load_spec, parse_spec
from prefect_executorch.spec.inputs import dynamic_shapes, shape_points
from prefect_executorch.spec.modelref import ModelRef

from helpers import spec_data


def _error(data: dict) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return str(info.value)


def test_valid_spec_round_trips_with_defaults() -> None:
    spec = parse_spec(spec_data())
    assert spec.target_name == "xnnpack"
    assert spec.external_weights is False
    assert spec.sha256() == parse_spec(spec.model_dump(mode="json")).sha256()


def test_unknown_field_is_named() -> None:
    message = _error(spec_data(colour="blue"))
    assert "colour: unknown field" in message


def test_unknown_nested_field_is_named() -> None:
    message = _error(spec_data(validation={"samples": 1, "tolerance": 3}))
    assert "validation.tolerance: unknown field" in message


@pytest.mark.parametrize(("overrides", "said"), [
    ({"validaton": {}}, "validaton: unknown field (did you mean 'validation'?)"),
    ({"validation": {"samplez": 2}}, "validation.samplez: unknown field (did you mean 'samples'?)"),
    ({"methods": {"forward": {"inputz": []}}}, "methods.forward.inputz: unknown field (did you mean 'inputs'?)"),
    ({"colour": "blue"}, "colour: unknown field; remove it"),  # nothing close: no guess
])
def test_a_misspelt_field_gets_the_nearest_one(overrides: dict[str, Any], said: str) -> None:
    assert said in _error(spec_data(**overrides))


@pytest.mark.parametrize("target", ["xnnpak", {"kind": "xnnpak"}])
def test_an_unknown_target_is_said_in_the_spec_s_words(target: Any) -> None:
    message = _error(spec_data(target=target))
    assert "target: unknown target 'xnnpak' (did you mean 'xnnpack'?); expected one of: xnnpack, portable" in message
    assert "Input tag" not in message and "'kind'" not in message  # pydantic's words, and a field the spec never named


@pytest.mark.parametrize("name", ["Upper", "a/b", "..", "a..b", "", "-lead", "x" * 200, "nul\x00"])
def test_bad_names_are_refused(name: str) -> None:
    assert "name:" in _error(spec_data(name=name))
    assert "version:" in _error(spec_data(version=name))


def test_bad_dtype_lists_the_choices() -> None:
    message = _error(spec_data(methods={"forward": {"inputs": [{"name": "x", "shape": [2], "dtype": "float99"}]}}))
    assert "methods.forward.inputs.0.dtype" in message and "float32" in message and "float99" in message


def test_dynamic_min_above_max_is_refused() -> None:
    inputs = [{"name": "x", "shape": [4, 3], "dynamic": {0: {"min": 8, "max": 2}}}]
    message = _error(spec_data(methods={"forward": {"inputs": inputs}}))
    assert "min (8) must be < max (2)" in message


def test_dynamic_example_outside_range_is_refused() -> None:
    inputs = [{"name": "x", "shape": [16, 3], "dynamic": {0: {"min": 2, "max": 8}}}]
    assert "shape[0] = 16 must lie within" in _error(spec_data(methods={"forward": {"inputs": inputs}}))


def test_unknown_target_is_named() -> None:
    assert "target" in _error(spec_data(target="tpu"))


def test_model_reference_must_have_a_factory() -> None:
    assert "model:" in _error(spec_data(model="just_a_module"))


def test_missing_factory_is_found_without_running_code() -> None:
    spec = parse_spec(spec_data(model=f"{Path(__file__).parents[1] / 'models.py'}:nope"))
    with pytest.raises(SpecError, match="defines no top-level 'nope'"):
        spec.check_model_reference()


def test_a_model_file_that_is_not_python_is_a_spec_error(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("def build(:\n    pass\n")
    spec = parse_spec(spec_data(model=f"{tmp_path / 'm.py'}:build"))
    with pytest.raises(SpecError, match=r"m\.py:1 cannot be read as Python"):
        spec.check_model_reference()


def test_missing_model_file() -> None:
    spec = parse_spec(spec_data(model="/nonexistent/model.py:build"))
    with pytest.raises(SpecError, match="does not exist"):
        spec.check_model_reference()


def test_load_spec_resolves_paths_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("def build():\n    pass\n")
    (tmp_path / "spec.yaml").write_text(
        "name: a\nversion: '1'\nmodel: m.py:build\nmethods:\n  forward:\n    inputs:\n"
        "      - {name: x, shape: [2, 3]}\n"
    )
    spec = load_spec(tmp_path / "spec.yaml")
    assert spec.model == f"{tmp_path / 'm.py'}:build"
    spec.check_model_reference()


def test_malformed_yaml_is_a_spec_error(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(path)


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path: Path) -> None:
    """PyYAML keeps the last of two equal keys; a spec naming its target twice would build for the second."""
    from prefect_executorch.fleet.automations import load_automations

    path = tmp_path / "spec.yaml"
    path.write_text("name: a\ntarget: xnnpack\nversion: '1'\ntarget: portable\n")
    with pytest.raises(SpecError, match=r"spec\.yaml' line 4: `target` is given a second time \(first on line 2\)"):
        load_spec(path)
    # Nested, and on one line: each mapping on its own; a merge key's mapping may still be overridden.
    path.write_text("name: a\nversion: '1'\nmodel: m.py:build\nmethods:\n  forward: {inputs: [], inputs: []}\n")
    with pytest.raises(SpecError, match="line 5: `inputs` is given a second time"):
        load_spec(path)
    (tmp_path / "m.py").write_text("def build():\n    pass\n")
    path.write_text("base: &x {name: a, version: '1'}\n<<: *x\nversion: '2'\nmodel: m.py:build\n"
                    "methods: {forward: {inputs: [{name: x, shape: [2]}]}}\n")
    with pytest.raises(SpecError, match="base: unknown field"):  # the merge is no duplicate: only the anchor is left
        load_spec(path)
    automations = tmp_path / "automations.yaml"
    automations.write_text("automations:\n  - name: a\n    name: b\n")
    with pytest.raises(SpecError, match="line 3: `name` is given a second time"):
        load_automations(automations)


def test_shape_points_cover_min_opt_max_and_share_named_dims() -> None:
    inputs = [
        {"name": "a", "shape": [4, 3], "dynamic": {0: {"min": 1, "max": 8, "name": "batch"}}},
        {"name": "b", "shape": [4, 5], "dynamic": {0: {"min": 1, "max": 8, "name": "batch"}}},
    ]
    spec = parse_spec(spec_data(methods={"forward": {"inputs": inputs}}))
    points = shape_points(spec.methods["forward"])
    assert points == [("min", [[1, 3], [1, 5]]), ("opt", [[4, 3], [4, 5]]), ("max", [[8, 3], [8, 5]])]
    shapes = dynamic_shapes(spec.methods["forward"])
    assert shapes is not None and shapes[0][0] is shapes[1][0]


def test_one_parser_reads_every_model_reference() -> None:
    assert ModelRef.check("zoo.vision.nets:build", noun="factory") == ("zoo.vision.nets", "build")
    assert not ModelRef.check("zoo.nets:build").is_file and ModelRef.check("models/net.py:build").is_file
    assert ModelRef.split("a.py:b:c") == ("a.py:b", "c")  # the last colon splits
    for bad in ("no_colon", ":build", "zoo.nets:", "zoo.nets:1build", "zoo.nets:a-b"):
        with pytest.raises(ValueError, match=f"{bad!r} must be 'package.module:factory' or 'path/to/file.py:factory'"):
            ModelRef.check(bad, noun="factory")
        with pytest.raises(SpecError, match="model: .* must be 'package.module:factory'"):
            parse_spec(spec_data(model=bad))
