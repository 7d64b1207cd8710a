"""Load and run an ExecuTorch program, with errors that name the input at fault."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_executorch.errors import ToolchainMismatch, ValidationFailed
from prefect_executorch.machine.runtime_extension import backend_install_hint, runtime_extension
from prefect_executorch.program import MethodFacts, read_program

if TYPE_CHECKING:
    import torch

    from prefect_executorch.spec.methods import InputSpec

_ERROR_CODE = re.compile(r"error:\s*0x:?([0-9a-fA-F]+)")
#: ExecuTorch's runtime error codes (runtime/core/error.h) that a user can act on.
ERROR_NAMES = {
    0x2: "InvalidState", 0x10: "NotSupported", 0x12: "InvalidArgument", 0x14: "OperatorMissing",
    0x20: "NotFound: a backend or a named datum (.ptd) is missing", 0x21: "MemoryAllocationFailed",
    0x22: "AccessFailed", 0x23: "InvalidProgram", 0x24: "InvalidExternalData",
    0x30: "DelegateInvalidCompatibility", 0x31: "DelegateMemoryAllocationFailed",
}


def describe_runtime_error(exc: Exception) -> str:
    """ExecuTorch's ``... error: 0x20`` with the code's name, so the message says what kind of failure it was."""
    match = _ERROR_CODE.search(str(exc))
    if not match:
        return str(exc)
    code = int(match.group(1), 16)
    return f"{exc} [ExecuTorch error 0x{code:x}: {ERROR_NAMES.get(code, 'see runtime/core/error.h')}]"


def _describe(tensor: torch.Tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')} {list(tensor.shape)}"


#: ExecuTorch's LLM ops (custom SDPA, KV-cache update): kernels that its custom-ops library registers when loaded.
CUSTOM_OPS_NAMESPACE = "llama::"


def register_custom_op_kernels() -> None:
    """Register ExecuTorch's LLM custom-op kernels in this process's runtime (before a program that calls them loads)."""
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401 - its library registers the kernels


class LoadedProgram:
    """A program loaded by the ExecuTorch runtime, with its facts for input checks."""

    def __init__(self, pte: Path, data: Path | None = None, channel: str | None = None) -> None:
        portable_lib = runtime_extension()
        self.facts: dict[str, MethodFacts] = read_program(pte)
        self.path = pte
        delegates = {d for facts in self.facts.values() for d in facts.delegates}
        self.missing_backends = sorted(delegates - set(portable_lib._get_registered_backend_names()))
        if self.missing_backends:
            # Loading would succeed and every call fail with a bare 0x20: say what to install now.
            raise ToolchainMismatch(f"cannot run {pte.name}: " + self._install_hints(channel))
        if any(op.startswith(CUSTOM_OPS_NAMESPACE) for facts in self.facts.values() for op in facts.operators):
            register_custom_op_kernels()
        try:
            self._module = portable_lib._load_for_executorch(str(pte), str(data) if data else None)
        except RuntimeError as exc:
            raise ValidationFailed(f"ExecuTorch could not load {self.path.name}: {describe_runtime_error(exc)}") from None

    def _install_hints(self, channel: str | None) -> str:
        if channel is None:
            from prefect_executorch.machine.hostprobe import local_cuda_channel

            channel = local_cuda_channel()
        return "; ".join(backend_install_hint(backend, channel) for backend in self.missing_backends)

    def check_inputs(self, method: str, inputs: tuple[torch.Tensor, ...], specs: list[InputSpec] | None = None) -> None:
        """Refuse inputs that do not fit the method's declared inputs, naming the one at fault."""
        if method not in self.facts:
            raise ValidationFailed(f"program has no method {method!r}; it has {sorted(self.facts)}")
        declared = self.facts[method].inputs
        if len(inputs) != len(declared):
            raise ValidationFailed(f"method {method!r} takes {len(declared)} inputs, got {len(inputs)}")
        for index, (tensor, want) in enumerate(zip(inputs, declared, strict=False)):
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
                    (size <= bound) if want.dynamic else (size == bound) for size, bound in zip(tensor.shape, want.sizes, strict=False)
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
        logged = _stderr_size()
        try:
            return list(self._module.run_method(method, inputs))
        except RuntimeError as exc:
            shapes = ", ".join(_describe(t) for t in inputs)
            said = runtime_log_since(logged)
            reason = f"; the runtime said: {'; '.join(said)}" if said else ""
            raise ValidationFailed(f"method {method!r} failed on inputs ({shapes}): {describe_runtime_error(exc)}"
                                   f"{reason}") from None


#: A line of ExecuTorch's runtime log: ``[tensor_impl.cpp:156] Attempted to resize a bounded tensor ...``.
_RUNTIME_LOG_LINE = re.compile(r"^\[[\w./-]+\.\w+:\d+\] (.+)$")


def _stderr_size() -> int | None:
    """Bytes in this process's stderr when it is a file (a child's log, isolation.py), else None."""
    try:
        info = os.fstat(2)
    except OSError:
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None


def runtime_log_since(offset: int | None, limit: int = 5) -> list[str]:
    """What ExecuTorch's runtime logged to stderr after ``offset``: the reason behind a bare error code."""
    if offset is None:
        return []
    try:
        with open("/proc/self/fd/2", "rb") as log:
            log.seek(offset)
            text = log.read(65536).decode(errors="replace")
    except OSError:
        return []
    lines = [match[1].strip() for line in text.splitlines() if (match := _RUNTIME_LOG_LINE.match(line.strip()))]
    return lines[-limit:]
