"""Tensors for export and validation, built from a method's declared inputs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prefect_executorch.errors import SpecError
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.fields import FLOAT_DTYPES
from prefect_executorch.spec.methods import InputSpec, MethodSpec
from prefect_executorch.spec.validation import MethodValidation

if TYPE_CHECKING:
    import torch

Shapes = list[list[int]]
#: One call's positional inputs.
Inputs = tuple["torch.Tensor", ...]


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


def shape_points(method: MethodSpec, extra_shapes: list[Shapes] | None = None) -> list[tuple[str, Shapes]]:
    """The shapes validation runs: ``static`` or ``min``/``opt``/``max`` of every dynamic dim, then ``extra[i]``."""
    if not any(i.dynamic for i in method.inputs):
        points = [("static", [list(i.shape) for i in method.inputs])]
    else:
        points = []
        for label in ("min", "opt", "max"):
            shapes: Shapes = []
            for spec in method.inputs:
                shape = list(spec.shape)
                for index, dim in spec.dynamic.items():
                    shape[index] = {"min": dim.min, "opt": dim.opt or spec.shape[index], "max": dim.max}[label]
                shapes.append(shape)
            if all(shapes != seen for _, seen in points):
                points.append((label, shapes))
    points.extend((f"extra[{index}]", [list(s) for s in extra]) for index, extra in enumerate(extra_shapes or []))
    return points


def random_tensor(spec: InputSpec, shape: list[int], generator: torch.Generator) -> torch.Tensor:
    """Seeded random values for one input, drawn within the spec's ``low``/``high`` as its distribution says."""
    import torch

    dtype = torch_dtype(spec.dtype)
    if spec.dtype == "bool":
        return torch.randint(0, 2, shape, generator=generator).bool()
    distribution = spec.distribution or ("uniform" if spec.dtype in FLOAT_DTYPES else "int_range")
    if distribution == "int_range":
        first = int(spec.low if spec.low is not None else 0)
        stop = int(spec.high if spec.high is not None else 10)
        return torch.randint(first, stop, shape, generator=generator).to(dtype)
    if distribution == "normal":
        if spec.low is None or spec.high is None:
            return torch.randn(shape, generator=generator).to(dtype)
        # Six standard deviations span the range; the rare tail is clipped so no value leaves it.
        mean, std = (spec.low + spec.high) / 2, (spec.high - spec.low) / 6
        values = torch.randn(shape, generator=generator) * std + mean
        return values.clamp(spec.low, spec.high).to(dtype)
    low = spec.low if spec.low is not None else -1.0
    high = spec.high if spec.high is not None else 1.0
    return (torch.rand(shape, generator=generator) * (high - low) + low).to(dtype)


def random_inputs(method: MethodSpec, shapes: Shapes, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    """One tuple of inputs for ``method`` at ``shapes``."""
    return tuple(random_tensor(spec, shape, generator) for spec, shape in zip(method.inputs, shapes, strict=False))


def example_inputs(method: MethodSpec, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Inputs at the declared example shapes, used for ``torch.export``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return random_inputs(method, [list(i.shape) for i in method.inputs], generator)


def check_sample(method: MethodSpec, sample: Any, where: str) -> tuple[torch.Tensor, ...]:
    """A user-supplied sample as a tuple of tensors, refused unless it fits the method's declared inputs."""
    import torch

    values = (sample,) if isinstance(sample, torch.Tensor) else sample
    if not isinstance(values, (tuple, list)) or not all(isinstance(v, torch.Tensor) for v in values):
        raise SpecError(f"{where}: expected a tuple of tensors (one per input), got {type(sample).__name__}")
    if len(values) != len(method.inputs):
        names = [i.name for i in method.inputs]
        raise SpecError(f"{where}: {len(values)} tensors for {len(names)} inputs {names}; give one tensor per input")
    for tensor, spec in zip(values, method.inputs, strict=False):
        dtype = str(tensor.dtype).removeprefix("torch.")
        if dtype != spec.dtype or not spec.accepts_shape(tuple(tensor.shape)):
            raise SpecError(
                f"{where}: input {spec.name!r} is {dtype} {list(tensor.shape)}, the method declares "
                f"{spec.dtype} {spec.describe_shape()}; fix the sample or the method's inputs"
            )
    return tuple(t.contiguous() for t in values)


def load_samples_file(path: str, method: MethodSpec, field: str) -> list[tuple[torch.Tensor, ...]]:
    """The input tuples saved in ``path`` (``torch.save([(x, y), ...])``), loaded without pickle."""
    import pickle

    import torch

    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise SpecError(f"{field}: file {path!r} does not exist") from None
    except (pickle.UnpicklingError, RuntimeError, OSError, EOFError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(
            f"{field}: {path!r} cannot be loaded with torch.load(weights_only=True): {first}; "
            "save a list of tuples of tensors with torch.save"
        ) from None
    if isinstance(data, torch.Tensor) or not isinstance(data, (list, tuple)) or not data:
        raise SpecError(f"{field}: {path!r} holds {type(data).__name__}, expected a non-empty list of input tuples")
    return [check_sample(method, sample, f"{field}[{index}]") for index, sample in enumerate(data)]


def load_dataset(reference: str, method: MethodSpec, field: str, limit: int) -> list[tuple[torch.Tensor, ...]]:
    """Up to ``limit`` input tuples from the user's dataset factory (a function returning an iterable)."""
    from prefect_executorch.spec.modelref import load_factory

    produced = load_factory(reference, field)()
    try:
        iterable = iter(produced)
    except TypeError:
        raise SpecError(f"{field}: {reference!r} returned {type(produced).__name__}, expected an iterable of input tuples") from None
    samples = []
    for index, sample in enumerate(iterable):
        if index == limit:
            break
        samples.append(check_sample(method, sample, f"{field} sample {index}"))
    if not samples:
        raise SpecError(f"{field}: {reference!r} yielded no samples")
    return samples


def case_inputs(spec: BuildSpec, name: str, method: MethodSpec) -> Iterator[tuple[str, int, Inputs]]:
    """Every input tuple of a method: seeded random ones at each declared shape, then the user's samples."""
    import torch

    settings = spec.validation.methods.get(name, MethodValidation())
    generator = torch.Generator().manual_seed(spec.validation.seed)
    for label, shapes in shape_points(method, settings.extra_shapes):
        for sample in range(spec.validation.samples):
            yield label, sample, random_inputs(method, shapes, generator)
    field = f"validation.methods.{name}"
    if settings.samples_file:
        for index, inputs in enumerate(load_samples_file(settings.samples_file, method, f"{field}.samples_file")):
            yield "samples_file", index, inputs
    if settings.dataset:
        dataset = load_dataset(settings.dataset, method, f"{field}.dataset", settings.max_dataset_samples)
        for index, inputs in enumerate(dataset):
            yield "dataset", index, inputs


def calibration_inputs(spec: BuildSpec, name: str) -> tuple[str, list[tuple[Any, ...]]]:
    """The input tuples a calibrated scheme calibrates ``name`` on, and their source in words."""
    from prefect_executorch.spec.inputs import case_inputs, load_dataset

    assert spec.quantization is not None
    method = spec.methods[name]
    calibration = spec.quantization.calibration
    if calibration is not None and calibration.dataset is not None:
        samples = load_dataset(calibration.dataset, method, "quantization.calibration.dataset", calibration.max_samples)
        return f"dataset {calibration.dataset}", samples
    return "validation samples", [inputs for _, _, inputs in case_inputs(spec, name, method)]
