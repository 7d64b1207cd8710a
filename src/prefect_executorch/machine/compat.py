"""Compat keys: where a bundle runs, and whether (and how well) it fits a machine.

Three shapes exist:

- CPU: ``cpu-<backend>-<arch>[-<quantization>]``, e.g. ``cpu-xnnpack-x86_64``: runs on any host of that
  arch; ``cpu-xnnpack-x86_64-int8da4wg32`` is a quantized build (its own key, so a float and a
  quantized bundle of one version never share a key or an alias by accident).
- GPU: ``<cuda channel>-<sm>[plus]-trt<major.minor>[plus]-<arch>[-int8|-fp8]``, e.g. ``cu132-sm90-trt11.1-x86_64``
  (an engine built for exactly SM 9.0 and TensorRT 11.1) or ``cu132-sm80plus-trt11.1plus-aarch64``
  (a hardware-compatible engine for Ampere and newer, version-compatible: TensorRT 11.1 or a newer
  11.x, never an older one nor another major); ``cu132-sm90-trt11.1-x86_64-fp8`` is a quantized build.
- CUDA backend: ``<cuda channel>-sm<NN>-cuda-<arch>``, e.g. ``cu130-sm90-cuda-x86_64``: ExecuTorch's CUDA
  backend, whose kernels carry SASS and PTX for the exporting GPU's arch-specific target (``sm_90a``),
  so exactly that SM; no TensorRT.

``fit`` answers for one key and one ``Toolchain``; a target that emits GPU keys builds them with
``gpu_compat`` so the two sides cannot drift apart.
"""

from __future__ import annotations

import re
from typing import Literal

from packaging.version import Version
from pydantic import BaseModel, Field

from prefect_executorch.errors import SpecError
from prefect_executorch.machine.toolchain import Toolchain
from prefect_executorch.machine.versions import parse_version
from prefect_executorch.spec.base import is_safe_name

_CPU_RE = re.compile(r"^cpu-(?P<backend>[a-z0-9]+)-(?P<arch>[a-z0-9_]+)(?:-(?P<quant>int8[a-z0-9]+))?$")
_GPU_RE = re.compile(
    r"^(?P<channel>cu\d{3})-sm(?P<sm>\d{2,3})(?P<plus>plus)?"
    r"-trt(?P<trt>\d+\.\d+)(?P<trt_plus>plus)?-(?P<arch>[a-z0-9_]+)(?:-(?P<quant>int8|fp8))?$"
)
_CUDA_RE = re.compile(r"^(?P<channel>cu\d{3})-sm(?P<sm>\d{2,3})-cuda-(?P<arch>[a-z0-9_]+)$")
_SM_RE = re.compile(r"^sm(\d{2,3})(plus)?$")


class Compat(BaseModel):
    """A parsed compat key."""

    key: str
    kind: Literal["cpu", "gpu"]
    arch: str
    backend: str | None = Field(None, description="CPU: xnnpack or portable; GPU: tensorrt or cuda.")
    quantization: str | None = None
    cuda_channel: str | None = None
    sm: int | None = None
    sm_or_newer: bool = False
    tensorrt: str | None = Field(None, description="TensorRT major.minor the engines were built with.")
    tensorrt_or_newer: bool = Field(False, description="Version-compatible engines: this TensorRT or a newer one of its major.")


class Fit(BaseModel):
    """Whether a compat key fits a machine; ``rank`` orders fitting keys (higher is more specific)."""

    ok: bool
    reason: str = ""
    rank: int = 0


def parse_compat(key: str) -> Compat:
    """Parse ``key`` or raise ``SpecError`` naming the two accepted shapes."""
    # A compat key is a segment of a bundle key, so it obeys that rule too: it also keeps out what the
    # regexes let through ("$" matches before a final newline, \d matches other scripts' digits).
    if is_safe_name(key) and (match := _CPU_RE.match(key)):
        return Compat(key=key, kind="cpu", backend=match["backend"], arch=match["arch"], quantization=match["quant"])
    if is_safe_name(key) and (match := _GPU_RE.match(key)):
        return Compat(
            key=key, kind="gpu", arch=match["arch"], cuda_channel=match["channel"], sm=int(match["sm"]),
            sm_or_newer=bool(match["plus"]), tensorrt=match["trt"], tensorrt_or_newer=bool(match["trt_plus"]),
            quantization=match["quant"], backend="tensorrt",
        )
    if is_safe_name(key) and (match := _CUDA_RE.match(key)):
        return Compat(key=key, kind="gpu", backend="cuda", arch=match["arch"], cuda_channel=match["channel"],
                      sm=int(match["sm"]))
    raise SpecError(
        f"compat: {key!r} is not a compat key; expected 'cpu-<backend>-<arch>' (cpu-xnnpack-x86_64; a quantized "
        "build adds its scheme: cpu-xnnpack-x86_64-int8da4wg32) or "
        "'<cuXYZ>-sm<NN>[plus]-trt<major.minor>[plus]-<arch>' (cu132-sm90-trt11.1-x86_64) or "
        "'<cuXYZ>-sm<NN>-cuda-<arch>' (cu130-sm90-cuda-x86_64)"
    )


def cpu_compat(backend: str, arch: str, quantization: str | None = None) -> str:
    """Build a CPU compat key; ``quantization`` (``int8da4wg32``) marks a quantized build."""
    return parse_compat(f"cpu-{backend}-{arch}" + (f"-{quantization}" if quantization else "")).key


