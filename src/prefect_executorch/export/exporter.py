"""Export a model to an ExecuTorch program, in a child process, into a fresh directory."""

from __future__ import annotations

import resource
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from prefect_executorch.errors import ChildProcessFailed, ExportFailed
from prefect_executorch.export.quantize import QuantizationFacts
from prefect_executorch.export.stages import (
    check_kernels,
    check_planned_bounds,
    run_eager,
    run_lowering,
    run_torch_export,
)
from prefect_executorch.hashing import sha256_file
from prefect_executorch.isolation import run_isolated
from prefect_executorch.program import MethodFacts, read_program
from prefect_executorch.spec.buildspec import BuildSpec, check_input_budget
from prefect_executorch.targets import PROGRAM_FILE, get_target
from prefect_executorch.targets.base import Lowered, Target
from prefect_executorch.targets.delegation import DelegationFacts


class ExportRequest(BaseModel):
    """What the export child gets."""

    spec: BuildSpec
    out_dir: str


class ExportedProgramDir(BaseModel):
    """A finished export: its own directory, its files and what each method runs on."""

    out_dir: str
    program: str = PROGRAM_FILE
    data_files: list[str] = Field(default_factory=list, description="The .ptd files beside the .pte.")
    methods: dict[str, MethodFacts]
    delegation: dict[str, DelegationFacts] = Field(
        default_factory=dict, description="Operators delegated per method (empty when the target cannot tell)."
    )
    weights_sha256: str | None = None
    seconds: float
    peak_rss_mib: float | None = Field(None, description="Peak resident memory of the export child (MiB).")
    quantization: QuantizationFacts | None = Field(None, description="How the model was quantized (None: float).")
    warnings: list[str] = Field(default_factory=list, description="What lowering chose that the user should know.")

    @property
    def path(self) -> Path:
        """The export directory."""
        return Path(self.out_dir)

    def delegates(self) -> dict[str, list[str]]:
        """Delegate list per method."""
        return {name: facts.delegates for name, facts in self.methods.items()}


def export_in_child(request: dict[str, Any]) -> ExportedProgramDir:
    """Child side: load the model, export every method (an LLM: the runner's program; a speech model: its encoder and
    decoder), lower for the target, read the result."""
    started = time.monotonic()
    req = ExportRequest.model_validate(request)
    spec, out_dir = req.spec, Path(req.out_dir)
    target = get_target(spec.target_name)
    if spec.llm is not None:
        from prefect_executorch.export.causal_lm import lower_llm

        lowered, quantization = lower_llm(spec, target, out_dir)
    elif spec.asr is not None:
        from prefect_executorch.export.speech import lower_speech

        lowered, quantization = lower_speech(spec, target, out_dir)
    else:
        lowered, quantization = _lower_methods(spec, target, out_dir)
    pte = out_dir / PROGRAM_FILE
    if not pte.is_file():
        raise ExportFailed(f"target {target.name!r} wrote no {PROGRAM_FILE} into {out_dir}")
    data_files = sorted(p.name for p in out_dir.glob("*.ptd"))
    if spec.external_weights and not data_files:
        raise ExportFailed("external_weights is set but the export wrote no .ptd file")
    methods = read_program(pte)
    check_planned_bounds(methods, spec)
    check_kernels(methods, target.runtime_operators(), target.name)
    return ExportedProgramDir(
        out_dir=str(out_dir),
        data_files=data_files,
        methods=methods,
        delegation=lowered.delegation or {},
        weights_sha256=sha256_file(spec.weights) if spec.weights else None,
        seconds=time.monotonic() - started,
        peak_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        quantization=quantization,
        warnings=lowered.notes,
    )


def _lower_methods(spec: BuildSpec, target: Target, out_dir: Path) -> tuple[Lowered, QuantizationFacts | None]:
    """Run each method eagerly, export it and lower them all for ``target`` into ``out_dir``."""
    import torch

    from prefect_executorch.export.quantize import quantized_methods
    from prefect_executorch.spec.inputs import dynamic_shapes, example_inputs
    from prefect_executorch.spec.modelref import load_model

    model = load_model(spec)
    programs = {}
    with torch.no_grad():
        modules, quantization = quantized_methods(model, spec)
        # Every eager run before any export: a GPU target's export moves the (shared) model to the device.
        args = {name: example_inputs(method, seed=spec.validation.seed) for name, method in spec.methods.items()}
        outputs = {name: run_eager(modules[name], args[name], name, method) for name, method in spec.methods.items()}
        for name, method in spec.methods.items():
            programs[name] = run_torch_export(
                lambda: target.export_method(modules[name], args[name], dynamic_shapes(method), spec),  # noqa: B023 - called at once
                outputs[name], name, method)
        return run_lowering(lambda: target.lower(programs, spec, out_dir), target.name), quantization


def fresh_export_dir(spec: BuildSpec, output_root: Path) -> Path:
    """A new directory that no other export has used (the CUDA backend's .ptd name is fixed), hidden until done.

    A process stopped by its deadline has no time to remove it; hidden, it is never taken for an export.
    """
    output_root.mkdir(parents=True, exist_ok=True)
    path = output_root / f".{spec.name}-{spec.version}-{spec.target_name}-{uuid.uuid4().hex[:12]}.partial"
    path.mkdir()
    return path


def export_program(spec: BuildSpec, output_root: Path) -> ExportedProgramDir:
    """Export ``spec`` into a fresh directory under ``output_root``; on failure nothing is left behind.

    The child is bounded as the target says (``export_memory_limit_mib``, else the target's default).
    """
    target = get_target(spec.target_name)
    bounds = {"export_memory_limit_mib": target.memory_limit("export", spec.export_memory_limit_mib),
              "validation.memory_limit_mib": target.memory_limit("validate", spec.validation.memory_limit_mib)}
    # Validation follows every export: an input either child cannot hold is refused before the first one starts.
    for field, bound in bounds.items():
        check_input_budget(spec, bound.mib * 2**20 if bound else None, field)
    out_dir = fresh_export_dir(spec, output_root)
    try:
        exported = run_isolated(
            "export",
            ExportRequest(spec=spec, out_dir=str(out_dir)),
            ExportedProgramDir,
            timeout_s=spec.export_timeout_s,
            scratch_dir=output_root,
            memory_limit=bounds["export_memory_limit_mib"],
            what=f"export of {spec.name} {spec.version} for {spec.target_name}",
        )
    except ChildProcessFailed as exc:
        shutil.rmtree(out_dir, ignore_errors=True)
        raise ExportFailed(str(exc), child_output=exc.child_output) from exc
    except BaseException:
        shutil.rmtree(out_dir, ignore_errors=True)
        raise
    done = out_dir.with_name(out_dir.name[1:].removesuffix(".partial"))
    out_dir.rename(done)
    return exported.model_copy(update={"out_dir": str(done)})
