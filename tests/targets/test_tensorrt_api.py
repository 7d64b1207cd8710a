"""The TensorRT target against the real torch-tensorrt 2.14.0 wheel and the installed ExecuTorch, without a GPU.

The wheels come from ``tests/wheels.py`` and are read with ``ast``: importing torch-tensorrt needs TensorRT.
"""

from __future__ import annotations

import ast
import itertools
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from torch.utils._pytree import tree_leaves

from prefect_executorch.artifacts.manifest import BundleKey
from prefect_executorch.errors import SpecError, ToolchainMismatch
from prefect_executorch.machine.apisource import DirectoryRoot, Sources, WheelRoot, installed_root
from prefect_executorch.machine.hostprobe import tensorrt_capabilities
from prefect_executorch.machine.toolchain import GpuInfo, Toolchain, read_torch_tensorrt_api
from prefect_executorch.spec.buildspec import BuildSpec, parse_spec
from prefect_executorch.spec.options import TENSORRT_OWNED_COMPILE_KEYWORDS
from prefect_executorch.targets import get_target
from prefect_executorch.targets.calls import Call, Ref, Slot, Step, check_calls, materialize, walk
from prefect_executorch.targets.gpu import RUNTIME_MODULE
from prefect_executorch.targets.tensorrt import build_backend_config, build_steps

from helpers import MODELS
from wheels import DELEGATE_RUNTIME, TORCH_TENSORRT, download_wheel

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parents[1] / "fixtures"
TARGET = get_target("tensorrt")


@pytest.fixture(scope="module")
def trt_wheel() -> WheelRoot:
    return WheelRoot(download_wheel(TORCH_TENSORRT))


@pytest.fixture(scope="module")
def runtime_wheel() -> WheelRoot:
    return WheelRoot(download_wheel(DELEGATE_RUNTIME))


@pytest.fixture(scope="module")
def sources(trt_wheel: WheelRoot) -> Sources:
    """torch-tensorrt from the real wheel, ExecuTorch from this environment (1.4.1)."""
    executorch = installed_root("executorch")
    assert executorch is not None, "executorch must be installed for these tests"
    return Sources({"torch_tensorrt": trt_wheel, "executorch": executorch})


def h200(fixture: str = "hostprobe_h200.json") -> Toolchain:
    """A probe run on a real NVIDIA H200 worker: torch 2.11.0+cu130, no ExecuTorch, no TensorRT."""
    return Toolchain.model_validate_json((FIXTURES / fixture).read_text())


@pytest.fixture(scope="module")
def ready(sources: Sources) -> Toolchain:
    """The H200 with the release stack: torch 2.14 cu130, torch-tensorrt 2.14.0 and its [executorch] extra's CPU
    ExecuTorch 1.4.1, the runtime wheel 0.1.0 (versions as published; API read from the real wheel)."""
    api = read_torch_tensorrt_api(sources)
    return h200().model_copy(update={
        "torch": "2.14.0+cu130", "executorch": "1.4.1", "executorch_cuda": False,
        "torch_tensorrt": "2.14.0", "torch_tensorrt_api": api, "capabilities": tensorrt_capabilities(api.model_dump()),
        "tensorrt": "11.1.0.3", "tensorrt_executorch_runtime": "0.1.0", "triton": "3.6.0",
    })


@pytest.fixture(scope="module")
def nightly(ready: Toolchain) -> Toolchain:
    """The backend page's stack: the 2026-10-06 nightlies of torch and torch-tensorrt on cu132, CUDA ExecuTorch."""
    return ready.model_copy(update={
        "torch": "2.15.0.dev20261006+cu132", "cuda_version": "13.2", "cuda_channel": "cu132",
        "torch_tensorrt": "2.15.0.dev20261006+cu132", "executorch": "1.6.0.dev20260925+cu132", "executorch_cuda": True,
        "tensorrt_executorch_runtime": "0.1.0.dev20261006", "nvcc_version": "13.2", "triton": "unknown",
    })


def trt_spec(factory: str = "mlp", methods: dict[str, Any] | None = None, **target: Any) -> BuildSpec:
    return parse_spec({
        "name": "m", "version": "1", "model": f"{MODELS}:{factory}",
        "methods": methods or {"forward": {"inputs": [{"name": "x", "shape": [2, 32]}]}},
        "target": {"kind": "tensorrt", **target},
    })


def refusal(spec: BuildSpec, toolchain: Toolchain) -> str:
    with pytest.raises(ToolchainMismatch) as info:
        TARGET.check(spec, toolchain)
    return str(info.value)


TWO_METHODS = {
    "forward": {"inputs": [{"name": "x", "shape": [4, 32], "dynamic": {0: {"min": 1, "max": 16, "name": "batch"}}}]},
    "encode": {"inputs": [{"name": "x", "shape": [2, 32]}]},
}
#: save() names its one method "forward": every other method set takes the mapping path.
METHOD_SETS = {"forward": {"forward": TWO_METHODS["forward"]}, "encode": {"encode": TWO_METHODS["encode"]},
               "both": TWO_METHODS}
