"""Real TensorRT int8 and fp8 bundles: ModelOpt PTQ, torch-tensorrt engines, validated against float eager on the GPU.

Run on a Linux CUDA 13 GPU worker with the TensorRT stack of docs/tensorrt.md and ``pip install
"nvidia-modelopt>=0.47"``:

    python -m pytest -m tensorrt tests/targets/test_tensorrt_quant_gpu.py -ra

Without an NVIDIA GPU and that stack every test is skipped, with the probe's reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_tensorrt_gpu import TARGET, TRT, build_and_validate, one_input, toolchain  # noqa: F401 - shared fixture

from prefect_executorch.errors import ToolchainMismatch
from prefect_executorch.machine.toolchain import Toolchain
from prefect_executorch.spec.buildspec import BuildSpec, parse_spec
from prefect_executorch.spec.schemes import DEFAULT_GATES
from prefect_executorch.targets.tensorrt_quant import FP8_MIN_SM, MODELOPT_INSTALL

from helpers import MODELS

pytestmark = pytest.mark.tensorrt


def usable(scheme: str, toolchain: Toolchain) -> None:  # noqa: F811 - a value, not the fixture
    """Skip where this worker cannot build ``scheme``, after checking that the target refuses it for that reason."""
    if toolchain.modelopt is None:
        with pytest.raises(ToolchainMismatch, match="nvidia-modelopt is not installed"):
            TARGET.check(quantized(scheme), toolchain)
        pytest.skip(f"nvidia-modelopt is not installed here: {MODELOPT_INSTALL}")
    sm = toolchain.sm or "sm0"
    if scheme == "fp8" and int(sm[2:]) < FP8_MIN_SM:
        with pytest.raises(ToolchainMismatch, match=f"FP8 layers on sm{FP8_MIN_SM}"):
            TARGET.check(quantized(scheme), toolchain)
        pytest.skip(f"fp8 needs sm{FP8_MIN_SM} or newer, this GPU is {sm}")


def quantized(scheme: str, calibration: dict[str, object] | None = None) -> BuildSpec:
    return parse_spec({
        "name": f"two-linears-{scheme}", "version": "1", "model": f"{MODELS.parent / 'quantized_models.py'}:two_linears",
        "methods": one_input([4, 64]), "target": {"kind": "tensorrt", "min_block_size": 1},
        "validation": {"samples": 4},
        "quantization": {"scheme": scheme, **({"calibration": calibration} if calibration else {})},
    })


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_a_quantized_engine_builds_and_passes_its_gate_with_both_errors_reported(
    scheme: str, toolchain: Toolchain, tmp_path: Path  # noqa: F811
) -> None:
    usable(scheme, toolchain)
    spec = quantized(scheme)
    assert TARGET.compat(spec, toolchain).endswith(f"-{scheme}")
    export, report = build_and_validate(spec, toolchain, tmp_path)
    assert report.delegates == {"forward": [TRT]}  # every quantize op went into the engine
    assert export.quantization is not None and export.quantization.scheme == scheme
    assert export.quantization.modelopt == toolchain.modelopt and export.quantization.calibration_samples == 4
    for case in report.cases:
        assert case.quantization_error and case.lowering_error
        # The default quantized gate (a cosine floor, a relative error) held every output.
        assert all(o.passed and o.min_cosine == DEFAULT_GATES[scheme].min_cosine for o in case.outputs)


def test_an_int8_engine_calibrates_on_a_dataset_and_publishes_a_quantized_bundle(
    toolchain: Toolchain, tmp_path: Path, request: pytest.FixtureRequest  # noqa: F811
) -> None:
    from prefect_executorch.artifacts.publishing import verify_bundle_dir
    from prefect_executorch.artifacts.store import LocalStore
    from prefect_executorch.flows.build import build_bundle

    usable("int8", toolchain)
    request.getfixturevalue("prefect_harness")  # after the toolchain check: a skip must not start Prefect
    dataset = f"{MODELS.parent / 'quantized_models.py'}:calibration"
    spec = quantized("int8", calibration={"dataset": dataset})
    store = LocalStore(tmp_path / "store")
    ref = build_bundle(spec, store=str(store.root), output=str(tmp_path / "out"))
    assert ref.key.compat == TARGET.compat(spec, toolchain) and ref.key.compat.endswith("-int8")
    manifest = verify_bundle_dir(store.root / ref.key.prefix)
    assert manifest.quantization is not None and manifest.quantization.scheme == "int8"
    assert manifest.quantization.calibration == f"dataset {dataset} (5 samples)"
