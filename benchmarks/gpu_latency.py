"""GPU latency of the ``cuda`` target: the exported program beside eager CUDA and ``torch.compile``, one run.

Three models (the demo ConvNet, a LayerNorm/GELU MLP, a tiny BERT from a config: benchmarks/gpu_models.py)
are built with target ``cuda`` through the product (export and validation in their children, the
backend's default autotuning), then loaded into this process with the runtime that has CudaBackend and
timed at batch 1 and at the largest batch against the same model in eager CUDA and compiled with
``torch.compile``, TF32 off on every side (as validation compares them; ``--precision tf32`` below). The
sides are timed in interleaved rounds (``--rounds``, each ``--calls`` warm calls), every call synchronised; a
side's p50 is the median of its rounds' p50s (min and max beside it), p95 likewise.

The program runs through ExecuTorch's Python runtime, whose boundary is the host: inputs go in as CPU
tensors, the backend copies them to the GPU and the outputs back. So "eager CUDA" (inputs and outputs on
the GPU) is beside "eager + host copies" (the same boundary as the program); their difference is what that
boundary costs eager, and the program pays it on every call.

CudaBackend allocates each call's tensors from the default CUDA memory pool and synchronises each call;
the cuda target's runtime setup (validation's, and this process's) lets that pool keep its memory, as a
serving process should. "program, pool trimmed" is the same program at the driver's default release
threshold (0: memory handed back at every synchronisation), so the difference is what that setting costs.
``--profile-calls`` program calls at batch 1 run under ``torch.profiler`` for each pool setting, and the
events that took most GPU and host time are recorded: where a call's time goes.

``--static`` builds one program per batch size, each exported (and so autotuned) at the size it serves, instead of
one program with a dynamic batch autotuned at the largest. ``--inductor KEY=VALUE`` (repeatable) sets
``target.inductor``: one lever of the compile at a time (``coordinate_descent_tuning=true``,
``max_autotune_gemm_search_space=EXHAUSTIVE``), its export time beside its latency. ``--cuda-graphs`` (with
``--static``) builds with ``target.cuda_graphs`` and times the same program replayed as a CUDA graph, in a child
process of its own (the option is the process's, read when a method loads; the child first checks that the runtime
captured the method and that replayed outputs equal direct ones), beside eager compiled with
``mode="reduce-overhead"`` (torch.compile's CUDA graphs).

``--precision bf16`` (or fp16) builds with ``target.precision`` set; eager and ``torch.compile`` then compute
in that type behind float32 inputs and outputs as the program does (the target's own wrapper). ``--precision tf32``
builds with TF32 matmuls and convolutions; eager and ``torch.compile`` then run with TF32 on too
(``torch.set_float32_matmul_precision("high")``, cuDNN's ``allow_tf32``): what a user who accepts TF32 runs instead.

The last line is ``RESULT gpu_latency ratio=<worst program p50 / baseline p50 at batch 1> goal=<=1.0``, the
baseline being the faster of eager CUDA and ``torch.compile`` (default mode): what a user would otherwise deploy.
With ``--cuda-graphs`` the replayed program is judged instead, against the fastest of those and
``torch.compile(mode="reduce-overhead")``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).parent))
from _common import interleaved, report, spread  # noqa: E402
from _cuda_timing import timed, top_events  # noqa: E402

from prefect_executorch.export.exporter import export_program  # noqa: E402
from prefect_executorch.spec.buildspec import BuildSpec, parse_spec  # noqa: E402
from prefect_executorch.targets.gpu import set_cuda_pool_release_threshold  # noqa: E402
from prefect_executorch.validate.validator import require_passed, validate_program  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
LARGEST = 8
T = TypeVar("T")
#: name -> (model reference, the input: shape at batch 1 with the batch as dim 0, dtype, high for ids)
MODELS: dict[str, tuple[str, list[int], str, int | None]] = {
    "convnet": (f"{ROOT}/examples/convnet/model.py:build", [1, 3, 32, 32], "float32", None),
    "mlp": (f"{HERE}/gpu_models.py:mlp", [1, 64, 512], "float32", None),
    "bert": (f"{HERE}/gpu_models.py:tiny_bert", [1, 32], "int64", 1000),
}


def spec_for(name: str, precision: str = "fp32", batch: int | None = None, inductor: dict[str, Any] | None = None,
             cuda_graphs: bool = False) -> BuildSpec:
    """The build of ``name``: a static ``batch`` when given, else a dynamic batch 1..LARGEST exported at LARGEST."""
    model, shape, dtype, high = MODELS[name]
    source: dict[str, Any] = {"name": "x", "shape": [batch or LARGEST, *shape[1:]], "dtype": dtype}
    if batch is None:
        source["dynamic"] = {0: {"min": 1, "max": LARGEST}}
    return parse_spec({"name": f"gpu-{name}", "version": "1", "model": model,
                       "target": {"kind": "cuda", "precision": precision, "inductor": inductor or {},
                                  "cuda_graphs": cuda_graphs},
                       "methods": {"forward": {"inputs": [{**source, **({"high": high} if high else {})}]}},
                       "validation": {"samples": 1, "latency_runs": 0}})


def setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``--inductor``: the value as JSON where it parses (true, 3), else the string."""
    key, _, value = text.partition("=")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def inputs_for(name: str, batch: int) -> Any:
    import torch

    _, shape, dtype, high = MODELS[name]
    generator = torch.Generator().manual_seed(batch)
    if high is not None:
        return torch.randint(0, high, (batch, *shape[1:]), generator=generator)
    return torch.randn(batch, *shape[1:], generator=generator)


