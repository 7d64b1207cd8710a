"""Real TensorRT builds: every option exported with torch-tensorrt, validated against eager on the GPU.

Run on a Linux CUDA 13 GPU worker after the install of docs/tensorrt.md (release or nightly stack):

    python -m pytest -m "cuda or tensorrt" -ra

Without an NVIDIA GPU and the TensorRT stack every test is skipped, with the probe's reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prefect_executorch.errors import ToolchainMismatch
from prefect_executorch.export.exporter import export_program
from prefect_executorch.machine.toolchain import Toolchain, probe
from prefect_executorch.machine.versions import older_than
from prefect_executorch.spec.buildspec import BuildSpec, parse_spec
from prefect_executorch.targets import get_target
from prefect_executorch.targets.tensorrt import DEVICE_OUTPUTS_EXECUTORCH
from prefect_executorch.validate.validator import require_passed, validate_program

from helpers import MODELS

pytestmark = pytest.mark.tensorrt
TARGET = get_target("tensorrt")
TRT, CUDA = "TensorRTBackend", "CudaBackend"


@pytest.fixture(scope="module")
def toolchain() -> Toolchain:
    """This worker's toolchain; skips the module where the GPU stack is absent (a broken one fails)."""
    found = probe()
    missing = [what for what, present in (
        ("NVIDIA GPU", found.cuda_available and found.gpus),
        ("torch-tensorrt", found.torch_tensorrt),
        ("TensorRT", found.tensorrt),
        ("executorch", found.executorch),
        ("torch-tensorrt-executorch-runtime", found.tensorrt_executorch_runtime),
    ) if not present]
    if missing:
        pytest.skip(f"missing here: {', '.join(missing)}; run on a CUDA 13 GPU worker (docs/tensorrt.md)")
    return found


def trt_spec(factory: str, methods: dict[str, Any], **target: Any) -> BuildSpec:
    return parse_spec({
        "name": factory.replace("_", "-"), "version": "1", "model": f"{MODELS}:{factory}",
        "methods": methods, "target": {"kind": "tensorrt", "min_block_size": 1, **target},
        "validation": {"samples": 2},
    })


def one_input(shape: list[int], **extra: Any) -> dict[str, Any]:
    return {"forward": {"inputs": [{"name": "x", "shape": shape, **extra}]}}


BATCH = {0: {"min": 1, "max": 8, "name": "batch"}}
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], dict[str, list[str]] | None]] = {
    # id: (factory, methods, target options, expected delegates per method or None to skip that check)
    "fp32": ("add_one", one_input([2, 3, 4, 4]), {}, {"forward": [TRT]}),
    "fp16": ("add_one", one_input([2, 3, 4, 4]), {"precision": "fp16"}, {"forward": [TRT]}),
    "bf16": ("convnet", one_input([2, 3, 8, 8]), {"precision": "bf16"}, None),
    "coalesced": ("erfinv_chain", one_input([64, 64]), {"coalesce_cuda": True}, {"forward": [TRT, CUDA, TRT]}),
    "device-resident": ("add_one", one_input([2, 3, 4, 4]), {"device_resident_io": True}, {"forward": [TRT]}),
    "encode-only": ("mlp", {"encode": {"inputs": [{"name": "x", "shape": [4, 32]}]}}, {}, {"encode": [TRT]}),
    "device-resident-inputs-only": ("add_one", one_input([2, 3, 4, 4]),
                                    {"device_resident_io": {"inputs": True, "outputs": False}}, {"forward": [TRT]}),
    "device-resident-coalesced": ("erfinv_chain", one_input([64, 64]),
                                  {"coalesce_cuda": True, "device_resident_io": True}, {"forward": [TRT, CUDA, TRT]}),
    "dynamic-batch": ("convnet", one_input([4, 3, 8, 8], dynamic=BATCH), {}, None),
    "two-methods": ("mlp", {"forward": {"inputs": [{"name": "x", "shape": [4, 32], "dynamic": BATCH}]},
                            "encode": {"inputs": [{"name": "x", "shape": [4, 32]}]}}, {}, None),
    "two-methods-coalesced": ("mlp", {"forward": {"inputs": [{"name": "x", "shape": [4, 32]}]},
                                      "encode": {"inputs": [{"name": "x", "shape": [4, 32]}]}},
                              {"coalesce_cuda": True, "device_resident_io": True}, None),
    "portable-engines": ("add_one", one_input([2, 3, 4, 4]),
                         {"hardware_compatible": True, "version_compatible": True}, {"forward": [TRT]}),
}


