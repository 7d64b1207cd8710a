"""The worker's routing decision, fed real probe data; pools, queues and the deployments file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from prefect_executorch.fleet.deploy import plan_pools, pool_template
from prefect_executorch.fleet.placement import MatrixCell, Placement, describe_run, pool_install_command, route
from prefect_executorch.fleet.worker import TOOLCHAIN_ENV, advertised, default_worker_name, worker_toolchain
from prefect_executorch.machine.toolchain import GpuInfo, Toolchain, probe

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parents[1] / "fixtures"
SPEC = {"name": "m", "version": "1", "model": "x.py:f", "methods": {}}

# The H200 probe is real (tests/fixtures/probe_h200.json: torch 2.11.0+cu130, no TensorRT). The
# cu132 and cu134 workers are that probe with the versions a cu132 / cu134 install reports, and
# for cu134 a Blackwell GPU (sm100) in place of the H200.
H200_CU130 = Toolchain.model_validate_json((FIXTURES / "probe_h200.json").read_text())
H200_CU132 = H200_CU130.model_copy(update={
    "torch": "2.14.0+cu132", "cuda_version": "13.2", "cuda_channel": "cu132", "executorch": "1.4.1",
    "torch_tensorrt": "2.14.0+cu132", "tensorrt": "11.1.0.5", "tensorrt_executorch_runtime": "0.1.0",
})
B200_CU134 = H200_CU132.model_copy(update={
    "torch": "2.14.0+cu134", "cuda_version": "13.4", "cuda_channel": "cu134", "torch_tensorrt": "2.14.0+cu134",
    "gpus": [GpuInfo(index=0, name="NVIDIA B200", sm="sm100", total_memory_mib=183359)], "hostname": "b200",
})


def _route(toolchain: Toolchain, pool: str | None = None, queue: str | None = None,
           placement: dict[str, Any] | None = None, gpu_index: int | None = None, **job_variables: Any) -> Any:
    parameters: dict[str, Any] = {"spec": SPEC}
    if placement is not None:
        parameters["placement"] = placement
    return route(parameters, job_variables, pool, queue, toolchain, gpu_index)


def test_cu132_sm90_worker_takes_its_own_runs() -> None:
    decision = _route(H200_CU132, "gpu-cu132", "sm90", {"channel": "cu132", "sm": "sm90"}, cuda_channel="cu132")
    assert decision.accepted and decision.reason == ""
    assert _route(H200_CU132, "gpu-cu132", "sm80", {"channel": "cu132", "sm": "sm80plus"}).accepted
    assert _route(H200_CU132, "gpu-cu132", "sm90", tensorrt="11.1").accepted


def test_cu132_sm90_worker_refuses_a_cu134_sm100_run_naming_both_sides() -> None:
    decision = _route(H200_CU132, "gpu-cu134", "sm100", {"channel": "cu134", "sm": "sm100"},
                      install=pool_install_command("cu134"))
    assert not decision.accepted
    assert "the run needs CUDA channel cu134 (parameter placement.channel)" in decision.reason
    assert "the run needs GPU arch sm100 (parameter placement.sm)" in decision.reason
    assert "but this worker is cu132 (torch 2.14.0+cu132), GPU 0 NVIDIA H200 sm90, TensorRT 11.1.0.5" in decision.reason
    assert "nightly/cu134" in decision.reason  # how to get the toolchain the run needs


def test_cu134_sm100_worker_refuses_a_cu132_sm90_run() -> None:
    decision = _route(B200_CU134, "gpu-cu132", "sm90")
    assert not decision.accepted
    assert "needs CUDA channel cu132 (work pool 'gpu-cu132')" in decision.reason
    assert "needs GPU arch sm90 (work queue 'sm90')" in decision.reason
    assert "this worker is cu134 (torch 2.14.0+cu134), GPU 0 NVIDIA B200 sm100" in decision.reason
    assert _route(B200_CU134, "gpu-cu134", "sm100").accepted
    # Hardware-compatible engines (sm80plus) run on Blackwell too; sm100plus does not fit an H200.
    assert _route(B200_CU134, "gpu-cu134", "sm80", {"channel": "cu134", "sm": "sm80plus"}).accepted
    refused = _route(H200_CU132, "gpu-cu132", None, {"channel": "cu132", "sm": "sm100plus"})
    assert "needs GPU arch sm100plus" in refused.reason and "NVIDIA H200 sm90" in refused.reason


def test_the_real_h200_probe_and_this_machine() -> None:
    assert _route(H200_CU130, "gpu-cu130", "sm90").accepted
    refused = _route(H200_CU130, "gpu-cu132", "sm90")
    assert "this worker is cu130 (torch 2.11.0+cu130), GPU 0 NVIDIA H200 sm90, no TensorRT" in refused.reason
    assert "needs TensorRT 11.1 (job variable tensorrt)" in _route(H200_CU130, "gpu-cu130", tensorrt="11.1").reason
    here = probe()
    assert _route(here, "cpu", "default").accepted
    no_gpu = _route(here, "gpu-cu132", "sm90")
    assert not no_gpu.accepted and "no CUDA" in no_gpu.reason and f"torch {here.torch}" in no_gpu.reason


def test_a_worker_started_without_the_cli_probes_this_machine_in_a_child(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOOLCHAIN_ENV, H200_CU132.model_dump_json())
    assert worker_toolchain() == H200_CU132
    monkeypatch.delenv(TOOLCHAIN_ENV)
    found = worker_toolchain()
    here = probe()
    assert (found.arch, found.torch, found.cuda_channel, found.gpus) == (here.arch, here.torch, here.cuda_channel, here.gpus)


def test_the_workers_probe_leaves_no_forkserver_behind() -> None:
    """A worker lives for days: one probe must not leave a forkserver holding torch's imports beside it."""
    code = """
import os
from prefect_executorch.fleet.worker import worker_toolchain
worker_toolchain()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        status = open(f"/proc/{pid}/status").read()
        command = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode()
    except OSError:
        continue
    if f"\\nPPid:\\t{os.getpid()}\\n" in status:
        print("child:", command)
"""
    env = {k: v for k, v in os.environ.items() if k != TOOLCHAIN_ENV}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "forkserver" not in done.stdout, done.stdout


