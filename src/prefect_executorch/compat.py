"""Compat keys: where a bundle runs, and whether (and how well) it fits a machine.

Two shapes exist:

- CPU: ``cpu-<backend>-<arch>[-<quantization>]``, e.g. ``cpu-xnnpack-x86_64``: runs on any host of that
  arch; ``cpu-xnnpack-x86_64-int8da4wg32`` is a quantized build (its own key, so a float and a
  quantized bundle of one version never share a key or an alias by accident).
- GPU: ``<cuda channel>-<sm>[-trt<version>|-trt-any]-<arch>``, e.g. ``cu132-sm90-trt11.1-x86_64``
  (an engine built for exactly SM 9.0 and TensorRT 11.1) or ``cu132-sm80plus-trt-any-aarch64``
  (a hardware-compatible engine for Ampere and newer, version-compatible across TensorRT).

``fit`` answers for one key and one ``Toolchain``; a target that emits GPU keys builds them with
``gpu_compat`` so the two sides cannot drift apart.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel

from prefect_executorch.errors import SpecError
from prefect_executorch.toolchain import Toolchain

_CPU_RE = re.compile(r"^cpu-(?P<backend>[a-z0-9]+)-(?P<arch>[a-z0-9_]+)(?:-(?P<quant>int8[a-z0-9]+))?$")
_GPU_RE = re.compile(
    r"^(?P<channel>cu\d{3})-sm(?P<sm>\d{2,3})(?P<plus>plus)?"
    r"(?:-trt(?:(?P<trt>\d+(?:\.\d+)*)|(?P<any>-any)))?-(?P<arch>[a-z0-9_]+)$"
)


class Compat(BaseModel):
    """A parsed compat key."""

    key: str
    kind: Literal["cpu", "gpu"]
    arch: str
    backend: str | None = None
    quantization: str | None = None
    cuda_channel: str | None = None
    sm: int | None = None
    sm_or_newer: bool = False
    tensorrt: str | None = None
    tensorrt_any: bool = False


class Fit(BaseModel):
    """Whether a compat key fits a machine; ``rank`` orders fitting keys (higher is more specific)."""

    ok: bool
    reason: str = ""
    rank: int = 0


def parse_compat(key: str) -> Compat:
    """Parse ``key`` or raise ``SpecError`` naming the two accepted shapes."""
    if match := _CPU_RE.match(key):
        return Compat(key=key, kind="cpu", backend=match["backend"], arch=match["arch"], quantization=match["quant"])
    if match := _GPU_RE.match(key):
        return Compat(
            key=key, kind="gpu", arch=match["arch"], cuda_channel=match["channel"], sm=int(match["sm"]),
            sm_or_newer=bool(match["plus"]), tensorrt=match["trt"], tensorrt_any=bool(match["any"]),
        )
    raise SpecError(
        f"compat: {key!r} is not a compat key; expected 'cpu-<backend>-<arch>' (cpu-xnnpack-x86_64; a quantized "
        "build adds its scheme: cpu-xnnpack-x86_64-int8da4wg32) or "
        "'<cuXYZ>-sm<NN>[plus][-trt<version>|-trt-any]-<arch>' (cu132-sm90-trt11.1-x86_64)"
    )


def cpu_compat(backend: str, arch: str, quantization: str | None = None) -> str:
    """Build a CPU compat key; ``quantization`` (``int8da4wg32``) marks a quantized build."""
    return parse_compat(f"cpu-{backend}-{arch}" + (f"-{quantization}" if quantization else "")).key


def gpu_compat(cuda_channel: str, sm: int, arch: str, *, sm_or_newer: bool = False,
               tensorrt: str | None = None, tensorrt_any: bool = False) -> str:
    """Build a GPU compat key; ``tensorrt`` is cut to major.minor, the part engines depend on."""
    key = f"{cuda_channel}-sm{sm}{'plus' if sm_or_newer else ''}"
    if tensorrt_any:
        key += "-trt-any"
    elif tensorrt:
        key += f"-trt{_major_minor(tensorrt)}"
    key = f"{key}-{arch}"
    parse_compat(key)  # the builder and the matcher agree on the shape
    return key


def _major_minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def _sm_number(sm: str | None) -> int | None:
    return int(sm[2:]) if sm and sm.startswith("sm") and sm[2:].isdigit() else None


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
    machine_sm = _sm_number(toolchain.sm)
    assert compat.sm is not None
    if machine_sm is None:
        return Fit(ok=False, reason="needs an NVIDIA GPU, this machine has none")
    if compat.sm_or_newer and machine_sm < compat.sm:
        return Fit(ok=False, reason=f"needs SM {compat.sm} or newer, this GPU is sm{machine_sm}")
    if not compat.sm_or_newer and machine_sm != compat.sm:
        return Fit(ok=False, reason=f"engine built for sm{compat.sm}, this GPU is sm{machine_sm}")
    rank = 10 if compat.sm_or_newer else 20
    if compat.tensorrt is not None:
        if toolchain.tensorrt is None or _major_minor(toolchain.tensorrt) != compat.tensorrt:
            found = toolchain.tensorrt or "none"
            return Fit(ok=False, reason=f"engine needs TensorRT {compat.tensorrt}, this machine has {found}")
        rank += 2
    elif compat.tensorrt_any:
        if toolchain.tensorrt is None:
            return Fit(ok=False, reason="needs TensorRT (any version), this machine has none")
        rank += 1
    return Fit(ok=True, rank=rank)
