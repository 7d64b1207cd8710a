"""Compare every output of a program call with eager PyTorch's, leaf by leaf, by pytree path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from prefect_executorch.spec.schemes import DEFAULT_GATES
from prefect_executorch.spec.validation import DEFAULT_MIN_COSINE, DEFAULT_TOLERANCES, ValidationSpec
from prefect_executorch.validate.report import OutputComparison

if TYPE_CHECKING:
    import torch


class Limits(NamedTuple):
    """The tolerances one float output is held to, and the spec field they came from."""

    atol: float | None
    rtol: float | None
    min_cosine: float
    source: str
    max_rel_error: float | None = None


def flatten_with_paths(value: Any) -> list[tuple[str, Any]]:
    """Leaves of a nested output with their paths (``[0]``, ``['logits']``), in export order."""
    from torch.utils._pytree import keystr, tree_flatten_with_path

    leaves, _ = tree_flatten_with_path(value)
    return [(keystr(path) or "[0]", leaf) for path, leaf in leaves]


def program_outputs_with_paths(outputs: list[Any], output_spec: str | None) -> list[tuple[str, Any]] | None:
    """The program's flat outputs with the paths of the structure the program recorded; None if unknown."""
    if not output_spec:
        return None
    from torch.utils._pytree import tree_unflatten, treespec_loads

    try:
        spec = treespec_loads(output_spec)
    except Exception:  # noqa: BLE001 - a structure of types this process cannot rebuild: pair by position
        return None
    if spec.num_leaves != len(outputs):
        return None
    return flatten_with_paths(tree_unflatten(list(outputs), spec))


def default_tolerances(dtype: str, precision: str | None = None) -> tuple[float, float, float]:
    """(atol, rtol, min_cosine) for ``dtype``, loosened to ``precision`` when the program computes in it."""
    names = [dtype] + ([precision] if precision else [])
    atol = max(DEFAULT_TOLERANCES.get(n, DEFAULT_TOLERANCES["float32"])[0] for n in names)
    rtol = max(DEFAULT_TOLERANCES.get(n, DEFAULT_TOLERANCES["float32"])[1] for n in names)
    return atol, rtol, min(DEFAULT_MIN_COSINE.get(n, 0.999) for n in names)


def limits_for(spec: ValidationSpec, method: str, path: str, dtype: str, precision: str | None = None,
               quantization: str | None = None) -> Limits:
    """Tolerances for one output: dtype defaults < validation < dtypes < outputs < methods.<m>.outputs.

    ``precision`` is a lower float type the program computes in (an FP16 engine fed FP32): the
    defaults follow it. A ``quantization`` scheme's defaults are a cosine floor and a relative
    error instead of element-wise tolerances (which a user may still set).
    """
    limits: dict[str, float | None]
    if quantization is not None:
        gate = DEFAULT_GATES[quantization]
        limits = {"atol": None, "rtol": None, "min_cosine": gate.min_cosine, "max_rel_error": gate.max_rel_error}
        source = f"default for {quantization} quantization"
    else:
        atol, rtol, min_cosine = default_tolerances(dtype, precision)
        limits = {"atol": atol, "rtol": rtol, "min_cosine": min_cosine, "max_rel_error": None}
        source = f"default for {dtype}" + (f" computed in {precision}" if precision else "")
    method_settings = spec.methods.get(method)
    layers = [
        ("validation", spec),
        (f"validation.dtypes.{dtype}", spec.dtypes.get(dtype)),  # type: ignore[call-overload]
        (f"validation.outputs[{path!r}]", spec.outputs.get(path)),
        (f"validation.methods.{method}.outputs[{path!r}]", method_settings.outputs.get(path) if method_settings else None),
    ]
    for name, layer in layers:
        given = {key: getattr(layer, key, None) for key in limits if getattr(layer, key, None) is not None}
        if given:
            limits.update(given)
            source = name
    assert limits["min_cosine"] is not None
    return Limits(limits["atol"], limits["rtol"], limits["min_cosine"], source, limits["max_rel_error"])


def _set_by(source: str, *fields: str) -> str:
    """Where a bound came from; a default also names the spec fields that would set it (a user's next step)."""
    if source.startswith("default"):
        return f"from the {source} (spec fields {', '.join(f'validation.{field}' for field in fields)})"
    return f"from {source}"


def _dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _failed(path: str, reason: str, expected: Any = None, actual: Any = None) -> OutputComparison:
    def facts(value: Any) -> tuple[list[int], str]:
        return (list(value.shape), _dtype_name(value)) if hasattr(value, "dtype") else ([], type(value).__name__)

    (want_shape, want_dtype), (got_shape, got_dtype) = facts(expected), facts(actual)
    return OutputComparison(path=path, expected_shape=want_shape, actual_shape=got_shape, expected_dtype=want_dtype,
                            actual_dtype=got_dtype, passed=False, reason=reason)


