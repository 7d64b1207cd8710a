"""Validation inputs: random values within their declared range, user samples that must fit the declared inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from prefect_executorch.errors import SpecError
from prefect_executorch.spec.buildspec import parse_spec
from prefect_executorch.spec.inputs import check_sample, load_samples_file, random_tensor
from prefect_executorch.spec.methods import InputSpec

from helpers import spec_data


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