def test_contradicting_sources_are_refused_before_the_toolchain_is_asked() -> None:
    decision = _route(H200_CU132, "gpu-cu134", "sm90", {"channel": "cu132"})
    assert not decision.accepted
    assert ("the run asks for channel 'cu132' (parameter placement.channel) and 'cu134' (work pool 'gpu-cu134')"
            in decision.reason)
    assert "fix the deployment" in decision.reason
    queue_clash = _route(H200_CU132, "gpu-cu132", "sm80", {"channel": "cu132", "sm": "sm90"})
    assert "asks for sm 'sm90' (parameter placement.sm) but sits in queue 'sm80'" in queue_clash.reason
    assert _route(H200_CU132, "gpu-cu132", "sm90", {"channel": "cu132", "sm": "sm80plus"}).accepted  # narrower
    assert "sits in queue 'sm80'" in _route(H200_CU132, "gpu-cu132", "sm80", {"channel": "cu132", "sm": "sm90plus"}).reason
    assert "and 'sm100' (job variable sm)" in _route(H200_CU132, None, None, {"channel": "cu132", "sm": "sm90"},
                                                     sm="sm100").reason


def test_a_pinned_worker_answers_for_its_own_gpu() -> None:
    two = H200_CU132.model_copy(update={"gpus": [*H200_CU132.gpus, B200_CU134.gpus[0].model_copy(update={"index": 1})]})
    assert _route(two, "gpu-cu132", "sm100", gpu_index=1).accepted
    refused = _route(two, "gpu-cu132", "sm90", gpu_index=1)
    assert "GPU 1 NVIDIA B200 sm100" in refused.reason
    assert default_worker_name(two, 1, 4711) == "vm-cu132-sm100-trt11.1.0.5-gpu1-pid4711"
    assert advertised(two, 1)["executorch.gpu"] == "1:NVIDIA B200"


def test_a_matrix_run_only_dispatches_so_its_spec_asks_nothing() -> None:
    here = probe()
    assert route({"spec": SPEC, "targets": []}, {}, "cpu", "default", here).accepted
    assert default_worker_name(here, None, 12).endswith(f"-{here.cuda_channel or 'cpu'}-none-trtnone-pid12")