def build_and_validate(spec: BuildSpec, toolchain: Toolchain, tmp_path: Path) -> tuple[Any, Any]:
    TARGET.check(spec, toolchain)
    export = export_program(spec, tmp_path)
    report = validate_program(spec, export.path, export.data_files, scratch_dir=tmp_path)
    require_passed(report)
    return export, report


@pytest.mark.parametrize("case", sorted(CASES))
def test_option_builds_validates_and_runs(case: str, toolchain: Toolchain, tmp_path: Path) -> None:
    factory, methods, target, delegates = CASES[case]
    spec = trt_spec(factory, methods, **target)
    io = spec.target.device_resident_io  # type: ignore[union-attr]
    if io is not None and io.outputs and older_than(toolchain.executorch, DEVICE_OUTPUTS_EXECUTORCH):
        # Python cannot take device-resident outputs on this stack: refused before any export.
        with pytest.raises(ToolchainMismatch, match="Python cannot receive device-resident outputs"):
            TARGET.check(spec, toolchain)
        return
    export, report = build_and_validate(spec, toolchain, tmp_path)
    assert set(report.delegates) == set(methods)
    assert all(TRT in found for found in report.delegates.values()), report.delegates
    if delegates is not None:
        assert report.delegates == delegates
    if any(i.dynamic for m in spec.methods.values() for i in m.inputs):
        assert {c.shape_label for c in report.cases} == {"min", "opt", "max"}


def test_cuda_part_with_weights_writes_and_loads_its_ptd(toolchain: Toolchain, tmp_path: Path) -> None:
    spec = trt_spec("weighted_mm", one_input([64, 64]), coalesce_cuda=True,
                    compile_options={"torch_executed_ops": ["torch.ops.aten.mm.default"]})
    export, report = build_and_validate(spec, toolchain, tmp_path)
    assert export.data_files == ["aoti_cuda_blob.ptd"]
    assert (export.path / "aoti_cuda_blob.ptd").stat().st_size > 0
    assert CUDA in report.delegates["forward"] and report.used_data_file


def test_cuda_graphs_build_or_refusal_names_the_build(toolchain: Toolchain, tmp_path: Path) -> None:
    spec = trt_spec("add_one", one_input([2, 3, 4, 4]), cuda_graphs=True)
    if toolchain.capabilities.get("cuda_graphs"):
        build_and_validate(spec, toolchain, tmp_path)
    else:
        with pytest.raises(ToolchainMismatch, match="newer than the 2026-10-06 nightly"):
            TARGET.check(spec, toolchain)


def test_flow_publishes_a_device_resident_bundle_with_its_hints(
    toolchain: Toolchain, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    from prefect_executorch.artifacts.publishing import verify_bundle_dir
    from prefect_executorch.artifacts.store import LocalStore
    from prefect_executorch.flows.build import build_bundle

    request.getfixturevalue("prefect_harness")  # after the toolchain check: a skip must not start Prefect

    spec = trt_spec("erfinv_chain", one_input([64, 64]), coalesce_cuda=True,
                    device_resident_io={"inputs": True, "outputs": False})
    store = LocalStore(tmp_path / "store")
    ref = build_bundle(spec, store=str(store.root), output=str(tmp_path / "out"))
    assert ref.key.compat == TARGET.compat(spec, toolchain)
    manifest = verify_bundle_dir(store.root / ref.key.prefix)
    assert manifest.delegates() == {"forward": [TRT, CUDA, TRT]}
    assert manifest.runtime_hints["wants_cuda_tensors"] is True
    assert manifest.runtime_hints["delegate_runtime_version"] == toolchain.tensorrt_executorch_runtime
    assert manifest.toolchain["torch_tensorrt"] == toolchain.torch_tensorrt
    assert manifest.runtime_hints["stack"] in ("release", "nightly")
    facts = manifest.delegation()["forward"]
    assert facts.total_ops > 0 and facts.fraction == 1.0  # TensorRT and the CUDA backend took every operator
