#!/usr/bin/env bash
# The GPU record of this tree, one step per call (each fits a 10-minute run), into $OUT (default ./gpu-record):
#
#   gpu_record.sh tests     the cuda and tensorrt tests (junit-cuda.xml, pytest-cuda.log)
#   gpu_record.sh latency   benchmarks/gpu_latency.py (gpu_latency.json, gpu_latency.log); extra args passed on
#   gpu_record.sh llm       benchmarks/llm.py --target cuda (llm_cuda.json, llm_cuda.log); extra args passed on
#   gpu_record.sh gemm      benchmarks/inductor_gemm.py: the MLP under torch's Inductor per GEMM backend (inductor_gemm.json);
#                           torch alone: runs on a bare GPU host without the staged stack
#
# Every step first writes stack-<step>.txt: the tree ($PREFECT_EXECUTORCH_BENCHMARK_TREE where the sender of a copy
# without .git set it, else `git describe --dirty`), the GPU, its driver and the stack's versions.
# Run on a GPU worker with the stack (docs/cuda.md; an offline host: ../shared/gpu/README.md).
set -uo pipefail
cd "$(dirname "$0")/.."
step=${1:?usage: gpu_record.sh tests|latency|llm|gemm [args]}; shift
out=${OUT:-gpu-record}
mkdir -p "$out"
# A copy sent without its .git names its tree in the environment; inside a checkout, git says it.
tree=${PREFECT_EXECUTORCH_BENCHMARK_TREE:-$(git describe --always --dirty --abbrev=40 2>/dev/null || echo unknown)}
export PREFECT_EXECUTORCH_BENCHMARK_TREE=$tree PREFECT_EXECUTORCH_BENCHMARK_RESULTS=$out PYTHONUNBUFFERED=1
{
  echo "tree: $tree"
  echo "started: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | sed 's/^/gpu: /'
  python3 -c 'from importlib.metadata import PackageNotFoundError, version
def installed(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"  # a bare host runs the gemm step on its own torch
print("stack:", *(f"{name} {installed(name)}" for name in ("torch", "executorch", "triton", "torchao",
      "torch-tensorrt-executorch-runtime", "transformers", "prefect-executorch")))'
} > "$out/stack-$step.txt" 2>&1
case $step in
  tests)
    # -v: each result named as it lands, so a run stopped by its time limit (no junit then) still says what passed.
    python3 -m pytest -m "cuda or tensorrt" -n 8 -ra -v --junitxml "$out/junit-cuda.xml" "$@" 2>&1 | tee "$out/pytest-cuda.log";;
  latency)
    python3 benchmarks/gpu_latency.py "$@" 2>&1 | tee "$out/gpu_latency.log";;
  llm)
    python3 benchmarks/llm.py --target cuda "$@" 2>&1 | tee "$out/llm_cuda.log";;
  gemm)
    python3 benchmarks/inductor_gemm.py "$@" 2>&1 | tee "$out/inductor_gemm.log";;
  *) echo "gpu_record.sh: unknown step $step (tests, latency, llm, gemm)" >&2; exit 2;;
esac
status=${PIPESTATUS[0]}
echo "finished: $(date -u +%FT%TZ) rc=$status" >> "$out/stack-$step.txt"
exit "$status"