def pool_trimmed(measure_: Callable[[], T]) -> T:
    """``measure_()`` with the default CUDA memory pool at the driver's default threshold, then kept again."""
    set_cuda_pool_release_threshold(0)
    try:
        return measure_()
    finally:
        set_cuda_pool_release_threshold()


def round_of(side: str, call: Callable[[], Any], calls: int) -> Callable[[int], tuple[float, float]]:
    """One round of a side: its timed calls, the pool trimmed for the side named so."""

    def one_round(_: int) -> tuple[float, float]:
        if side.endswith("pool_trimmed"):
            return pool_trimmed(lambda: timed(call, calls, warmup=10))
        return timed(call, calls, warmup=10)

    return one_round


def measure(spec: BuildSpec, name: str, export_dir: Path, data: Path, rounds: int, calls: int,
            profile_calls: int, batches: tuple[int, ...], graphs: bool) -> dict[str, Any]:
    """Every side at each of ``batches``, and the profile of the program at batch 1."""
    import torch

    from prefect_executorch.machine.runtime_extension import runtime_extension
    from prefect_executorch.spec.modelref import load_model
    from prefect_executorch.targets.cuda import for_precision

    program = runtime_extension()._load_for_executorch(str(export_dir / "model.pte"), str(data))
    # Eager and torch.compile compute in the program's type, behind the same float32 interface.
    model = for_precision(load_model(spec), None, spec.target.precision)[0].cuda().eval()  # type: ignore[attr-defined]
    started = time.perf_counter()
    compiled = torch.compile(model)
    # torch.compile's own CUDA graphs: the eager counterpart of a replayed program.
    replayed = torch.compile(model, mode="reduce-overhead") if graphs else None
    figures: dict[str, Any] = {}
    with torch.no_grad():
        for batch in batches:
            host = inputs_for(name, batch)
            device = host.cuda()
            compiled(device)  # compiles (and recompiles per batch): timed apart from the calls
            figures.setdefault("torch_compile_first_call_s", round(time.perf_counter() - started, 2))
            sides: dict[str, Callable[[], Any]] = {
                "program": lambda h=host: program.run_method("forward", (h,)),
                "program_pool_trimmed": lambda h=host: program.run_method("forward", (h,)),
                "eager_cuda": lambda d=device: model(d),
                "eager_host_copies": lambda h=host: model(h.cuda()).cpu(),
                "torch_compile": lambda d=device: compiled(d),
            }
            if replayed is not None:
                for _ in range(3):  # records its graph: not timed
                    replayed(device)
                sides["torch_compile_reduce_overhead"] = lambda d=device: (torch.compiler.cudagraph_mark_step_begin(),
                                                                           replayed(d))
            check = program.run_method("forward", (host,))[0]
            error = float((check - model(device).cpu()).abs().max())
            per_round = interleaved({side: round_of(side, call, calls) for side, call in sides.items()}, rounds)
            figures[f"batch{batch}"] = {
                "max_abs_error_program_vs_eager": error,
                **{side: {"p50": spread([p50 for p50, _ in values], 4, "ms"),
                          "p95_median_ms": round(statistics.median(p95 for _, p95 in values), 4)}
                   for side, values in per_round.items()},
            }
        if profile_calls:
            host = inputs_for(name, 1)
            run = lambda: program.run_method("forward", (host,))  # noqa: E731
            figures["profile_batch1_program"] = top_events(run, profile_calls)
            figures["profile_batch1_program_pool_trimmed"] = pool_trimmed(lambda: top_events(run, profile_calls))
    return figures