DEVICE_IO = [None, True, {"inputs": True, "outputs": False}, {"inputs": False, "outputs": True, "planned_outputs": False}]


# ------------------------------------------------------------------- conformance with the real sources


def test_every_call_of_every_option_combination_fits_the_real_sources(sources: Sources) -> None:
    assert_calls_fit(sources)


def assert_calls_fit(sources: Sources) -> None:
    """Every call of every option combination fits ``sources``; only CUDA graph replay may be missing."""
    combos = itertools.product(["fp32", "fp16", "bf16"], [False, True], DEVICE_IO, [False, True], [False, True],
                               METHOD_SETS)
    checked = 0
    graphs_save, graphs_export = (
        "use_cuda_graphs" in sources.params(sources.resolve(name)).keywords
        for name in ("torch_tensorrt.save", "torch_tensorrt.executorch.export"))
    for precision, coalesce, io, graphs, hardware, method_set in combos:
        spec = trt_spec(methods=METHOD_SETS[method_set], precision=precision, coalesce_cuda=coalesce,
                        device_resident_io=io, cuda_graphs=graphs, hardware_compatible=hardware,
                        version_compatible=hardware, compile_options={"optimization_level": 3})
        problems = check_calls(build_steps(spec), sources)
        callee, has = (("torch_tensorrt.save", graphs_save) if method_set == "forward"
                       else ("torch_tensorrt.executorch.export", graphs_export))
        missing = graphs and not has
        assert problems == ([f"{callee} does not accept the keyword 'use_cuda_graphs'"] if missing else []), spec.target
        checked += 1
    assert checked == 3 * 2 * 4 * 2 * 2 * 3


#: A checkout of Torch-TensorRT's main branch (its ``py`` folder), e.g. from ``git archive``; not on PyPI.
NIGHTLY_SOURCE = os.environ.get("PREFECT_EXECUTORCH_TORCH_TENSORRT_SOURCE")


@pytest.mark.skipif(not NIGHTLY_SOURCE, reason="set PREFECT_EXECUTORCH_TORCH_TENSORRT_SOURCE to a Torch-TensorRT "
                    "main checkout's py/ folder: its nightly sources are on no package index this suite can reach")
def test_every_call_fits_the_nightly_sources_too() -> None:
    executorch = installed_root("executorch")
    assert NIGHTLY_SOURCE is not None and executorch is not None
    nightly_root = DirectoryRoot(Path(NIGHTLY_SOURCE))
    assert nightly_root.read("torch_tensorrt/_compile.py") is not None, f"no torch_tensorrt/ under {NIGHTLY_SOURCE}"
    assert_calls_fit(Sources({"torch_tensorrt": nightly_root, "executorch": executorch}))


def test_a_renamed_keyword_or_class_upstream_fails_the_check(sources: Sources) -> None:
    renamed = [
        Call("torch_tensorrt.dynamo.compile", "function", kwargs={"enabled_precisions": {"fp16"}}),
        Call("executorch.backends.cuda.cuda_partitioner.CudaPartitioner", "class", args=([], [])),
        Call("executorch.exir.passes.MemoryPlanningPass", "class", kwargs={"alloc_graph_inputs": False}),
        Call("executorch.backends.cuda.cuda_backend.CudaBackend.generate_method_name_compile_spec", "function"),
        Call("torch_tensorrt.executorch.TensorRTPartitioner2", "class"),
    ]
    problems = check_calls(renamed, sources)
    assert problems == [
        "torch_tensorrt.dynamo.compile does not accept the keyword 'enabled_precisions'",
        "executorch.backends.cuda.cuda_partitioner.CudaPartitioner takes 1 positional arguments, we pass 2",
        "executorch.exir.passes.MemoryPlanningPass does not accept the keyword 'alloc_graph_inputs'",
        "executorch.backends.cuda.cuda_backend.CudaBackend.generate_method_name_compile_spec is a classmethod in "
        "the installed source, expected a function",
        "torch_tensorrt.executorch.TensorRTPartitioner2: torch_tensorrt.executorch has no 'TensorRTPartitioner2'",
    ]


def test_dtype_refs_exist_in_torch() -> None:
    refs = {v.path for s in build_steps(trt_spec(precision="fp16")) for c in walk(s) for v in c.kwargs.values()
            if isinstance(v, Ref)}
    refs |= {i.kwargs["dtype"].path for s in build_steps(trt_spec()) for c in walk(s) if c.callee.endswith(".Input")
             for i in [c]}
    assert refs == {"torch.float16", "torch.float32"}
    assert all(materialize(Ref(path), {}) is not None for path in refs)


