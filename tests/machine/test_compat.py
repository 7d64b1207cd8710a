"""Compat keys: parsing, building and fitting a machine (no S3, no torch)."""

from __future__ import annotations

import pytest

from prefect_executorch.errors import SpecError
from prefect_executorch.machine.compat import cpu_compat, fit, gpu_compat, parse_compat, parse_sm, sm_number
from prefect_executorch.machine.toolchain import GpuInfo, Toolchain

CPU_HOST = Toolchain(python="3.11", os="Linux", arch="x86_64", torch="2.13.0+cpu")
H100 = Toolchain(python="3.11", os="Linux", arch="x86_64", torch="2.14.0+cu132", cuda_channel="cu132",
                 tensorrt="11.1.0.5", gpus=[GpuInfo(index=0, name="H100", sm="sm90", total_memory_mib=81559)])
A10G_ARM = H100.model_copy(update={"arch": "aarch64", "tensorrt": "11.3.0",
                                   "gpus": [GpuInfo(index=0, name="A10G", sm="sm86", total_memory_mib=22000)]})


def test_keys_round_trip_through_the_builders() -> None:
    assert gpu_compat("cu132", "sm90", "x86_64", "11.1.0.5") == "cu132-sm90-trt11.1-x86_64"
    assert gpu_compat("cu132", "sm80", "aarch64", "11.1.0", sm_or_newer=True, tensorrt_or_newer=True) == \
        "cu132-sm80plus-trt11.1plus-aarch64"
    assert cpu_compat("xnnpack", "x86_64") == "cpu-xnnpack-x86_64"
    parsed = parse_compat("cu132-sm80plus-trt11.1plus-aarch64")
    assert (parsed.cuda_channel, parsed.sm, parsed.sm_or_newer, parsed.tensorrt, parsed.tensorrt_or_newer,
            parsed.arch) == ("cu132", 80, True, "11.1", True, "aarch64")


@pytest.mark.parametrize(("sm", "tensorrt"), [("sm9", "11.1"), ("90", "11.1"), ("sm90", "eleven"), ("sm90", "11"),
                                              (None, "11.1"), ("sm90", None)])
def test_a_gpu_key_is_never_built_from_unusable_probe_values(sm: str, tensorrt: str) -> None:
    with pytest.raises(SpecError, match="cannot build a GPU key"):
        gpu_compat("cu132", sm, "x86_64", tensorrt)


# A GPU key names its TensorRT: "-trt" alone, "trt-any" and keys without TensorRT are refused.
@pytest.mark.parametrize("bad", ["", "gpu", "cpu-xnnpack", "cu132-sm9-x86_64", "cu132-sm90-trt-x86_64", "CPU-x-y",
                                 "cu132-sm80plus-trt-any-x86_64", "cu130-sm100-x86_64", "cu132-sm90-trt11-x86_64"])
def test_bad_keys_name_the_expected_shapes(bad: str) -> None:
    with pytest.raises(SpecError, match="expected 'cpu-<backend>-<arch>'"):
        parse_compat(bad)


@pytest.mark.parametrize(("key", "machine", "ok", "reason"), [
    ("cpu-xnnpack-x86_64", CPU_HOST, True, ""),
    ("cpu-xnnpack-aarch64", CPU_HOST, False, "built for aarch64, this machine is x86_64"),
    ("cpu-portable-x86_64", H100, True, ""),
    ("cu132-sm90-trt11.1-x86_64", CPU_HOST, False, "needs CUDA channel cu132, this machine has no CUDA"),
    ("cu132-sm90-trt11.1-x86_64", H100, True, ""),
    ("cu134-sm90-trt11.1-x86_64", H100, False, "needs CUDA channel cu134, this machine has cu132"),
    ("cu132-sm100-trt11.1-x86_64", H100, False, "engine built for sm100, this GPU is sm90"),
    ("cu132-sm90-trt11.3-x86_64", H100, False, "engine needs TensorRT 11.3, this machine has 11.1.0.5"),
    ("cu132-sm80plus-trt11.1plus-aarch64", A10G_ARM, True, ""),
    ("cu132-sm80plus-trt11.3plus-aarch64", A10G_ARM, True, ""),
    # Version-compatible engines: the same or a newer TensorRT of one major, never an older one or the next major.
    ("cu132-sm80plus-trt11.4plus-aarch64", A10G_ARM, False,
     "engine needs TensorRT 11.4 or a newer 11.x, this machine has 11.3.0"),
    ("cu132-sm80plus-trt10.13plus-aarch64", A10G_ARM, False,
     "engine needs TensorRT 10.13 or a newer 10.x, this machine has 11.3.0"),
    ("cu132-sm90plus-trt11.1plus-aarch64", A10G_ARM, False, "needs SM 90 or newer, this GPU is sm86"),
    ("cu132-sm90-trt11.1-x86_64", H100.model_copy(update={"tensorrt": None}), False,
     "engine needs TensorRT 11.1, this machine has none"),
])
def test_fit(key: str, machine: Toolchain, ok: bool, reason: str) -> None:
    verdict = fit(key, machine)
    assert (verdict.ok, verdict.reason) == (ok, reason)


def test_specific_beats_portable() -> None:
    assert fit("cu132-sm90-trt11.1-x86_64", H100).rank > fit("cu132-sm80plus-trt11.1plus-x86_64", H100).rank
    assert fit("cu132-sm80plus-trt11.1-x86_64", H100).rank > fit("cu132-sm80plus-trt11.1plus-x86_64", H100).rank
    assert fit("cpu-xnnpack-x86_64", CPU_HOST).rank > fit("cpu-portable-x86_64", CPU_HOST).rank


def test_one_sm_parser_reads_probes_placements_and_queues() -> None:
    assert parse_sm("sm90") == (90, False) and parse_sm("sm100") == (100, False)
    assert parse_sm("sm80plus") == (80, True)
    for bad in ("90", "sm9", "sm1000", "sm90+", "SM90", "", None):
        assert parse_sm(bad) is None, bad
    assert sm_number("sm80plus") == 80
    with pytest.raises(ValueError, match="'sm9' is not a GPU arch like 'sm90' or 'sm80plus'"):
        sm_number("sm9")