def replay_child(request: dict[str, Any]) -> dict[str, Any]:
    """In a process of its own: the program loaded with its method captured as a CUDA graph, the replay checked
    against a direct call, then timed at ``batch`` like the other sides."""
    from prefect_executorch.machine.runtime_extension import runtime_extension
    from prefect_executorch.targets import get_target
    from prefect_executorch.validate.replay import check_replay

    get_target("cuda").runtime_setup({"cuda_graph_methods": ["forward"]})
    program = runtime_extension()._load_for_executorch(request["pte"], request["ptd"])
    host = inputs_for(request["model"], request["batch"])
    call = lambda: program.run_method("forward", (host,))  # noqa: E731
    check = check_replay("forward", call)
    rounds = [timed(call, request["calls"], warmup=10) for _ in range(request["rounds"])]
    return {"replay": check.model_dump(),
            "p50": spread([p50 for p50, _ in rounds], 4, "ms"),
            "p95_median_ms": round(statistics.median(p95 for _, p95 in rounds), 4)}


def replayed_side(model: str, export_dir: Path, data: Path, batch: int, rounds: int, calls: int) -> dict[str, Any]:
    """``replay_child`` run in a child process (one program per process: the backend's kernel library file)."""
    request = {"model": model, "pte": str(export_dir / "model.pte"), "ptd": str(data), "batch": batch,
               "rounds": rounds, "calls": calls}
    done = subprocess.run([sys.executable, __file__, "--replay-child", json.dumps(request)], capture_output=True,
                          text=True, timeout=600)
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"the replay child failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def build(spec: BuildSpec, scratch: Path) -> tuple[dict[str, Any], Any, Path]:
    """Export and validate ``spec`` through the product: the build's figures, the export and its ``.ptd``."""
    started = time.perf_counter()
    export = export_program(spec, scratch)
    exported = time.perf_counter()
    require_passed(validate_program(spec, export.path, export.data_files, scratch_dir=scratch))
    data = export.path / export.data_files[0]
    return ({"export_s": round(exported - started, 1), "export_child_s": round(export.seconds, 1),
             "validate_s": round(time.perf_counter() - exported, 1),
             "pte_bytes": (export.path / export.program).stat().st_size, "ptd_bytes": data.stat().st_size,
             "delegates": export.delegates(), "notes": export.warnings}, export, data)