def test_our_defaults_and_ids_match_the_wheel(sources: Sources, runtime_wheel: WheelRoot) -> None:
    assert trt_spec().target.min_block_size == sources.constant("torch_tensorrt.dynamo._defaults.MIN_BLOCK_SIZE")
    assert sources.resolve("torch_tensorrt.executorch.TensorRTBackend").kind == "class"
    runtime = Sources({RUNTIME_MODULE: runtime_wheel})
    assert runtime.constant(f"{RUNTIME_MODULE}.BACKEND_NAME") == "TensorRTBackend"
    activate = runtime.resolve(f"{RUNTIME_MODULE}.activate")
    assert activate.kind == "function" and runtime.params(activate).positional == []
    # Every keyword the spec reserves for the target is a real parameter of dynamo.compile.
    compile_params = sources.params(sources.resolve("torch_tensorrt.dynamo.compile"))
    assert set(TENSORRT_OWNED_COMPILE_KEYWORDS) <= compile_params.keywords | set(compile_params.positional)


def test_probe_reads_the_api_from_the_wheel(sources: Sources) -> None:
    api = read_torch_tensorrt_api(sources)
    assert (api.version, api.cuda_version, api.tensorrt_version, api.cuda_channel) == ("2.14.0", "13.2", "11.1.0", "cu132")
    assert {"partitioners", "backend_config", "retrace", "arg_inputs"} <= set(api.save_keywords)
    assert "use_cuda_graphs" not in api.save_keywords
    # 2.14 networks are strongly typed: the old precision keywords are gone, autocast replaced them.
    assert {"enable_autocast", "autocast_low_precision_type"} <= set(api.compile_keywords)
    assert not {"enabled_precisions", "use_explicit_typing"} & set(api.compile_keywords)


