"""Export stage by stage, each failure an ``ExportFailed`` that names its stage and the real cause.

Stages: the eager run on the generated inputs, ``torch.export`` (input problems told from output
problems), lowering (to_edge, decompositions, partitioning, serialization), memory planning (each
dynamic input is planned up to the spec's largest shape) and the runtime check that every operator
left to ExecuTorch's kernels has a kernel in the target's runtime.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from prefect_executorch.errors import ExportFailed
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.fields import FLOAT_DTYPES
from prefect_executorch.spec.methods import MethodSpec

if TYPE_CHECKING:
    from prefect_executorch.program import MethodFacts

T = TypeVar("T")
#: How much of a library's exception text goes into the one-message summary (all of it is in the child's log).
SUMMARY_CHARS = 400
#: Words in torch.export's errors about the inputs' shapes, dtypes or dynamic dims.
_INPUT_WORDS = ("dynamic_shapes", "constraint", "Constraints violated", "specialized", "Dim(", "guard", "input")


def summary(exc: BaseException) -> str:
    """``Type: first line`` of an exception, cut short: the whole text is in the child's log (isolation.py). A first
    line that heads a list (the CUDA backend's "missing fallback kernels (1 total):" then "  - aten::…") takes
    the list's items."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    items = [line.strip()[2:] for line in lines[1:] if line.strip().startswith("- ")] if text.endswith(":") else []
    if items:
        text += " " + ", ".join(items)
    if len(text) > SUMMARY_CHARS:
        text = text[:SUMMARY_CHARS] + "..."
    return f"{type(exc).__name__}: {text}"


#: Where library code lives: a traceback frame outside these is the model's own.
_LIBRARIES = ("torch", "executorch", "prefect_executorch", "transformers", "torchao")


def model_line(exc: BaseException) -> str | None:
    """``model.py:8 (if y.sum().item() > 0:)``: the innermost frame of ``exc`` outside torch and the libraries."""
    import importlib.util
    import traceback

    roots = []
    for name in _LIBRARIES:
        found = importlib.util.find_spec(name)
        roots += [str(Path(p)) for p in (found.submodule_search_locations or [])] if found else []
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(("<", *roots)) and "/lib/python" not in f.filename]
    if not frames:
        return None
    frame = frames[-1]
    return f"{Path(frame.filename).name}:{frame.lineno}" + (f" ({frame.line.strip()})" if frame.line else "")


def describe_inputs(method: MethodSpec) -> str:
    """``x: float32 [2, 3]; ids: int64 [1, 8] in [0, 10)``: the inputs as generated."""
    parts = []
    for spec in method.inputs:
        text = f"{spec.name}: {spec.dtype} {spec.shape}"
        if spec.dtype not in FLOAT_DTYPES and spec.dtype != "bool":
            low = int(spec.low if spec.low is not None else 0)
            high = int(spec.high if spec.high is not None else 10)
            text += f" in [{low}, {high})"
        parts.append(text)
    return ", ".join(parts)


def _has_int_inputs(method: MethodSpec) -> bool:
    return any(spec.dtype not in FLOAT_DTYPES and spec.dtype != "bool" for spec in method.inputs)


def run_eager(module: Any, args: tuple[Any, ...], name: str, method: MethodSpec) -> Any:
    """Run the eager method once on the generated inputs; a failure there is the inputs' or the model's, not the export's."""
    try:
        return module(*args)
    except Exception as exc:  # any model code can raise anything
        ints = (
            f"integer inputs are drawn from [low, high), default [0, 10): set methods.{name}.inputs[].low/high to "
            "what the model accepts (for token ids, high = the vocabulary size); " if _has_int_inputs(method) else ""
        )
        raise ExportFailed(
            f"stage eager run: method {name!r} with inputs ({describe_inputs(method)}) fails in eager PyTorch on the "
            f"generated inputs: {summary(exc)}\n{ints}check that methods.{name}.inputs (shapes, dtypes) match what "
            "the model takes"
        ) from exc


def _odd_outputs(outputs: Any) -> list[str]:
    """Type names of output leaves that are not tensors or plain scalars (a ``DynamicCache``, a dataclass...)."""
    import torch
    from torch.utils._pytree import tree_flatten

    leaves, _ = tree_flatten(outputs)
    return sorted({type(leaf).__name__ for leaf in leaves
                   if not isinstance(leaf, (torch.Tensor, int, float, bool, type(None)))})