def judged(at: dict[str, Any], graphs: bool) -> dict[str, Any]:
    """The program's p50 over the baseline's at one batch: the faster of eager and torch.compile (and, for the
    replayed program, torch.compile's CUDA graphs)."""
    def p50(side: str) -> float:
        return float(at[side]["p50"]["median_ms"])

    eager = ["eager_cuda", "torch_compile"]
    baseline = min(eager, key=p50)
    verdict = {"baseline": baseline, "program_over_baseline": round(p50("program") / p50(baseline), 3)}
    if graphs:
        replay_baseline = min([*eager, "torch_compile_reduce_overhead"], key=p50)
        verdict.update(replay_baseline=replay_baseline,
                       program_cuda_graphs_over_baseline=round(p50("program_cuda_graphs") / p50(replay_baseline), 3))
    return verdict


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--replay-child":
        print(json.dumps(replay_child(json.loads(sys.argv[2]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--profile-calls", type=int, default=50, help="program calls profiled per pool setting (0: none)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16", "fp16"])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, LARGEST], help="batch sizes timed (1 is judged)")
    parser.add_argument("--static", action="store_true", help="one program per batch, exported at that batch")
    parser.add_argument("--inductor", type=setting, action="append", default=[], metavar="KEY=VALUE",
                        help="target.inductor setting (repeatable)")
    parser.add_argument("--cuda-graphs", action="store_true", help="also time the program replayed as a CUDA graph")
    args = parser.parse_args()
    if args.cuda_graphs and not args.static:
        parser.error("--cuda-graphs needs --static: a CUDA graph replays the sizes it captured")
    if 1 not in args.batches:
        parser.error("--batches must include 1: the goal is judged at batch 1")

    import torch

    from prefect_executorch.machine.toolchain import probe
    from prefect_executorch.targets import get_target

    toolchain = probe()  # activates the runtime with CudaBackend in this process, before anything loads another
    get_target("cuda").runtime_setup()  # TF32 off for eager and torch.compile, as validation compares
    if args.precision == "tf32":
        # The baseline computes as the program does (validation still compares with TF32 off, in its child).
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
    inductor = dict(args.inductor)
    figures: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0), "driver": toolchain.driver_version, "torch": torch.__version__,
        "executorch": toolchain.executorch, "runtime": toolchain.tensorrt_executorch_runtime,
        "runtime_backends": toolchain.runtime_backends, "rounds": args.rounds, "calls_per_round": args.calls,
        "precision": args.precision, "shapes": "static" if args.static else f"dynamic batch 1..{LARGEST}",
        "inductor": inductor, "cuda_graphs": args.cuda_graphs,
        "eager_matmul_precision": torch.get_float32_matmul_precision(), "eager_cudnn_tf32": torch.backends.cudnn.allow_tf32,
    }
    ratios = {}
    with tempfile.TemporaryDirectory(prefix="gpu-latency-") as scratch:
        for name in args.models:
            builds = ([(b, spec_for(name, args.precision, b, inductor, args.cuda_graphs)) for b in args.batches]
                      if args.static else [(None, spec_for(name, args.precision, None, inductor))])
            model_figures: dict[str, Any] = {}
            for batch, spec in builds:
                built, export, data = build(spec, Path(scratch))
                batches = (batch,) if batch is not None else tuple(args.batches)
                measured = measure(spec, name, export.path, data, args.rounds, args.calls,
                                   args.profile_calls if 1 in batches else 0, batches, args.cuda_graphs)
                for at in batches:
                    if args.cuda_graphs:
                        replay = replayed_side(name, export.path, data, at, args.rounds, args.calls)
                        if replay["replay"]["captured"] is not True or replay["replay"]["identical"] is not True:
                            raise RuntimeError(f"{name} batch {at}: the replay was not shown: {replay['replay']}")
                        measured[f"batch{at}"]["program_cuda_graphs"] = replay
                    measured[f"batch{at}"].update(judged(measured[f"batch{at}"], args.cuda_graphs))
                model_figures.update({("build" if batch is None else f"build_batch{batch}"): built, **measured})
            at_one = model_figures["batch1"]
            ratios[name] = at_one["program_cuda_graphs_over_baseline" if args.cuda_graphs else "program_over_baseline"]
            figures[name] = model_figures
    worst = max(ratios, key=lambda n: ratios[n])
    figures["worst_model"] = worst
    return 0 if report("gpu_latency", ratios[worst], "<=1.0", figures) else 1


if __name__ == "__main__":
    sys.exit(main())
