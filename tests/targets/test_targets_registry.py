"""The targets registry: each target brings its options and device; the spec and placement ask it."""

from __future__ import annotations

import typing

import pytest

from prefect_executorch.errors import SpecError
from prefect_executorch.spec.buildspec import BuildSpec, parse_spec
from prefect_executorch.spec.options import PortableOptions
from prefect_executorch.targets import TARGETS, get_target, needs_cuda
from prefect_executorch.targets.cpu import PortableTarget

SPEC = {"name": "m", "version": "1", "model": "x.py:f", "methods": {"forward": {"inputs": [{"name": "x", "shape": [1]}]}}}


def test_the_spec_union_is_the_registered_options() -> None:
    union = typing.get_args(BuildSpec.model_fields["target"].annotation)
    assert union == tuple(target.options for target in TARGETS.values())


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_each_target_parses_its_own_options(name: str) -> None:
    target = get_target(name)
    spec = parse_spec({**SPEC, "target": name})
    assert type(spec.target) is target.options and spec.target_name == name
    assert target.device in ("cpu", "cuda")
    # Options and behaviour no longer share a name (spec.TensorRTTarget vs targets.TensorRTTarget before).
    assert target.options.__name__ != type(target).__name__


def test_devices_of_the_shipped_targets() -> None:
    assert {name: target.device for name, target in TARGETS.items()} == {
        "xnnpack": "cpu", "portable": "cpu", "cuda": "cuda", "tensorrt": "cuda"}
    assert [name for name in TARGETS if needs_cuda(name)] == ["cuda", "tensorrt"]


class _CudaPortable(PortableTarget):
    """A subclass of a CPU target that declares CUDA: placement must follow the declaration."""

    name = "cuda-portable"
    device = "cuda"


def test_placement_asks_the_target_for_its_device(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not needs_cuda(_CudaPortable.name)  # unknown until registered
    monkeypatch.setitem(TARGETS, _CudaPortable.name, _CudaPortable())
    assert needs_cuda(_CudaPortable.name)
    assert get_target(_CudaPortable.name).options is PortableOptions


def test_an_unknown_kind_names_the_registered_ones() -> None:
    with pytest.raises(SpecError, match="unknown target 'vulkan'; expected one of: xnnpack, portable, cuda, tensorrt"):
        parse_spec({**SPEC, "target": "vulkan"})
