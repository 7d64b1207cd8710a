"""A bundle's own test cases (``model.bpte``: inputs and the outputs its validation saw) run again on this machine,
in a child process, each output held to the tolerance validation passed it at."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from prefect_executorch.errors import ChildProcessFailed, ValidationFailed
from prefect_executorch.isolation import StartMethod, run_isolated
from prefect_executorch.machine.runtime_extension import runtime_extension
from prefect_executorch.runtime.loaded_program import describe_runtime_error
from prefect_executorch.scratch import scratch_dir as owned_scratch_dir
from prefect_executorch.targets import get_target

if TYPE_CHECKING:
    import torch

    from prefect_executorch.settings import BundledSettings


BUNDLED_FILE = "model.bpte"


#: Targets whose bundled cases are built and checked. Not TensorRT: no TensorRT program has ever run here, and on
#: ExecuTorch 1.4 a device-resident output cannot even be read back from Python.
BUNDLED_TARGETS = ("xnnpack", "portable", "cuda")


class BundledMethod(BaseModel):
    """The cases of one method in the ``.bpte``, in order, and the tolerances they are checked at."""

    cases: list[str] = Field(description="Case labels, e.g. 'min[0]', 'samples_file[2]', by index in the .bpte.")
    atol: float | None = Field(None, description="Loosest absolute tolerance validation held this method's outputs "
                               "to; None: no element-wise check (a quantized build's gates are the two below).")
    rtol: float | None = Field(None, description="Loosest relative tolerance, likewise.")
    min_cosine: float | None = Field(None, description="Lowest cosine floor validation held the outputs to.")
    max_rel_error: float | None = Field(None, description="Loosest |program - eager| / |eager| allowed (quantized builds).")

    @property
    def elementwise(self) -> bool:
        """Whether the cases are held element-wise (what ExecuTorch's own bundled verifier checks)."""
        return self.atol is not None or self.rtol is not None


class BundledFacts(BaseModel):
    """What the manifest records about the bundled test cases."""

    file: str | None = Field(default=None, description="The .bpte file, or None when it was skipped.")
    methods: dict[str, BundledMethod] = Field(default_factory=dict)
    skipped: str | None = Field(default=None, description="Why the bundle has no .bpte.")


class BundledCaseResult(BaseModel):
    """One bundled case run by ExecuTorch."""

    method: str
    index: int
    label: str
    error: str | None = None


class BundledCheck(BaseModel):
    """Every bundled case of a bundle, run on this machine."""

    results: list[BundledCaseResult]

    @property
    def failures(self) -> list[BundledCaseResult]:
        """The cases that did not reproduce their expected outputs."""
        return [result for result in self.results if result.error is not None]


class VerifyBundledRequest(BaseModel):
    """What the checking child gets."""

    bundle_dir: str
    target: str
    data_files: list[str] = Field(default_factory=list)
    methods: dict[str, BundledMethod]
    runtime_hints: dict[str, Any] = Field(default_factory=dict, description="The bundle's runtime hints (its manifest's).")


def bundled_settings() -> BundledSettings:
    # Imported here, not at the top: the validating child imports this module, and Prefect's import
    # (which the settings need) would cost every spawned child seconds.
    from prefect_executorch.settings import BundledSettings, read_settings

    return read_settings(BundledSettings)


def bundled_tensors(values: list[Any]) -> list[torch.Tensor]:
    """The tensors of a case's inputs or expected outputs, as the ``.bpte`` schema holds them."""
    import torch
    from executorch.devtools.bundled_program.schema import Tensor
    from executorch.exir.tensor import get_scalar_type

    tensors = []
    for value in values:
        if not isinstance(value.val, Tensor):
            raise ValidationFailed(f"{BUNDLED_FILE} holds a {type(value.val).__name__}; only tensor cases are bundled")
        dtype = get_scalar_type(value.val.scalar_type)
        data = bytearray(value.val.data)
        tensors.append(torch.frombuffer(data, dtype=dtype).reshape(value.val.sizes) if data
                       else torch.empty(value.val.sizes, dtype=dtype))
    return tensors


def _check_case(module: Any, suites: dict[str, Any], name: str, index: int, method: BundledMethod) -> None:
    """One case run by a module ExecuTorch loaded from the ``.bpte``, held to the method's recorded limits.

    Element-wise by the verifier's rule ``|out - expected| <= atol + rtol * |expected|``; a quantized build
    by its cosine floor and relative error against the float model's outputs.
    """
    import torch

    case = suites[name].test_cases[index]
    outputs = module.run_method(name, bundled_tensors(case.inputs))
    expected = bundled_tensors(case.expected_outputs)
    if len(outputs) != len(expected):
        raise ValidationFailed(f"{len(outputs)} outputs, {len(expected)} expected")
    for position, (got, want) in enumerate(zip(outputs, expected, strict=False)):
        if got.shape != want.shape or got.dtype != want.dtype:
            raise ValidationFailed(f"output {position} is {got.dtype} {list(got.shape)}, expected {want.dtype} {list(want.shape)}")
        atol, rtol = method.atol or 0.0, method.rtol or 0.0
        if method.elementwise and not torch.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
            worst = float((got.double() - want.double()).abs().max())
            raise ValidationFailed(f"output {position} mismatched: max abs error {worst:.3g} beyond atol={atol:g} "
                                   f"+ rtol={rtol:g}*|expected|")
        a, e = got.double().flatten(), want.double().flatten()
        norms = float(a.norm() * e.norm())
        cosine = float(torch.dot(a, e)) / norms if norms else float(torch.equal(a, e))
        if method.min_cosine is not None and cosine < method.min_cosine:
            raise ValidationFailed(f"output {position}: cosine similarity {cosine:.6f} < {method.min_cosine:g}")
        rel = float((a - e).norm() / e.norm()) if e.norm() > 0 else float(not torch.equal(a, e))
        if method.max_rel_error is not None and rel > method.max_rel_error:
            raise ValidationFailed(f"output {position}: relative error {rel:.4g} > {method.max_rel_error:g}")


def verify_bundled_in_child(request: dict[str, Any]) -> BundledCheck:
    """Child side: load the ``.bpte`` (with the ``.ptd``) and check every case at the recorded tolerances."""
    import torch  # noqa: F401 - loads libtorch, which the runtime extension links against

    req = VerifyBundledRequest.model_validate(request)
    get_target(req.target).runtime_setup(req.runtime_hints)
    portable_lib = runtime_extension()

    bundle = Path(req.bundle_dir)
    # Both buffers must outlive the loaded program: the runtime keeps pointers into them.
    buffer = (bundle / BUNDLED_FILE).read_bytes()
    data = (bundle / req.data_files[0]).read_bytes() if req.data_files else None
    # ExecuTorch's bundled verifier cannot take a .ptd (1.4.1 loads the program without its data map and crashes),
    # and on a CUDA-delegated program it breaks the CUDA context ("cudaMemcpy D2H failed: an illegal memory
    # access"): such programs run their cases through a module loaded with the data map instead.
    # Limits the verifier cannot express (a quantized build's cosine floor) are checked the same way.
    through_module = (data is not None or get_target(req.target).device == "cuda"
                      or not all(method.elementwise for method in req.methods.values()))
    try:
        program = portable_lib._load_bundled_program_from_buffer(buffer)
        module = (portable_lib._load_for_executorch_from_bundled_program(program, data_map_buffer=data)
                  if through_module else None)
    except RuntimeError as exc:
        raise ValidationFailed(f"ExecuTorch could not load {BUNDLED_FILE}: {describe_runtime_error(exc)}") from None
    suites: dict[str, Any] = {}
    if module is not None:
        from executorch.devtools.bundled_program.serialize import deserialize_from_flatbuffer_to_bundled_program

        # A program with external weights is small, so its flatbuffer is cheap to decode whole (a CUDA program
        # carries its compiled kernels, a few MB).
        suites = {s.method_name: s for s in deserialize_from_flatbuffer_to_bundled_program(buffer).method_test_suites}
    results = []
    for name, method in req.methods.items():
        for index, label in enumerate(method.cases):
            error = None
            try:
                if module is None:
                    program.verify_result_with_bundled_expected_output(name, index, method.rtol or 0.0, method.atol or 0.0)
                else:
                    _check_case(module, suites, name, index, method)
            except (RuntimeError, ValidationFailed) as exc:
                error = describe_runtime_error(exc) if isinstance(exc, RuntimeError) else str(exc)
            results.append(BundledCaseResult(method=name, index=index, label=label, error=error))
    return BundledCheck(results=results)


@contextlib.contextmanager
def _child_scratch(parent: Path | None) -> Iterator[Path]:
    """A fresh folder for the checking child: in ``parent`` when given, else an owned scratch folder (scratch.py)."""
    if parent is None:
        with owned_scratch_dir("bundled") as owned:
            yield owned
        return
    with tempfile.TemporaryDirectory(prefix="bundled-", dir=parent) as folder:
        yield Path(folder)


def verify_bundled(bundle_dir: Path, target: str, data_files: list[str], methods: dict[str, BundledMethod],
                   *, scratch_dir: Path | None = None, settings: BundledSettings | None = None,
                   shown_as: Path | None = None, start: StartMethod | None = None,
                   runtime_hints: dict[str, Any] | None = None) -> BundledCheck:
    """Run every case of ``bundle_dir``'s ``.bpte`` in a child process (``start``: see ``run_isolated``), its runtime
    set up as ``runtime_hints`` say; a crash of the runtime fails it."""
    request = VerifyBundledRequest(bundle_dir=str(bundle_dir), target=target, data_files=data_files, methods=methods,
                                   runtime_hints=runtime_hints or {})
    with _child_scratch(scratch_dir) as scratch:
        try:
            return run_isolated("verify-bundled", request, BundledCheck,
                                timeout_s=(settings or bundled_settings()).bundled_timeout_s, scratch_dir=scratch,
                                what=f"the bundled cases of {shown_as or bundle_dir}", start=start)
        except ChildProcessFailed as exc:
            raise ValidationFailed(f"{exc}; the bundled program did not run on this machine",
                                   child_output=exc.child_output) from exc


def require_bundled_passed(check: BundledCheck, where: Path) -> None:
    """Raise ``ValidationFailed`` naming the method, case and error of every case that failed."""
    failed = check.failures
    if failed:
        listed = "; ".join(f"method {r.method!r} case {r.index} ({r.label}): {r.error}" for r in failed[:5])
        raise ValidationFailed(
            f"{len(failed)} of {len(check.results)} bundled cases of {where / BUNDLED_FILE} failed on this machine: "
            f"{listed}; the program does not reproduce its validated outputs here: do not deploy it on this machine")


def run_bundled_cases(bundle_dir: Path, target: str, data_files: list[str], facts: BundledFacts | None,
                      *, scratch_dir: Path | None = None, shown_as: Path | None = None,
                      start: StartMethod | None = None, runtime_hints: dict[str, Any] | None = None) -> BundledCheck:
    """Run a bundle's own cases on this machine; ``ValidationFailed`` if it has none or one fails.

    ``shown_as`` is the folder the user knows (a pull checks its download before moving it there). A one-shot
    command passes ``start="spawn"``: its one child imports the runtime only, not the forkserver's export stack.
    """
    where = shown_as or bundle_dir
    if facts is None or facts.file is None:
        why = facts.skipped if facts else "it was published before bundles carried their test cases"
        raise ValidationFailed(f"{where} has no {BUNDLED_FILE} to run ({why}); nothing was verified: "
                               "revalidate it against the model with `prefect-executorch validate` instead")
    check = verify_bundled(bundle_dir, target, data_files, facts.methods, scratch_dir=scratch_dir, shown_as=where,
                           start=start, runtime_hints=runtime_hints)
    require_bundled_passed(check, where)
    return check

