"""Export failures name their stage and the real cause (real exports in child processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefect_executorch.errors import ExportFailed
from prefect_executorch.export.exporter import export_program
from prefect_executorch.export.stages import run_lowering


def test_an_operator_without_a_kernel_is_named_at_export(make_spec, tmp_path: Path) -> None:
    spec = make_spec("sorts", methods={"forward": {"inputs": [{"name": "x", "shape": [2, 8]}]}}, target="portable")
    with pytest.raises(ExportFailed, match=r"stage runtime check: .*'portable' runtime has no kernel for "
                                           r"\(forward: aten::sort\.values\)"):
        export_program(spec, tmp_path / "out")
    assert not any((tmp_path / "out").iterdir())  # the failed export left nothing behind


def test_a_cache_object_in_the_outputs_is_blamed_on_the_outputs(make_spec, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    spec = make_spec("returns_cache", methods={"forward": {"inputs": [{"name": "x", "shape": [1, 2, 4, 8]}]}})
    with pytest.raises(ExportFailed, match=r"stage torch\.export \(outputs\): method 'forward' returns DynamicCache, "
                                           r"which a program cannot return .*\nreturn tensors only"):
        export_program(spec, tmp_path / "out")


def test_a_shape_the_model_cannot_take_fails_in_the_eager_stage(make_spec, tmp_path: Path) -> None:
    spec = make_spec("mlp", methods={"forward": {"inputs": [{"name": "x", "shape": [2, 7]}]}})
    with pytest.raises(ExportFailed, match=r"stage eager run: method 'forward' with inputs \(x: float32 \[2, 7\]\) "
                                           r"fails in eager PyTorch .*RuntimeError: mat1 and mat2 shapes"):
        export_program(spec, tmp_path / "out")


def test_a_branch_on_a_tensors_value_is_a_tracing_failure_naming_the_models_line(make_spec, tmp_path: Path) -> None:
    # torch's message says "Could not guard on data-dependent expression": the word "guard" is no input problem.
    spec = make_spec("branches_on_values", methods={"forward": {"inputs": [{"name": "x", "shape": [2, 3]}]}})
    with pytest.raises(ExportFailed) as info:
        export_program(spec, tmp_path / "out")
    message = str(info.value)
    assert message.startswith("stage torch.export (tracing): method 'forward' branches on a tensor's value at "
                              "models.py:") and "(if y.sum().item() > 0:" in message, message
    assert "torch.cond" in message and "methods.forward.inputs" not in message


@pytest.mark.parametrize("target", ["xnnpack", "portable"])
def test_an_operator_the_edge_dialect_refuses_is_named_with_its_dtypes_and_line(make_spec, target: str,
                                                                               tmp_path: Path) -> None:
    spec = make_spec("spectrum", methods={"forward": {"inputs": [{"name": "x", "shape": [2, 16]}]}}, target=target)
    with pytest.raises(ExportFailed) as info:
        export_program(spec, tmp_path / "out")
    message = str(info.value)
    assert f"stage lowering for target '{target}'" in message
    assert "refuses aten.abs.default with {'self': torch.complex64" in message
    assert "at models.py:" in message and "(return torch.fft.rfft(x).abs())" in message
    assert "try target 'portable'" not in message  # no target would take it


def test_a_program_planned_below_the_specs_bound_fails_at_export_naming_the_bound(make_spec, tmp_path: Path) -> None:
    # ExecuTorch 1.4.1 plans a Conv1d's dynamic batch 1..16 for at most 15: validation at the max shape then
    # failed with a bare 0x10 (NotSupported), after everything else had passed.
    spec = make_spec("conv1d", methods={"forward": {"inputs": [{"name": "x", "shape": [4, 4, 20],
                                                                  "dynamic": {0: {"min": 1, "max": 16}}}]}})
    with pytest.raises(ExportFailed) as info:
        export_program(spec, tmp_path / "out")
    message = str(info.value)
    assert message.startswith("stage memory planning:")
    assert "input 'x' is planned for at most [15, 4, 20], below the spec's largest shape [16, 4, 20]" in message
    assert "set methods.forward.inputs['x'].dynamic.0.max to 15" in message


def test_a_runtime_failure_carries_what_the_runtime_logged(make_spec, tmp_path: Path) -> None:
    import torch

    from prefect_executorch.errors import ValidationFailed
    from prefect_executorch.runtime.loaded_program import LoadedProgram

    spec = make_spec("mlp", methods={"forward": {"inputs": [{"name": "x", "shape": [4, 32],
                                                              "dynamic": {0: {"min": 1, "max": 8}}}]}})
    exported = export_program(spec, tmp_path / "out")
    program = LoadedProgram(exported.path / exported.program)
    with pytest.raises(ValidationFailed) as info:
        program.execute("forward", (torch.randn(9, 32),))  # past the planned bound; run() would refuse it first
    message = str(info.value)
    assert "NotSupported" in message
    assert "the runtime said: " in message and "Attempted to resize a bounded tensor" in message, message


def test_a_lowering_failure_that_lists_its_operators_names_them() -> None:
    """ExecuTorch 1.4.1's CUDA backend heads its list of kernels it lacks with one line; the build's one message
    named none of them (a Moonshine build on an H100)."""
    def lower() -> None:
        raise RuntimeError("Method text_decoder missing fallback kernels (2 total):\n  - aten::split_copy.Tensor\n"
                           "  - aten::unbind_copy.int\nPlease add them to the AOTI backend.")

    with pytest.raises(ExportFailed, match=r"failed: RuntimeError: Method text_decoder missing fallback kernels \(2 "
                                           r"total\): aten::split_copy\.Tensor, aten::unbind_copy\.int\ntorch\.export"):
        run_lowering(lower, "cuda")