def run_torch_export(export: Callable[[], T], eager_outputs: Any, name: str, method: MethodSpec) -> T:
    """``torch.export`` one method; a failure is blamed on the outputs, the inputs, or the model's code."""
    try:
        return export()
    except Exception as exc:  # torch.export raises many types
        odd = _odd_outputs(eager_outputs)
        if odd:
            raise ExportFailed(
                f"stage torch.export (outputs): method {name!r} returns {', '.join(odd)}, which a program cannot "
                f"return ({summary(exc)})\nreturn tensors only: e.g. use_cache=False / return_dict=False, or wrap "
                "the model in a module whose forward returns the tensors you need"
            ) from exc
        text = str(exc)
        if "data-dependent" in text or any("DataDependent" in cls.__name__ for cls in type(exc).__mro__):
            where = model_line(exc)
            at = f" at {where}" if where else ""
            raise ExportFailed(
                f"stage torch.export (tracing): method {name!r} branches on a tensor's value{at}, which torch.export "
                f"cannot trace ({summary(exc)})\nwrite the branch with torch.cond (both sides are traced), or take the "
                "value out of the model: a constant, or an input the spec declares"
            ) from exc
        if any(word in text for word in _INPUT_WORDS):
            raise ExportFailed(
                f"stage torch.export (inputs): method {name!r} with inputs ({describe_inputs(method)}) failed: "
                f"{summary(exc)}\ncheck that methods.{name}.inputs (shapes, dtypes, dynamic dims and their min/max) "
                "match what the model takes"
            ) from exc
        raise ExportFailed(
            f"stage torch.export (tracing): method {name!r} with inputs ({describe_inputs(method)}) failed: "
            f"{summary(exc)}\nthe model's code is not traceable as written; check that methods.{name}.inputs "
            "match what the model takes, and see the torch.export docs for the construct named"
        ) from exc


#: ExecuTorch's edge verifier: the operator with the dtypes it was given, and the model line it came from.
_EDGE_OPERATOR = re.compile(r"Operator: <EdgeOpOverload: ([\w.]+)>.*?with args: (\{[^}\n]*\})")
_EDGE_STACK = re.compile(r'stack trace: File "([^"]+)", line (\d+)[^\n]*\n\s*([^\n]+)')


def _edge_violation(exc: BaseException) -> str | None:
    """``aten.abs.default with {'self': torch.complex64, …} at models.py:295 (…)`` from the edge verifier's error."""
    text = str(exc)
    operator = _EDGE_OPERATOR.search(text)
    if operator is None:
        return None
    stack = _EDGE_STACK.search(text)
    where = f" at {Path(stack[1]).name}:{stack[2]} ({stack[3].strip()})" if stack else ""
    return f"{operator[1]} with {operator[2]}{where}"


def run_lowering(lower: Callable[[], T], target: str) -> T:
    """Lower the exported methods for ``target``; a failure names the lowering stage, the target and the operator."""
    try:
        return lower()
    except ExportFailed:
        raise
    except Exception as exc:  # edge conversion, decompositions and partitioners raise many types
        stage = f"stage lowering for target {target!r} (to_edge, decompositions, partitioning, serialization) failed"
        violation = _edge_violation(exc)
        if violation is not None:
            # The edge dialect's own check: every target converts to it, so no other target would take the model.
            raise ExportFailed(
                f"{stage}: ExecuTorch's edge dialect refuses {violation} ({type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[0]})\ntorch.export succeeded; no target takes this operator with these "
                "dtypes: rewrite the construct named (complex tensors, for one, have no ExecuTorch kernels)"
            ) from exc
        other = "try target 'portable', or " if target != "portable" else ""
        raise ExportFailed(
            f"{stage}: {summary(exc)}\ntorch.export succeeded; an operator or pattern is not supported by this "
            f"target's lowering: {other}rewrite the construct named"
        ) from exc


def check_planned_bounds(methods: dict[str, MethodFacts], spec: BuildSpec) -> None:
    """Refuse a program whose memory plan holds an input below the spec's largest shape: it could not run it."""
    short = []
    for name, method in spec.methods.items():
        facts = methods.get(name)
        for declared, wanted in zip(facts.inputs if facts else [], method.inputs, strict=False):
            if declared is None or not declared.dynamic:
                continue
            largest = [hi for _, hi in wanted.bounds()]
            dims = [d for d, (planned, hi) in enumerate(zip(declared.sizes, largest, strict=False)) if planned < hi]
            if dims:
                fix = ", ".join(f"methods.{name}.inputs[{wanted.name!r}].dynamic.{d}.max to {declared.sizes[d]}" for d in dims)
                short.append(f"method {name!r} input {wanted.name!r} is planned for at most {declared.sizes}, below the "
                             f"spec's largest shape {largest}; set {fix}")
    if short:
        raise ExportFailed(
            "stage memory planning: ExecuTorch planned an input's memory below the spec's dynamic bound, so the "
            f"program cannot run the spec's largest shape (it would fail with NotSupported): {'; '.join(short)}\n"
            "the plan follows torch.export's range analysis of the model, which can narrow a bound the spec declares"
        )


def check_kernels(methods: dict[str, MethodFacts], runtime_operators: set[str] | None, target: str) -> None:
    """Refuse a program that calls an operator the target's runtime has no kernel for."""
    if runtime_operators is None:
        return
    missing = {name: sorted({op for op in facts.operators if op not in runtime_operators})
               for name, facts in methods.items()}
    missing = {name: ops for name, ops in missing.items() if ops}
    if missing:
        listed = "; ".join(f"{name}: {', '.join(ops)}" for name, ops in missing.items())
        raise ExportFailed(
            f"stage runtime check: the program calls operators that the {target!r} runtime has no kernel for "
            f"({listed}); the program would fail to load (OperatorMissing)\nrewrite the model to avoid them, or "
            "build an ExecuTorch runtime with those kernels"
        )