def test_placements_and_cells() -> None:
    cell = MatrixCell.model_validate({"target": "portable", "placement": {"channel": "cpu"}})
    assert (cell.placement.pool, cell.placement.queue, cell.label) == ("cpu", "default", "portable@cpu")
    gpu = Placement(channel="cu132", sm="sm80plus", tensorrt="11.1")
    assert (gpu.pool, gpu.queue) == ("gpu-cu132", "sm80")
    for bad in ({"channel": "cuda13"}, {"channel": "cu132", "sm": "90"}, {"channel": "cpu", "sm": "sm90"}):
        with pytest.raises(ValidationError):
            Placement.model_validate(bad)


def test_pool_templates_carry_the_channel_install() -> None:
    template = pool_template("gpu-cu134")["variables"]["properties"]
    assert template["cuda_channel"]["default"] == "cu134"
    assert template["install"]["default"] == pool_install_command("cu134")
    assert "cu134" in pool_install_command("cu134") and "--pre" in pool_install_command("cu134")
    assert pool_template("cpu")["variables"]["properties"]["cuda_channel"]["default"] is None


def test_deployments_file_pools_queues_and_install_lines() -> None:
    prefect_file = ROOT / "deployments" / "prefect.yaml"
    plans = {plan.name: plan.queues for plan in plan_pools(prefect_file)}
    assert plans == {"cpu": ["default"], **{f"gpu-{c}": ["default", "sm100", "sm80", "sm90"]
                                             for c in ("cu130", "cu132", "cu134")}}
    config = yaml.safe_load(prefect_file.read_text())
    for deployment in config["deployments"]:
        variables = deployment["work_pool"].get("job_variables", {})
        if "cuda_channel" in variables:
            assert deployment["work_pool"]["name"] == f"gpu-{variables['cuda_channel']}"
            assert variables["install"] == pool_install_command(variables["cuda_channel"])


def test_deployment_parameters_fit_the_flows() -> None:
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema
    from prefect.utilities.schema_tools.validation import validate

    config = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())
    triggers = 0
    for deployment in config["deployments"]:
        flow = load_flow_from_entrypoint(deployment["entrypoint"])
        schema = json.loads(parameter_schema(flow.fn).model_dump_json())
        validate(deployment.get("parameters", {}), schema, raise_on_error=True, ignore_required=True)
        for trigger in deployment.get("triggers", []):
            triggers += 1
            assert set(trigger["parameters"]) <= set(schema["properties"])
            assert trigger["expect"] in (["model.retrain.requested"], ["prefect-executorch.bundle.published"])
    assert triggers == 2  # the retrain hook and the staging automation


def test_a_tensorrt_spec_needs_a_gpu_wherever_it_lands() -> None:
    trt_spec = {**SPEC, "target": {"kind": "tensorrt"}}
    here = probe()
    refused = route({"spec": trt_spec}, {}, "cpu", "default", here)
    assert not refused.accepted and refused.reason.startswith("spec target 'tensorrt' needs a CUDA GPU, but this worker")
    assert route({"spec": trt_spec}, {}, "gpu-cu132", "sm90", H200_CU132).accepted
    with pytest.raises(ValidationError, match="needs a CUDA channel"):
        MatrixCell.model_validate({"target": "tensorrt", "placement": {"channel": "cpu"}})
    cell = MatrixCell.model_validate({"target": {"kind": "tensorrt", "precision": "fp16"},
                                      "placement": {"channel": "cu134", "sm": "sm100"}})
    assert cell.label == "tensorrt@cu134-sm100" and (cell.placement.pool, cell.placement.queue) == ("gpu-cu134", "sm100")


def test_a_worker_names_what_each_run_builds() -> None:
    assert describe_run("build-a-1-xnnpack", {"spec": SPEC}) == f"{SPEC['name']} {SPEC['version']} xnnpack (build-a-1-xnnpack)"
    cells = [{"target": {"kind": "xnnpack"}}, {"target": "portable"}]
    assert describe_run("m", {"spec": SPEC, "targets": cells}).endswith("xnnpack, portable (matrix) (m)")
    assert describe_run("promote-x", {"name": "x"}) == "promote-x"