def test_install_extra_matches_the_wheels_requirements(trt_wheel: WheelRoot, runtime_wheel: WheelRoot) -> None:
    extra = {Requirement(r).name: Requirement(r) for r in
             tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tensorrt"]}
    wheel = [Requirement(line.split(":", 1)[1]) for line in trt_wheel.dist_info("METADATA").splitlines()
             if line.startswith("Requires-Dist:")]
    torch_req = next(r for r in wheel if r.name == "torch" and r.marker is None)
    executorch_req = next(r for r in wheel if r.name == "executorch" and "executorch" in str(r.marker))
    assert extra["torch"].specifier == torch_req.specifier
    assert extra["executorch"].specifier == executorch_req.specifier
    assert "executorch" in extra["torch-tensorrt"].extras and extra["torch-tensorrt"].specifier.contains("2.14.0")
    # The check pairs torch-tensorrt X.Y with torch X.Y: that is what the wheel requires.
    assert str(torch_req.specifier) in (">=2.14.0,<2.15.0", "<2.15.0,>=2.14.0")
    runtime = [Requirement(line.split(":", 1)[1]) for line in runtime_wheel.dist_info("METADATA").splitlines()
               if line.startswith("Requires-Dist:")]
    pinned = next(r for r in runtime if r.name == "executorch")
    assert extra["executorch"].specifier.contains(next(iter(pinned.specifier)).version)
    assert extra["torch-tensorrt-executorch-runtime"].specifier.contains("0.1.0")


#: What each stack installs (the nightly as the backend page names it: its 2026-10-06 build).
STACKS = {
    "tensorrt": {"torch": "2.14.0+cu130", "torch-tensorrt": "2.14.0", "executorch": "1.4.1",
                 "torch-tensorrt-executorch-runtime": "0.1.0"},
    "tensorrt-nightly": {"torch": "2.15.0.dev20261006+cu132", "torch-tensorrt": "2.15.0.dev20261006+cu132",
                         "executorch": "1.6.0.dev20260925+cu132", "torch-tensorrt-executorch-runtime": "0.1.0.dev20261006"},
}


@pytest.mark.parametrize("extra", sorted(STACKS))
def test_the_project_installs_beside_both_stacks(extra: str) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"][extra]]]
    for name, version in STACKS[extra].items():
        pins = [r for r in requirements if r.name == name]
        assert pins, f"{extra} does not name {name}"
        for pin in pins:
            assert pin.specifier.contains(version, prereleases=True), f"{pin} excludes {name} {version} ({extra})"
    # And neither stack's extra admits the other's versions: a worker installs one stack.
    other = STACKS["tensorrt" if extra == "tensorrt-nightly" else "tensorrt-nightly"]
    extra_pins = {Requirement(r).name: Requirement(r) for r in project["optional-dependencies"][extra]}
    assert not extra_pins["torch"].specifier.contains(other["torch"], prereleases=True)


# ------------------------------------------------------------------- call construction


#: What ``TensorRTTarget.lower`` fills before the steps run; every other slot must come from an earlier step.
def worker_slots(spec: BuildSpec) -> set[str]:
    return {"pte_path"} | {f"{kind}.{name}" for name in spec.methods
                           for kind in ("exported", "example_inputs", "dynamic_shapes")}


def slots_read(step: Step) -> set[str]:
    """Every slot a step's call reads, at any depth of its arguments (the calls' containers are pytrees)."""
    return {leaf.name for call in walk(step) for leaf in tree_leaves((call.args, dict(call.kwargs)))
            if isinstance(leaf, Slot)}


ALL_SPECS = [
    trt_spec(methods=METHOD_SETS[methods], precision=precision, coalesce_cuda=coalesce, device_resident_io=io,
             cuda_graphs=graphs)
    for precision, coalesce, io, graphs, methods in itertools.product(
        ["fp32", "bf16"], [False, True], DEVICE_IO[:2], [False, True], METHOD_SETS)
]


def spec_id(spec: BuildSpec) -> str:
    flags = [name for name in ("coalesce_cuda", "device_resident_io", "cuda_graphs") if getattr(spec.target, name)]
    return "-".join([spec.target.precision, "+".join(spec.methods), *flags])


@pytest.mark.parametrize("spec", ALL_SPECS, ids=spec_id)
def test_every_slot_is_filled_before_it_is_read_and_the_program_is_the_last_step(spec: BuildSpec) -> None:
    steps = build_steps(spec)
    filled = worker_slots(spec)
    for index, step in enumerate(steps):
        assert slots_read(step) <= filled, f"step {index} ({step.call.callee}) reads {slots_read(step) - filled}"
        if step.result is not None:
            assert step.result not in filled, f"step {index} overwrites {step.result}"
            filled.add(step.result)
    # Each method is compiled exactly once, from its own exported program.
    compiled = [slots_read(s) for s in steps if s.call.callee == "torch_tensorrt.dynamo.compile"]
    assert sorted(compiled, key=sorted) == sorted(({f"exported.{m}"} for m in spec.methods), key=sorted)
    # Nothing is computed and thrown away: every result feeds a later step, except the program itself.
    produced = [s.result for s in steps if s.result is not None]
    read_later = {name for i, s in enumerate(steps) for later in steps[i + 1:] for name in slots_read(later)
                  if name == s.result}
    assert set(produced) - read_later <= {"executorch_program"}
    last = steps[-1]
    # lower() writes the .pte from "executorch_program", or save() writes it to pte_path itself.
    assert last.result == "executorch_program" or "pte_path" in slots_read(last), last.call.callee


def default_of(sources: Sources, callee: str, keyword: str) -> Any:
    """The default value of ``keyword`` in the real source of ``callee``."""
    node = sources.resolve(callee).node
    assert isinstance(node, ast.FunctionDef), callee
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    pairs = [*zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True),
             *((a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None)]
    return next(ast.literal_eval(default) for arg, default in pairs if arg.arg == keyword)


#: Keywords whose default re-exports the compiled graph, which drops the TensorRT engines.
RETRACING = {("torch_tensorrt.save", "retrace"): False, ("torch_tensorrt.dynamo.export", "use_legacy_exporter"): True}


def test_no_call_keeps_a_default_that_drops_the_engines(sources: Sources) -> None:
    for (callee, keyword), safe in RETRACING.items():
        # The wheel's default is the unsafe value: the call must set the keyword itself.
        assert default_of(sources, callee, keyword) is (not safe), (callee, keyword)
    seen = set()
    for spec in ALL_SPECS:
        for call in walk(build_steps(spec)):
            for (callee, keyword), safe in RETRACING.items():
                if call.callee == callee:
                    assert call.kwargs.get(keyword) is safe, (callee, keyword, spec.target)
                    seen.add(callee)
    assert seen == {callee for callee, _ in RETRACING}  # both paths were exercised


#: A value of each option other than its default, the callee that must honour it (None: whichever call writes
#: the program) and the keywords it must receive (keyword names are checked against the real wheel by
#: test_every_call_of_every_option_combination_fits_the_real_sources).
OPTION_CHANGES: dict[str, tuple[Any, str | None, dict[str, Any]]] = {
    "precision": ("fp16", "torch_tensorrt.dynamo.compile",
                  {"enable_autocast": True, "autocast_low_precision_type": Ref("torch.float16"), "disable_tf32": False}),
    "min_block_size": (1, "torch_tensorrt.dynamo.compile", {"min_block_size": 1}),
    "hardware_compatible": (True, "torch_tensorrt.dynamo.compile", {"hardware_compatible": True}),
    "version_compatible": (True, "torch_tensorrt.dynamo.compile", {"version_compatible": True}),
    "compile_options": ({"optimization_level": 5}, "torch_tensorrt.dynamo.compile", {"optimization_level": 5}),
    "coalesce_cuda": (True, "executorch.backends.cuda.cuda_partitioner.CudaPartitioner", {}),
    "device_resident_io": (True, "executorch.exir.ExecutorchBackendConfig", {"enable_non_cpu_memory_planning": True}),
    "cuda_graphs": (True, None, {"use_cuda_graphs": True}),
}
#: The calls that write the program (a lone forward through save, several methods through executorch.export).
PROGRAM_WRITERS = ("torch_tensorrt.save", "torch_tensorrt.executorch.export")


@pytest.mark.parametrize("method_set", sorted(METHOD_SETS))
@pytest.mark.parametrize("option", sorted(OPTION_CHANGES))
def test_every_option_reaches_the_call_that_honours_it(option: str, method_set: str, sources: Sources) -> None:
    value, callee, keywords = OPTION_CHANGES[option]
    plain, changed = (build_steps(trt_spec(methods=METHOD_SETS[method_set], **extra))
                      for extra in ({}, {option: value}))
    targets = (callee,) if callee is not None else PROGRAM_WRITERS
    with_option = [c for c in walk(changed) if c.callee in targets]
    assert with_option, f"{option}={value!r} reaches no {targets}"
    for call in with_option:
        # Each keyword with the option's value, in every call that must honour it (each method's compile).
        assert {k: call.kwargs.get(k) for k in keywords} == keywords, (option, call.callee, dict(call.kwargs))
    assert [c for c in walk(plain) if c.callee in targets] != with_option, f"{option}={value!r} changes no call"
    # The 2.14 wheel predates CUDA graph replay: that keyword is the one refusal a stack may answer with.
    assert check_calls(changed, sources) in ([], *([f"{c} does not accept the keyword 'use_cuda_graphs'"]
                                                   for c in PROGRAM_WRITERS))


@pytest.mark.parametrize("method_set", sorted(METHOD_SETS))
def test_each_method_gets_a_partitioner_naming_it(method_set: str) -> None:
    # save() names its one method "forward" and rejects a CudaPartitioner whose specs name another:
    # only a lone forward may go through it.
    spec = trt_spec(methods=METHOD_SETS[method_set], coalesce_cuda=True)
    calls = {c.callee: c for s in build_steps(spec) for c in walk(s)}
    uses_save = "torch_tensorrt.save" in calls
    assert uses_save is (list(spec.methods) == ["forward"])
    if uses_save:
        partitioners = {"forward": calls["torch_tensorrt.save"].kwargs["partitioners"]}
    else:
        edge = calls["torch_tensorrt.executorch.export"]
        assert set(edge.args[0]) == set(spec.methods)
        partitioners = edge.kwargs["partitioners"]
    assert set(partitioners) == set(spec.methods)
    for method, chosen in partitioners.items():
        assert {c.args[0] for c in walk(chosen) if c.callee.endswith("generate_method_name_compile_spec")} == {method}


def test_fp32_default_has_no_autocast_and_no_tf32() -> None:
    compile_call = build_steps(trt_spec())[0].call
    assert compile_call.kwargs["disable_tf32"] is True
    assert "enable_autocast" not in compile_call.kwargs and "autocast_low_precision_type" not in compile_call.kwargs
    assert "partitioners" not in build_steps(trt_spec())[1].call.kwargs
    assert "backend_config" not in build_steps(trt_spec())[1].call.kwargs


def test_dynamic_dims_become_min_opt_max_inputs() -> None:
    methods = {"forward": {"inputs": [
        {"name": "x", "shape": [4, 32], "dynamic": {0: {"min": 1, "max": 16, "opt": 8}}},
        {"name": "mask", "shape": [4, 32], "dtype": "bool"},
    ]}}
    x, mask = build_steps(trt_spec(methods=methods))[0].call.kwargs["arg_inputs"]
    assert dict(x.kwargs) == {"min_shape": [1, 32], "opt_shape": [8, 32], "max_shape": [16, 32],
                              "dtype": Ref("torch.float32"), "name": "x"}
    assert dict(mask.kwargs) == {"shape": [4, 32], "dtype": Ref("torch.bool"), "name": "mask"}


def test_device_resident_config_is_accepted_by_real_executorch() -> None:
    for io in DEVICE_IO[1:]:
        config = materialize(build_backend_config(trt_spec(device_resident_io=io).target), {})
        spec_io = trt_spec(device_resident_io=io).target.device_resident_io
        assert config.enable_non_cpu_memory_planning is True
        assert config.propagate_device_config.skip_h2d_for_method_inputs is spec_io.inputs
        assert config.memory_planning_pass.alloc_graph_input is (not spec_io.inputs)
        assert config.memory_planning_pass.alloc_graph_output is spec_io.planned_outputs


# ------------------------------------------------------------------- spec refusals


@pytest.mark.parametrize("target, field, words", [
    ({"retrace": True}, "target.tensorrt.retrace", "drops the TensorRT engines"),
    ({"compile_options": {"min_block_size": 1}}, "target.tensorrt.compile_options", "set target.min_block_size"),
    ({"compile_options": {"enable_autocast": True}}, "target.tensorrt.compile_options", "set target.precision"),
    ({"device_resident_io": {"inputs": False, "outputs": False}}, "target.tensorrt.device_resident_io", "use device_resident_io: false"),
    ({"device_resident_io": {"outputs": False, "planned_outputs": False}}, "target.tensorrt.device_resident_io", "outputs: true"),
    ({"precision": "fp8"}, "target.tensorrt.precision", "'fp8'"),
    ({"use_cuda_graph": True}, "target.tensorrt.use_cuda_graph", "unknown field"),
    ({"min_block_size": 0}, "target.tensorrt.min_block_size", "greater than or equal to 1"),
])
def test_bad_target_options_name_their_field(target: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as info:
        trt_spec(**target)
    assert field in str(info.value) and words in str(info.value)


def test_unknown_compile_option_is_refused_with_a_suggestion(ready: Toolchain) -> None:
    with pytest.raises(SpecError) as info:
        TARGET.check(trt_spec(compile_options={"optimisation_level": 3}), ready)
    message = str(info.value)
    assert "target.compile_options.optimisation_level" in message and "ignore it silently" in message
    assert "did you mean 'optimization_level'" in message


def test_external_weights_and_mixed_low_precision_are_refused(ready: Toolchain) -> None:
    spec = trt_spec(precision="fp16").model_copy(update={"external_weights": True})
    methods = {"forward": {"inputs": [{"name": "x", "shape": [2, 32], "dtype": "bfloat16"}]}}
    with pytest.raises(SpecError) as info:
        TARGET.check(spec, ready)
    assert "external_weights" in str(info.value)
    with pytest.raises(SpecError) as info:
        TARGET.check(trt_spec(methods=methods, precision="fp16"), ready)
    assert "methods.forward.inputs 'x': dtype bfloat16 does not match target.precision 'fp16'" in str(info.value)


# ------------------------------------------------------------------- toolchain refusals from real data


@pytest.mark.parametrize("fixture", ["hostprobe_h200.json", "probe_h200.json"])
def test_the_real_h200_probe_is_refused_for_what_it_lacks(fixture: str) -> None:
    message = refusal(trt_spec(), h200(fixture))
    assert "torch-tensorrt is not installed" in message
    assert "executorch is not installed" in message
    assert "torch-tensorrt-executorch-runtime is not installed" in message
    # Its torch is a cu130 release: the hint is the release stack's line on that channel, not the nightly one.
    assert '"torch-tensorrt[executorch]>=2.14,<2.15"' in message
    assert "--extra-index-url https://download.pytorch.org/whl/cu130" in message and "https://pypi.nvidia.com" in message
    assert "nightly" not in message and "--pre" not in message


def test_torch_tensorrt_2_14_on_the_h200s_torch_2_11_is_refused(ready: Toolchain) -> None:
    toolchain = h200().model_copy(update={
        "torch_tensorrt": "2.14.0", "torch_tensorrt_api": ready.torch_tensorrt_api, "tensorrt": "11.1.0.3",
        "executorch": "1.4.1+cu130", "executorch_cuda": True, "tensorrt_executorch_runtime": "0.1.0"})
    message = refusal(trt_spec(), toolchain)
    assert "torch-tensorrt 2.14.0 needs torch 2.14 (torch>=2.14,<2.15), found torch 2.11.0+cu130" in message
    # The PyPI wheel (no +cu label) is built with CUDA 13.2 and runs on any CUDA 13: no channel conflict.
    assert "is built for" not in message


INPUTS_ONLY = {"inputs": True, "outputs": False}


def test_the_release_stack_passes_and_gets_its_compat_keys(ready: Toolchain) -> None:
    assert TARGET.check(trt_spec(coalesce_cuda=True, device_resident_io=INPUTS_ONLY), ready) == []
    assert TARGET.compat(trt_spec(), ready) == "cu130-sm90-trt11.1-x86_64"
    assert TARGET.compat(trt_spec(hardware_compatible=True), ready) == "cu130-sm80plus-trt11.1-x86_64"
    assert TARGET.compat(trt_spec(version_compatible=True), ready) == "cu130-sm90-trt11.1plus-x86_64"
    key = BundleKey(name="m", version="1", target="tensorrt",
                    compat=TARGET.compat(trt_spec(hardware_compatible=True, version_compatible=True), ready))
    assert key.prefix == "m/1/tensorrt/cu130-sm80plus-trt11.1plus-x86_64"
    assert TARGET.runtime_hints(trt_spec(), ready)["stack"] == "release"


def test_the_nightly_stack_passes_and_says_so(nightly: Toolchain) -> None:
    assert TARGET.check(trt_spec(coalesce_cuda=True, device_resident_io=INPUTS_ONLY), nightly) == []
    assert TARGET.compat(trt_spec(), nightly) == "cu132-sm90-trt11.1-x86_64"
    assert TARGET.runtime_hints(trt_spec(), nightly)["stack"] == "nightly"
    message = refusal(trt_spec(), nightly.model_copy(update={"tensorrt_executorch_runtime": None}))
    assert ("pip install --pre torch-tensorrt-executorch-runtime --index-url "
            "https://download.pytorch.org/whl/nightly/cu132") in message


def test_a_compat_key_needs_a_tensorrt_version(ready: Toolchain) -> None:
    with pytest.raises(ToolchainMismatch, match="compat key of a TensorRT bundle cannot be built.*tensorrt=None"):
        TARGET.compat(trt_spec(), ready.model_copy(update={"tensorrt": None}))


@pytest.mark.parametrize("update, words", [
    ({"cuda_available": False, "gpus": []}, "no NVIDIA GPU is visible"),
    ({"torch": "2.14.0+cpu", "cuda_version": None, "cuda_channel": None}, "torch 2.14.0+cpu is a CPU build"),
    ({"torch": "2.14.0+cu128", "cuda_version": "12.8", "cuda_channel": "cu128"}, "CUDA 12 is not supported"),
    ({"os": "Darwin", "arch": "arm64"}, "Linux x86_64 or aarch64; this worker is Darwin arm64"),
    ({"os": "Linux", "arch": "ppc64le"}, "this worker is Linux ppc64le"),
    ({"tensorrt_executorch_runtime": None}, "executorch 1.4.1 is a CPU build and torch-tensorrt-executorch-runtime "
     "is not installed"),
    ({"executorch": "1.4.1+cu132", "executorch_cuda": True},
     "executorch 1.4.1+cu132 is built for cu132 but torch is cu130"),
    ({"torch_tensorrt": "2.14.0+cu132"}, "torch-tensorrt 2.14.0+cu132 is built for cu132 but torch is cu130"),
    ({"torch_tensorrt": "2.13.0+cu132", "torch": "2.13.0+cu132"}, "older than 2.14: it silently drops backend_config"),
    ({"tensorrt": None}, "TensorRT is not installed"),
    ({"tensorrt": "10.13.3.9"}, "TensorRT 10.13.3.9 does not match the 11.1.0"),
    ({"tensorrt_executorch_runtime": None}, "pip install torch-tensorrt-executorch-runtime --extra-index-url "
     "https://download.pytorch.org/whl/cu130"),
])
def test_toolchain_refusals(ready: Toolchain, update: dict[str, Any], words: str) -> None:
    assert words in refusal(trt_spec(), ready.model_copy(update=update))


def test_a_cuda_12_torch_tensorrt_on_cuda_13_torch_is_refused_by_major(ready: Toolchain) -> None:
    api = ready.torch_tensorrt_api
    assert api is not None
    cuda12 = ready.model_copy(update={"torch_tensorrt_api": api.model_copy(update={"cuda_version": "12.8"})})
    assert "torch-tensorrt 2.14.0 is built for CUDA 12 (cu128) but torch is CUDA 13 (cu130)" in refusal(trt_spec(), cuda12)


@pytest.mark.parametrize("target, update, words", [
    ({"cuda_graphs": True}, {}, "torch_tensorrt.save() of torch-tensorrt 2.14.0 does not accept use_cuda_graphs"),
    ({"cuda_graphs": True}, {}, "newer than the 2026-10-06 nightly"),
    ({"coalesce_cuda": True}, {"nvcc": None, "nvcc_version": None}, "nvcc is not on PATH"),
    ({"coalesce_cuda": True}, {"nvcc_version": "12.8"}, "nvcc 12.8 at /usr/local/cuda/bin/nvcc is not CUDA 13"),
    ({"coalesce_cuda": True}, {"triton": None}, "imports triton"),
    ({"hardware_compatible": True}, {"gpus": [GpuInfo(index=0, name="Tesla T4", sm="sm75", total_memory_mib=15095)]},
     "need an Ampere (sm80) or newer GPU; this one is sm75"),
    ({"device_resident_io": {"planned_outputs": False}}, {}, "Device-resident outputs need ExecuTorch 1.6.0.dev20261008"),
    ({"device_resident_io": True}, {}, "Python cannot receive device-resident outputs on ExecuTorch 1.4.1"),
    ({"device_resident_io": True}, {}, "`device_resident_io: {inputs: true, outputs: false}`"),
    # The page's own nightly pins ExecuTorch 1.6.0.dev20260925: still too old for device-resident outputs.
    ({"device_resident_io": {"inputs": False, "outputs": True}}, {"executorch": "1.6.0.dev20260925+cu130"},
     "Python cannot receive device-resident outputs on ExecuTorch 1.6.0.dev20260925+cu130"),
])
def test_option_refusals(ready: Toolchain, target: dict[str, Any], update: dict[str, Any], words: str) -> None:
    assert words in refusal(trt_spec(**target), ready.model_copy(update=update))


def test_cuda_graphs_for_two_methods_names_executorch_export(ready: Toolchain) -> None:
    message = refusal(trt_spec(methods=TWO_METHODS, cuda_graphs=True), ready)
    assert "torch_tensorrt.executorch.export() of torch-tensorrt 2.14.0 does not accept use_cuda_graphs" in message


def test_newer_builds_unlock_unplanned_outputs_and_cuda_graphs_with_warnings(ready: Toolchain) -> None:
    api = ready.torch_tensorrt_api
    assert api is not None
    newer_api = api.model_copy(update={"save_keywords": [*api.save_keywords, "use_cuda_graphs"]})
    newer = ready.model_copy(update={
        "executorch": "1.6.0.dev20261010+cu132", "executorch_cuda": True, "torch_tensorrt": "2.15.0.dev20261012+cu132",
        "torch": "2.15.0.dev20261012+cu132", "cuda_channel": "cu132", "torch_tensorrt_api": newer_api,
        "capabilities": tensorrt_capabilities(newer_api.model_dump())})
    assert newer.capabilities == {"cuda_graphs": True, "cuda_graphs_several_methods": False, "shared_engines": True}
    spec = trt_spec(methods={"forward": TWO_METHODS["forward"]}, cuda_graphs=True, shared_scratch=True,
                    device_resident_io={"planned_outputs": False})
    warnings = TARGET.check(spec, newer)
    assert any("CUDA graph replay will not happen" in w for w in warnings)
    assert any("dynamic shapes" in w and "never replay" in w for w in warnings)
    assert any("shared_scratch is a delegate runtime feature" in w for w in warnings)


def test_runtime_hints_and_precision(ready: Toolchain) -> None:
    spec = trt_spec(device_resident_io={"inputs": True, "outputs": False}, cuda_graphs=True, shared_scratch=True,
                    precision="fp16")
    hints = TARGET.runtime_hints(spec, ready)
    assert hints["wants_cuda_tensors"] is True and hints["input_device"] == "cuda" and hints["output_device"] == "cpu"
    assert hints["cuda_graphs_requested"] is True and hints["shared_scratch"] is True
    assert hints["delegate_runtime"] == "torch-tensorrt-executorch-runtime" and hints["delegate_runtime_version"] == "0.1.0"
    assert TARGET.compute_dtype(spec) == "float16" and TARGET.compute_dtype(trt_spec()) is None
    assert TARGET.eager_device(spec) == "cuda"


# ------------------------------------------------------------------- the probe on a bare GPU host

#: What a GPU host may lack: the H200 workers have torch, and not even pydantic.
_ABSENT = ("prefect", "executorch", "yaml", "typer", "rich", "boto3", "packaging")
_PROBE_WITH_ONLY = """
import runpy, sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {absent!r}:
            raise ModuleNotFoundError(f"absent: {{name}}", name=name)
sys.meta_path.insert(0, Absent())
try:
    runpy.run_module({module!r}, run_name="__main__", alter_sys=True)  # as python -m does
except SystemExit as exit:
    if exit.code:
        raise
finally:
    # torch-tensorrt may be found, never imported: importing it needs TensorRT.
    if any(m.split(".")[0] in ("torch_tensorrt", "tensorrt") for m in sys.modules):
        sys.exit("the probe imported torch_tensorrt")
"""


@pytest.mark.parametrize("module, absent", [
    ("prefect_executorch.machine.hostprobe", (*_ABSENT, "pydantic")),  # torch alone
    ("prefect_executorch.machine.toolchain", _ABSENT),  # torch and pydantic
])
def test_probe_runs_on_a_bare_host_and_reads_an_installed_wheel(
    module: str, absent: tuple[str, ...], trt_wheel: WheelRoot, tmp_path: Path
) -> None:
    import subprocess
    import sys
    import zipfile

    import torch

    # Installed the way pip lays a wheel out (package + dist-info), but TensorRT is absent: never imported.
    zipfile.ZipFile(trt_wheel.wheel).extractall(tmp_path)
    code = _PROBE_WITH_ONLY.format(absent=absent, module=module)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr[-3000:]
    probed = Toolchain.model_validate_json(result.stdout)
    assert probed.torch == torch.__version__ and probed.torch_tensorrt == "2.14.0"
    assert probed.torch_tensorrt_api is not None and probed.torch_tensorrt_channel == "cu132"
    assert "use_cuda_graphs" not in probed.torch_tensorrt_api.save_keywords
    message = refusal(trt_spec(), probed)
    assert f"torch {torch.__version__} is a CPU build" in message and "TensorRT is not installed" in message


def test_fp16_engine_outputs_are_held_to_fp16_tolerances() -> None:
    import torch

    from prefect_executorch.spec.validation import ValidationSpec
    from prefect_executorch.validate.compare import compare_outputs

    eager = torch.linspace(-2, 2, 1000)
    engine = eager.half()  # what an autocast engine hands back for FP32 inputs
    (strict,) = compare_outputs([engine], eager, ValidationSpec())
    assert not strict.passed and strict.reason == "dtype float16 != eager float32"
    (held,) = compare_outputs([engine], eager, ValidationSpec(), precision="float16")
    assert held.passed and (held.atol, held.rtol, held.min_cosine) == (5e-3, 5e-3, 0.99)
    (off,) = compare_outputs([(eager * 1.01).half()], eager, ValidationSpec(), precision="float16")
    assert not off.passed and "beyond atol=0.005" in off.reason
