"""Tensors for export and validation, built from a method's declared inputs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefect_executorch.spec import FLOAT_DTYPES, InputSpec, MethodSpec

if TYPE_CHECKING:
    import torch

Shapes = list[list[int]]


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a spec dtype name."""
    import torch

    return getattr(torch, name)  # type: ignore[no-any-return]


def _dim_name(spec: InputSpec, index: int) -> str:
    dim = spec.dynamic[index]
    return dim.name or f"{spec.name}_dim{index}"


def dynamic_shapes(method: MethodSpec) -> tuple[dict[int, Any] | None, ...] | None:
    """``torch.export`` dynamic shapes for a method; dims with one name share one ``Dim``."""
    from torch.export import Dim

    if not any(i.dynamic for i in method.inputs):
        return None
    dims: dict[str, Any] = {}
    result: list[dict[int, Any] | None] = []
    for spec in method.inputs:
        per_input: dict[int, Any] = {}
        for index, bounds in spec.dynamic.items():
            name = _dim_name(spec, index)
            if name not in dims:
                dims[name] = Dim(name, min=bounds.min, max=bounds.max)
            per_input[index] = dims[name]
        result.append(per_input or None)
    return tuple(result)


def shape_points(method: MethodSpec) -> list[tuple[str, Shapes]]:
    """The shapes validation runs: ``static``, or ``min``/``opt``/``max`` of every dynamic dim."""
    if not any(i.dynamic for i in method.inputs):
        return [("static", [list(i.shape) for i in method.inputs])]
    points: list[tuple[str, Shapes]] = []
    for label in ("min", "opt", "max"):
        shapes: Shapes = []
        for spec in method.inputs:
            shape = list(spec.shape)
            for index, dim in spec.dynamic.items():
                shape[index] = {"min": dim.min, "opt": dim.opt or spec.shape[index], "max": dim.max}[label]
            shapes.append(shape)
        if all(shapes != seen for _, seen in points):
            points.append((label, shapes))
    return points


def random_tensor(spec: InputSpec, shape: list[int], generator: torch.Generator) -> torch.Tensor:
    """Seeded random values for one input, drawn as the spec says."""
    import torch

    dtype = torch_dtype(spec.dtype)
    if spec.dtype == "bool":
        return torch.randint(0, 2, shape, generator=generator).bool()
    distribution = spec.distribution or ("uniform" if spec.dtype in FLOAT_DTYPES else "int_range")
    if distribution == "int_range" or spec.dtype not in FLOAT_DTYPES:
        low = int(spec.low if spec.low is not None else 0)
        high = int(spec.high if spec.high is not None else 10)
        return torch.randint(low, high, shape, generator=generator).to(dtype)
    if distribution == "normal":
        mean = ((spec.low or 0.0) + (spec.high or 0.0)) / 2 if spec.low is not None and spec.high is not None else 0.0
        return (torch.randn(shape, generator=generator) + mean).to(dtype)
    low = spec.low if spec.low is not None else -1.0
    high = spec.high if spec.high is not None else 1.0
    return (torch.rand(shape, generator=generator) * (high - low) + low).to(dtype)


def random_inputs(method: MethodSpec, shapes: Shapes, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """One tuple of inputs for ``method`` at ``shapes``."""
    return tuple(random_tensor(spec, shape, generator) for spec, shape in zip(method.inputs, shapes))


def example_inputs(method: MethodSpec, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Inputs at the declared example shapes, used for ``torch.export``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return random_inputs(method, [list(i.shape) for i in method.inputs], generator)
