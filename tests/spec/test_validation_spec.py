"""Spec checks of what validation uses: input value ranges, per-method settings (refused with the field named)."""

from __future__ import annotations

import pytest

from prefect_executorch.errors import SpecError
from prefect_executorch.spec.buildspec import parse_spec

from helpers import spec_data


def _error(**overrides: object) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(spec_data("mlp", **overrides))
    return str(info.value)


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