def compare_tensor(
    path: str, actual: torch.Tensor, expected: torch.Tensor, limits: Limits, precision: str | None = None
) -> OutputComparison:
    """Compare one program output with its eager counterpart; ints and bools must match exactly.

    A program that computes in ``precision`` (an FP16 engine fed FP32) may return that dtype.
    """
    import torch

    dtype = _dtype_name(expected)
    base = OutputComparison(path=path, expected_shape=list(expected.shape), actual_shape=list(actual.shape),
                            expected_dtype=dtype, actual_dtype=_dtype_name(actual), passed=False)
    if actual.shape != expected.shape:
        return base.model_copy(update={"reason": f"shape {list(actual.shape)} != eager {list(expected.shape)}"})
    lowered = precision is not None and expected.is_floating_point() and _dtype_name(actual) == precision
    if actual.dtype != expected.dtype and not lowered:
        return base.model_copy(update={"reason": f"dtype {_dtype_name(actual)} != eager {dtype}"})
    actual, expected = actual.detach().cpu(), expected.detach().cpu()
    if not expected.is_floating_point() and not expected.is_complex():
        unequal = actual != expected
        fraction = unequal.float().mean().item() if unequal.numel() else 0.0
        max_abs = (actual.long() - expected.long()).abs().max().item() if unequal.any() else 0
        return base.model_copy(update={
            "max_abs": float(max_abs), "mismatch_fraction": fraction, "tolerance_source": f"exact for {dtype}",
            "passed": fraction == 0.0,
            "reason": None if fraction == 0.0 else f"{fraction:.2%} of elements differ (exact match required for {dtype})",
        })
    atol, rtol, min_cosine, source, max_rel_error = limits
    # Quantized defaults leave both unset (no element-wise check); one given turns it on, the other at 0.
    elementwise = atol is not None or rtol is not None
    if elementwise:
        atol, rtol = atol or 0.0, rtol or 0.0
    base = base.model_copy(update={"atol": atol, "rtol": rtol, "min_cosine": min_cosine, "tolerance_source": source,
                                   "max_rel_error": max_rel_error})
    a, e = actual.double(), expected.double()
    nan_mismatch = bool((a.isnan() != e.isnan()).any() or (a.isinf() != e.isinf()).any()
                        or (a.isinf() & e.isinf() & (a.sign() != e.sign())).any())
    if nan_mismatch:
        return base.model_copy(update={"max_abs": float("inf"), "mismatch_fraction": 1.0,
                                       "reason": "NaN/Inf positions differ from eager"})
    finite = e.isfinite()
    a, e = a[finite], e[finite]
    if e.numel() == 0:
        return base.model_copy(update={"passed": True})
    diff = (a - e).abs()
    max_abs = diff.max().item()
    nonzero = e.abs() > 0
    max_rel = (diff[nonzero] / e.abs()[nonzero]).max().item() if nonzero.any() else 0.0
    fraction = (diff > (atol or 0.0) + (rtol or 0.0) * e.abs()).double().mean().item() if elementwise else 0.0
    rel_error = float((a - e).norm() / e.norm()) if e.norm() > 0 else (0.0 if torch.equal(a, e) else float("inf"))
    norms = a.norm() * e.norm()
    if norms > 0:
        cosine: float | None = float(torch.dot(a.flatten(), e.flatten()) / norms)
    else:
        cosine = 1.0 if torch.equal(a, e) else 0.0
    reason = None
    if max_rel_error is not None and rel_error > max_rel_error:
        reason = (f"relative error |program - eager| / |eager| = {rel_error:.4g} > max_rel_error {max_rel_error:g} "
                  f"{_set_by(source, 'max_rel_error')}")
    elif fraction > 0:
        reason = (f"{fraction:.2%} of elements beyond atol={atol:g} + rtol={rtol:g}*|eager| "
                  f"{_set_by(source, 'atol', 'rtol')} (max abs error {max_abs:.3g}, max rel error {max_rel:.3g})")
    elif cosine is not None and cosine < min_cosine:
        reason = f"cosine similarity {cosine:.6f} < min_cosine {min_cosine:g} {_set_by(source, 'min_cosine')}"
    return base.model_copy(update={"max_abs": max_abs, "max_rel": max_rel, "mismatch_fraction": fraction,
                                   "cosine": cosine, "rel_error": rel_error, "passed": reason is None, "reason": reason})


def compare_outputs(
    actual: list[Any],
    expected: Any,
    spec: ValidationSpec,
    method: str = "forward",
    output_spec: str | None = None,
    precision: str | None = None,
    quantization: str | None = None,
) -> list[OutputComparison]:
    """Compare a program's flat outputs with eager's (possibly nested) result, matched by pytree path.

    ``output_spec`` is the output structure the program recorded; with it, outputs pair by path, so a
    structure that differs from eager's (a missing key, another order) is named instead of misread.
    """
    import torch

    want = flatten_with_paths(expected)
    got = program_outputs_with_paths(actual, output_spec)
    if got is None:
        if len(actual) != len(want):
            return [_failed("*", f"program returned {len(actual)} outputs, eager returned {len(want)}")]
        got = [(path, value) for (path, _), value in zip(want, actual, strict=False)]
    got_by_path = dict(got)
    results = []
    for path, value in want:
        if path not in got_by_path:
            results.append(_failed(path, f"the program has no output at {path}; its outputs are {[p for p, _ in got]}",
                                   expected=value))
            continue
        want_t = value if isinstance(value, torch.Tensor) else torch.tensor(value)
        got_value = got_by_path.pop(path)
        got_t = got_value if isinstance(got_value, torch.Tensor) else torch.tensor(got_value)
        limits = limits_for(spec, method, path, _dtype_name(want_t), precision, quantization)
        results.append(compare_tensor(path, got_t, want_t, limits, precision))
    results.extend(_failed(path, f"the program returns an output at {path} that eager does not", actual=value)
                   for path, value in got_by_path.items())
    return results
