"""Compare every output of a program call with eager PyTorch's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefect_executorch.report import OutputComparison
from prefect_executorch.spec import DEFAULT_MIN_COSINE, DEFAULT_TOLERANCES, ValidationSpec

if TYPE_CHECKING:
    import torch


def flatten_with_paths(value: Any) -> list[tuple[str, Any]]:
    """Leaves of a nested output with their paths (``[0]``, ``['logits']``), in export order."""
    from torch.utils._pytree import keystr, tree_flatten_with_path

    leaves, _ = tree_flatten_with_path(value)
    return [(keystr(path) or "[0]", leaf) for path, leaf in leaves]


def _dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def default_tolerances(dtype: str, precision: str | None = None) -> tuple[float, float, float]:
    """(atol, rtol, min_cosine) for ``dtype``, loosened to ``precision`` when the program computes in it."""
    names = [dtype] + ([precision] if precision else [])
    atol = max(DEFAULT_TOLERANCES.get(n, DEFAULT_TOLERANCES["float32"])[0] for n in names)
    rtol = max(DEFAULT_TOLERANCES.get(n, DEFAULT_TOLERANCES["float32"])[1] for n in names)
    return atol, rtol, min(DEFAULT_MIN_COSINE.get(n, 0.999) for n in names)


def compare_tensor(
    path: str, actual: torch.Tensor, expected: torch.Tensor, spec: ValidationSpec, precision: str | None = None
) -> OutputComparison:
    """Compare one program output with its eager counterpart.

    ``precision`` is the lower float type the program computes in (an FP16 engine fed FP32);
    its outputs may come back in that type and are held to its tolerances.
    """
    import torch

    dtype = _dtype_name(expected)
    base = dict(
        path=path,
        expected_shape=list(expected.shape),
        actual_shape=list(actual.shape),
        expected_dtype=dtype,
        actual_dtype=_dtype_name(actual),
    )
    if actual.shape != expected.shape:
        return OutputComparison(**base, passed=False, reason=f"shape {list(actual.shape)} != eager {list(expected.shape)}")
    lowered = precision is not None and expected.is_floating_point() and _dtype_name(actual) == precision
    if actual.dtype != expected.dtype and not lowered:
        return OutputComparison(**base, passed=False, reason=f"dtype {_dtype_name(actual)} != eager {dtype}")
    actual, expected = actual.detach().cpu(), expected.detach().cpu()
    if not expected.is_floating_point() and not expected.is_complex():
        unequal = actual != expected
        fraction = unequal.float().mean().item() if unequal.numel() else 0.0
        max_abs = (actual.long() - expected.long()).abs().max().item() if unequal.any() else 0
        return OutputComparison(
            **base,
            max_abs=float(max_abs),
            mismatch_fraction=fraction,
            passed=fraction == 0.0,
            reason=None if fraction == 0.0 else f"{fraction:.2%} of elements differ (exact match required for {dtype})",
        )
    default_atol, default_rtol, default_cosine = default_tolerances(dtype, precision)
    atol = default_atol if spec.atol is None else spec.atol
    rtol = default_rtol if spec.rtol is None else spec.rtol
    min_cosine = default_cosine if spec.min_cosine is None else spec.min_cosine
    a, e = actual.double(), expected.double()
    tolerances = dict(atol=atol, rtol=rtol, min_cosine=min_cosine)
    nan_mismatch = bool((a.isnan() != e.isnan()).any() or (a.isinf() != e.isinf()).any()
                        or (a.isinf() & e.isinf() & (a.sign() != e.sign())).any())
    if nan_mismatch:
        return OutputComparison(**base, **tolerances, max_abs=float("inf"), mismatch_fraction=1.0, passed=False,
                                reason="NaN/Inf positions differ from eager")
    finite = e.isfinite()
    a, e = a[finite], e[finite]
    if e.numel() == 0:
        return OutputComparison(**base, **tolerances, passed=True)
    diff = (a - e).abs()
    max_abs = diff.max().item()
    nonzero = e.abs() > 0
    max_rel = (diff[nonzero] / e.abs()[nonzero]).max().item() if nonzero.any() else 0.0
    fraction = (diff > atol + rtol * e.abs()).double().mean().item()
    norms = a.norm() * e.norm()
    if norms > 0:
        cosine: float | None = float(torch.dot(a.flatten(), e.flatten()) / norms)
    else:
        cosine = 1.0 if torch.equal(a, e) else 0.0
    reason = None
    if fraction > 0:
        reason = (f"{fraction:.2%} of elements beyond atol={atol:g} + rtol={rtol:g}*|eager| "
                  f"(max abs error {max_abs:.3g}, max rel error {max_rel:.3g})")
    elif cosine is not None and cosine < min_cosine:
        reason = f"cosine similarity {cosine:.6f} < min_cosine {min_cosine:g}"
    return OutputComparison(**base, **tolerances, max_abs=max_abs, max_rel=max_rel, mismatch_fraction=fraction,
                            cosine=cosine, passed=reason is None, reason=reason)


def compare_outputs(
    actual: list[Any], expected: Any, spec: ValidationSpec, precision: str | None = None
) -> list[OutputComparison]:
    """Compare a program's flat outputs with eager's (possibly nested) result, leaf by leaf."""
    import torch

    leaves = flatten_with_paths(expected)
    if len(actual) != len(leaves):
        return [OutputComparison(
            path="*", expected_shape=[], actual_shape=[], expected_dtype="", actual_dtype="", passed=False,
            reason=f"program returned {len(actual)} outputs, eager returned {len(leaves)}",
        )]
    results = []
    for (path, want), got in zip(leaves, actual):
        want_t = want if isinstance(want, torch.Tensor) else torch.tensor(want)
        got_t = got if isinstance(got, torch.Tensor) else torch.tensor(got)
        results.append(compare_tensor(path, got_t, want_t, spec, precision))
    return results
