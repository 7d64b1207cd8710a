"""Comparing a program's outputs with eager: tolerances from general to specific, pairing by path, exact dtypes, NaN and cosine."""

from __future__ import annotations

import pytest
import torch
from torch.utils._pytree import tree_flatten, treespec_dumps

from prefect_executorch.spec.validation import ValidationSpec
from prefect_executorch.validate.compare import compare_outputs, limits_for


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
    assert "atol=0.0001" in results[0].reason
    assert "from the default for float32 (spec fields validation.atol, validation.rtol)" in results[0].reason


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
