"""What a cuBLAS GEMM in ExecuTorch's CUDA backend would give the fp32 MLP at batch 1, measured with torch's Inductor.

ExecuTorch's ``CudaBackend`` compiles with AOTInductor and fixes ``max_autotune_gemm_backends`` to ``TRITON``: its
runtime ships no ``aoti_torch_cuda_mm_out``/``addmm_out`` shim, so Inductor may not pick cuBLAS (``ATEN``). Torch's own
runtime has cuBLAS. This benchmark compiles the GPU benchmark's MLP (benchmarks/gpu_models.py, static batch 1) with
``torch.compile`` and the backend's compile options, once per GEMM backend setting (``TRITON``: what the backend
allows; ``ATEN``; ``ATEN,TRITON``: autotuned among both), and times each beside eager CUDA, inputs on the GPU and TF32
off on every side, in interleaved rounds. (Torch's own AOTInductor packages would be closer still, but loading one
crashed the staged GPU stack, 2026-12-06: ``aoti_load_package`` segfaults there even at default settings.) The
``TRITON`` build reproducing the program's gap shows the gap is the kernels; the others show what the change in
ExecuTorch would be worth.

``--precision tf32`` asks instead what ``target.precision: tf32`` gives the same GEMMs: every build compiles with TF32
allowed (Inductor's templates then use TF32 tensor cores), beside eager CUDA with TF32 on (``eager_cuda``: what a user
who accepts TF32 runs) and eager in exact float32 (``eager_cuda_fp32``, TF32 off, the default); the RESULT line then
judges the ``TRITON`` build (what the backend allows) against eager with TF32. It imports neither prefect-executorch
nor ExecuTorch, so a bare GPU host's torch runs it.

Each side's GPU time per call (``torch.profiler``, 50 calls) is recorded beside its p50: a compiled module's Python
wrapper costs more host time than the program's call, so the kernels' GPU time is what the GEMM lever changes. The last
line is ``RESULT inductor_gemm ratio=<GPU time of the best build allowed ATEN over eager's> goal=<=1.0``: whether a cuBLAS
shim would bring the MLP's fp32 kernels to eager's (with ``--precision tf32``, the ``TRITON`` build's over eager's).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import interleaved, report, spread  # noqa: E402
from _cuda_timing import timed, top_events  # noqa: E402
from gpu_models import mlp  # noqa: E402

#: The options ExecuTorch 1.4.1's CudaBackend.get_aoti_compile_options sets that bear on the kernels (its packaging
#: options, which decide where weights live, do not change what runs); no CUDA graphs (the program has none).
BACKEND_OPTIONS: dict[str, Any] = {"loop_ordering_after_fusion": False, "emulate_precision_casts": True,
                                   "max_autotune": True, "max_autotune_conv_backends": "TRITON", "triton.cudagraphs": False}
GEMM_BACKENDS = ("TRITON", "ATEN", "ATEN,TRITON")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32"])
    args = parser.parse_args()

    import torch

    tf32 = args.precision == "tf32"

    def allowing(on: bool, call: Callable[[], Any]) -> Callable[[], Any]:
        """``call`` with TF32 set as its side computes, through the legacy flags: eager reads them at each call, and
        the matmul flag also sets the fp32_precision Inductor's GEMM templates read when a side compiles (at its first
        call); each compiled side then runs as it was compiled. (The MLP has no convolution.)"""

        def run() -> Any:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
            return call()

        return run

    model = mlp().cuda()
    example = (torch.randn(1, 64, 512, generator=torch.Generator().manual_seed(1)).cuda(),)
    figures: dict[str, Any] = {"options": BACKEND_OPTIONS, "precision": args.precision, "torch": torch.__version__}
    sides: dict[str, Any] = {"eager_cuda": allowing(tf32, lambda: model(*example))}
    if tf32:
        sides["eager_cuda_fp32"] = allowing(False, lambda: model(*example))
    with torch.no_grad():
        expected = allowing(False, lambda: model(*example))()
        for backends in GEMM_BACKENDS:
            started = time.perf_counter()
            compiled = torch.compile(model, options={**BACKEND_OPTIONS, "max_autotune_gemm_backends": backends})
            side = allowing(tf32, lambda run=compiled: run(*example))
            figures[f"max_abs_error_{backends}"] = float((side() - expected).abs().max())  # against exact float32
            figures[f"compile_s_{backends}"] = round(time.perf_counter() - started, 1)
            sides[f"inductor_{backends}"] = side
        # A compiled module's host wrapper costs more than a program's call: the kernels' GPU time is what compares.
        gpu_us = {side: round(sum(row["device_us_per_call"] for row in top_events(call, 50)["device_us_per_call"]), 1)
                  for side, call in sides.items()}
        per_round = interleaved({side: lambda _, call=call: timed(call, args.calls, warmup=10)
                                 for side, call in sides.items()}, args.rounds)
    for side, values in per_round.items():
        figures[side] = {"p50": spread([p50 for p50, _ in values], 4, "ms"),
                         "p95_median_ms": round(statistics.median(p95 for _, p95 in values), 4)}

    figures["gpu_us_per_call"] = gpu_us
    with_aten = min((f"inductor_{backends}" for backends in GEMM_BACKENDS if "ATEN" in backends), key=gpu_us.__getitem__)
    figures["gpu_time_triton_only_over_eager"] = round(gpu_us["inductor_TRITON"] / gpu_us["eager_cuda"], 3)
    figures["best_with_aten"] = with_aten
    figures["gpu"] = torch.cuda.get_device_name(0)
    judged = "inductor_TRITON" if tf32 else with_aten
    return 0 if report("inductor_gemm", gpu_us[judged] / gpu_us["eager_cuda"], "<=1.0", figures) else 1


if __name__ == "__main__":
    sys.exit(main())