def gpu_compat(cuda_channel: str | None, sm: str | None, arch: str, tensorrt: str | None, *, sm_or_newer: bool = False,
               tensorrt_or_newer: bool = False, quantization: str | None = None) -> str:
    """Build a GPU compat key from probe values (``sm90``, ``11.1.0.3``); ``quantization`` (``int8``, ``fp8``) marks a quantized build."""
    number = probed_sm(sm)
    parsed = parse_version(tensorrt)
    release = parsed.release if parsed else ()
    if not cuda_channel or number is None or not 10 <= number <= 999 or len(release) < 2:
        raise SpecError(f"compat: cannot build a GPU key from channel={cuda_channel!r}, sm={sm!r}, tensorrt={tensorrt!r}; "
                        "expected a channel like 'cu132', an SM like 'sm90' and a TensorRT version like '11.1.0'")
    key = (f"{cuda_channel}-sm{number}{'plus' if sm_or_newer else ''}-trt{release[0]}.{release[1]}"
           f"{'plus' if tensorrt_or_newer else ''}-{arch}" + (f"-{quantization}" if quantization else ""))
    return parse_compat(key).key  # the builder and the matcher agree on the shape


def cuda_compat(cuda_channel: str | None, sm: str | None, arch: str) -> str:
    """Build the compat key of a CUDA-backend program from probe values (``cu130``, ``sm90``)."""
    number = probed_sm(sm)
    if not cuda_channel or number is None or not 10 <= number <= 999:
        raise SpecError(f"compat: cannot build a CUDA key from channel={cuda_channel!r}, sm={sm!r}; expected a channel "
                        "like 'cu130' and an SM like 'sm90'")
    return parse_compat(f"{cuda_channel}-sm{number}-cuda-{arch}").key


def parse_sm(sm: str | None) -> tuple[int, bool] | None:
    """``sm90`` -> (90, False); ``sm80plus`` (that arch or newer) -> (80, True); None for anything else."""
    match = _SM_RE.match(sm or "")
    return (int(match.group(1)), bool(match.group(2))) if match else None


def sm_number(sm: str) -> int:
    """``sm90`` -> 90; ``sm80plus`` -> 80; ValueError for anything else."""
    parsed = parse_sm(sm)
    if parsed is None:
        raise ValueError(f"{sm!r} is not a GPU arch like 'sm90' or 'sm80plus'")
    return parsed[0]


def probed_sm(sm: str | None) -> int | None:
    """A probed arch (``sm90``; a probe never says ``plus``) as a number, None when absent or unreadable."""
    parsed = parse_sm(sm)
    return parsed[0] if parsed and not parsed[1] else None


def fit(key: str, toolchain: Toolchain) -> Fit:
    """Whether the bundle with compat ``key`` can run on the machine ``toolchain`` describes."""
    compat = parse_compat(key)
    if compat.arch != toolchain.arch:
        return Fit(ok=False, reason=f"built for {compat.arch}, this machine is {toolchain.arch}")
    if compat.kind == "cpu":
        # A delegate (XNNPACK) beats portable kernels for the same model and arch; a quantized build
        # runs too but is never picked over a float one unless asked for by its key.
        if compat.quantization:
            return Fit(ok=True, rank=0)
        return Fit(ok=True, rank=1 if compat.backend == "portable" else 2)
    if toolchain.cuda_channel != compat.cuda_channel:
        found = toolchain.cuda_channel or "no CUDA"
        return Fit(ok=False, reason=f"needs CUDA channel {compat.cuda_channel}, this machine has {found}")
    machine_sm = probed_sm(toolchain.sm)
    assert compat.sm is not None
    if machine_sm is None:
        return Fit(ok=False, reason="needs an NVIDIA GPU, this machine has none")
    if compat.sm_or_newer and machine_sm < compat.sm:
        return Fit(ok=False, reason=f"needs SM {compat.sm} or newer, this GPU is sm{machine_sm}")
    if not compat.sm_or_newer and machine_sm != compat.sm:
        return Fit(ok=False, reason=f"{'kernels' if compat.backend == 'cuda' else 'engine'} built for sm{compat.sm}, "
                                    f"this GPU is sm{machine_sm}")
    if compat.backend == "cuda":
        return Fit(ok=True, rank=20)
    # As on CPU, a quantized engine fits but ranks below every float one.
    rank = 0 if compat.quantization else 10 if compat.sm_or_newer else 20
    assert compat.tensorrt is not None
    built = Version(compat.tensorrt).release
    parsed = parse_version(toolchain.tensorrt)
    machine_trt = parsed.release[:2] if parsed else None
    if machine_trt is None:
        return Fit(ok=False, reason=f"engine needs TensorRT {compat.tensorrt}, this machine has none")
    if compat.tensorrt_or_newer:
        # Version-compatible engines load on the same or a later TensorRT of one major, never on an older one.
        if machine_trt[0] != built[0] or machine_trt < built:
            return Fit(ok=False, reason=f"engine needs TensorRT {compat.tensorrt} or a newer {built[0]}.x, this "
                                        f"machine has {toolchain.tensorrt}")
        return Fit(ok=True, rank=rank + 1)
    if machine_trt != built:
        return Fit(ok=False, reason=f"engine needs TensorRT {compat.tensorrt}, this machine has {toolchain.tensorrt}")
    return Fit(ok=True, rank=rank + 2)
