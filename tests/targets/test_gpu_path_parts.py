"""The GPU path's parts that run without a GPU: memory bounds, signatures read live, delegation read from a .pte."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from prefect_executorch.errors import ChildProcessFailed, ExportFailed
from prefect_executorch.export.exporter import ExportedProgramDir, ExportRequest, export_program
from prefect_executorch.isolation import MemoryLimit, run_isolated
from prefect_executorch.machine.apisource import DirectoryRoot, Sources, installed_root
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.targets import get_target
from prefect_executorch.targets.calls import Call, LiveSources, check_calls
from prefect_executorch.targets.tensorrt import build_backend_config, build_steps
from prefect_executorch.validate.validator import synchronized

from helpers import spec_data

#: A library whose ``save`` hands its ``**kwargs`` to a helper that reads an option, as a newer
#: torch-tensorrt may do with ``use_cuda_graphs``; a module on disk, read as source and imported.
FORWARDING_LIB = '''
def save(module, file_path="", *, output_format="exported_program", **kwargs):
    return _save_as_executorch(module, file_path, **kwargs)


def _save_as_executorch(module, file_path, **kwargs):
    return kwargs.get("use_cuda_graphs", False), kwargs.get("backend_config")
'''


@pytest.fixture
def forwarding_lib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sources:
    (tmp_path / "fwdlib").mkdir()
    (tmp_path / "fwdlib" / "__init__.py").write_text(FORWARDING_LIB)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fwdlib", raising=False)
    return Sources({"fwdlib": DirectoryRoot(tmp_path)})


def save_call(**kwargs: Any) -> Call:
    return Call("fwdlib.save", "function", args=("m", "p"), kwargs={"output_format": "executorch", **kwargs})


def test_keywords_consumed_in_a_helper_are_accepted(forwarding_lib: Sources) -> None:
    for api in (forwarding_lib, LiveSources(forwarding_lib)):
        assert check_calls([save_call(use_cuda_graphs=True, backend_config=None)], api) == []
        assert check_calls([save_call(use_cuda_graph=True)], api) == [
            "fwdlib.save does not accept the keyword 'use_cuda_graph'"]


def test_live_signatures_of_the_installed_executorch_check_our_calls() -> None:
    executorch = installed_root("executorch")
    assert executorch is not None
    live = LiveSources(Sources({"executorch": executorch}))
    spec = BuildSpec.model_validate(spec_data("mlp", target={"kind": "tensorrt", "device_resident_io": True}))
    config = build_backend_config(spec.target)  # type: ignore[arg-type]
    assert check_calls([config], live) == []
    to_executorch = build_steps(spec.model_copy(update={"methods": {"encode": spec.methods["forward"]}}))[-1].call
    assert to_executorch.callee == "executorch.exir.EdgeProgramManager.to_executorch"
    assert check_calls([to_executorch], live) == []
    renamed = [Call("executorch.exir.passes.MemoryPlanningPass", "class", kwargs={"alloc_graph_inputs": False}),
               Call("executorch.exir.EdgeProgramManager.to_executorch", "classmethod"),
               Call("executorch.exir.NoSuchThing", "class")]
    problems = check_calls(renamed, live)
    assert problems[0] == "executorch.exir.passes.MemoryPlanningPass does not accept the keyword 'alloc_graph_inputs'"
    assert problems[1] == ("executorch.exir.EdgeProgramManager.to_executorch is a method in the installed source, "
                           "expected a classmethod")
    assert problems[2].startswith("executorch.exir.NoSuchThing: cannot be imported here (AttributeError")


@pytest.mark.parametrize(("target", "stage", "requested", "expected"), [
    ("xnnpack", "validate", None, MemoryLimit(mib=8192, kind="address_space")),
    ("xnnpack", "validate", 4096, MemoryLimit(mib=4096, kind="address_space")),
    ("xnnpack", "export", None, None),
    ("portable", "export", 2048, MemoryLimit(mib=2048, kind="address_space")),
    # CUDA cannot start under an address-space limit: GPU children are bounded by resident memory.
    ("tensorrt", "validate", None, MemoryLimit(mib=32768, kind="resident")),
    ("tensorrt", "validate", 8192, MemoryLimit(mib=8192, kind="resident")),
    ("tensorrt", "export", None, None),
    ("tensorrt", "export", 65536, MemoryLimit(mib=65536, kind="resident")),
])
def test_memory_bounds_per_target(target: str, stage: Any, requested: int | None,
                                  expected: MemoryLimit | None) -> None:
    assert get_target(target).memory_limit(stage, requested) == expected


def test_a_resident_memory_watch_kills_a_growing_child(tmp_path: Path) -> None:
    spec = BuildSpec.model_validate(spec_data("grows_slowly", methods={"forward": {"inputs": [
        {"name": "x", "shape": [4, 32]}]}}))
    with pytest.raises(ChildProcessFailed) as info:
        run_isolated("export", ExportRequest(spec=spec, out_dir=str(tmp_path / "out")), ExportedProgramDir,
                     timeout_s=120, scratch_dir=tmp_path, memory_limit=MemoryLimit(mib=1024, kind="resident"))
    message = str(info.value)
    assert "of resident memory, over its limit of resident memory (watched, killed above) 1024 MiB" in message
    used = int(message.split(" used ")[1].split(" MiB")[0])
    assert 1024 < used < 8192  # stopped early, not after the whole 8 GiB


def test_a_gpu_spec_bounds_its_export_child_by_resident_memory(tmp_path: Path) -> None:
    # The same growing factory under a TensorRT spec's export bound: watched, so no RLIMIT_AS error.
    spec = BuildSpec.model_validate(spec_data("grows_slowly", export_memory_limit_mib=1024, target="tensorrt",
                                              methods={"forward": {"inputs": [{"name": "x", "shape": [4, 32]}]}}))
    with pytest.raises(ExportFailed, match="over its limit of resident memory"):
        export_program(spec, tmp_path / "out")


def test_synchronized_leaves_cpu_calls_alone() -> None:
    # Its CUDA side is proven on a GPU in tests/targets/test_cuda.py.
    def call() -> int:
        return 7

    assert synchronized(call, "cpu") is call


@pytest.mark.parametrize(("target", "factory", "fraction"), [("xnnpack", "convnet", 1.0), ("portable", "convnet", 0.0)])
def test_delegation_read_from_the_pte_agrees_with_the_edge_count(target: str, factory: str, fraction: float,
                                                                 tmp_path: Path) -> None:
    from prefect_executorch.program import read_program
    from prefect_executorch.spec.inputs import dynamic_shapes, example_inputs
    from prefect_executorch.spec.modelref import load_model
    from prefect_executorch.targets.delegation import facts_from_program

    spec = BuildSpec.model_validate(spec_data(factory, target=target))
    chosen = get_target(target)
    method = spec.methods["forward"]
    program = chosen.export_method(load_model(spec), example_inputs(method, seed=0), dynamic_shapes(method), spec)
    edge_facts = chosen.lower({"forward": program}, spec, tmp_path).delegation
    assert edge_facts is not None
    read = facts_from_program({"forward": program}, read_program(tmp_path / "model.pte"))["forward"]
    assert read.fraction == pytest.approx(fraction) and edge_facts["forward"].fraction == pytest.approx(fraction)
    assert read.total_ops > 0
    assert bool(read.undelegated) == bool(edge_facts["forward"].undelegated)
