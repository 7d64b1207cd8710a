"""Load and run an ExecuTorch program, with errors that name the input at fault."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_executorch.errors import ValidationFailed
from prefect_executorch.program import MethodFacts, read_program

if TYPE_CHECKING:
    import torch

    from prefect_executorch.spec import InputSpec

#: Delegates ExecuTorch's CPU wheel registers itself; any other needs its runtime package.
BUILTIN_BACKENDS = {"XnnpackBackend"}
BACKEND_PACKAGES = {
    "TensorRTBackend": "torch-tensorrt-executorch-runtime (on the same CUDA channel as torch)",
    "CudaBackend": "a CUDA build of executorch (on the same CUDA channel as torch)",
}


def _describe(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')} {list(tensor.shape)}"


class LoadedProgram:
    """A program loaded by the ExecuTorch runtime, with its facts for input checks."""

    def __init__(self, pte: Path, data: Path | None = None) -> None:
        import torch  # noqa: F401 - loads libtorch, which the runtime extension links against

        # The extension itself: its ``portable_lib`` wrapper imports all of executorch.exir (7-10 s).
        from executorch.extension.pybindings._portable_lib import _load_for_executorch

        self.facts: dict[str, MethodFacts] = read_program(pte)
        self.path = pte
        try:
            self._module = _load_for_executorch(str(pte), str(data) if data else None)
        except RuntimeError as exc:
            raise ValidationFailed(self._load_hint(exc)) from None

    def _load_hint(self, exc: Exception) -> str:
        delegates = {d for facts in self.facts.values() for d in facts.delegates}
        missing = sorted(delegates - BUILTIN_BACKENDS)
        hint = "".join(
            f"\n  bundle needs {backend}: install {BACKEND_PACKAGES.get(backend, 'the package that registers it')}"
            for backend in missing
        )
        return f"ExecuTorch could not load {self.path.name}: {exc}{hint}"

    def check_inputs(self, method: str, inputs: tuple[torch.Tensor, ...], specs: list[InputSpec] | None = None) -> None:
        """Refuse inputs that do not fit the method's declared inputs, naming the one at fault."""
        if method not in self.facts:
            raise ValidationFailed(f"program has no method {method!r}; it has {sorted(self.facts)}")
        declared = self.facts[method].inputs
        if len(inputs) != len(declared):
            raise ValidationFailed(f"method {method!r} takes {len(declared)} inputs, got {len(inputs)}")
        for index, (tensor, want) in enumerate(zip(inputs, declared)):
            if want is None:
                continue
            spec = specs[index] if specs and index < len(specs) else None
            name = spec.name if spec else f"#{index}"
            got_dtype = str(tensor.dtype).removeprefix("torch.")
            # XNNPACK does not check static dims and returns garbage for a wrong size: check here.
            if spec is not None:
                expected = spec.describe_shape()
                fits = spec.accepts_shape(tuple(tensor.shape))
            else:
                expected = f"{'at most ' if want.dynamic else ''}{want.sizes}"
                fits = tensor.dim() == len(want.sizes) and all(
                    (size <= bound) if want.dynamic else (size == bound) for size, bound in zip(tensor.shape, want.sizes)
                )
            if got_dtype != want.dtype or not fits:
                raise ValidationFailed(
                    f"method {method!r} input {name!r}: expected {want.dtype} {expected}, "
                    f"got {_describe(tensor)}; fix the input or the spec's methods.{method}.inputs"
                )

    def run(self, method: str, inputs: tuple[torch.Tensor, ...], specs: list[InputSpec] | None = None) -> list[Any]:
        """Execute ``method`` on ``inputs`` and return its flat outputs."""
        self.check_inputs(method, inputs, specs)
        return self.execute(method, inputs)

    def execute(self, method: str, inputs: tuple[torch.Tensor, ...]) -> list[Any]:
        """Execute ``method`` on inputs already checked (``run`` checks them first)."""
        try:
            return list(self._module.run_method(method, inputs))
        except RuntimeError as exc:
            shapes = ", ".join(_describe(t) for t in inputs)
            raise ValidationFailed(f"method {method!r} failed on inputs ({shapes}): {exc}") from None
