"""Real CPU builds through the Prefect flow: export -> validate -> publish -> pull -> run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prefect_executorch.artifacts.manifest import BundleKey
from prefect_executorch.artifacts.publishing import pull, verify_bundle_dir
from prefect_executorch.artifacts.store import LocalStore, ObjectStore
from prefect_executorch.errors import ExportFailed, ValidationFailed
from prefect_executorch.flows.build import build_bundle
from prefect_executorch.hashing import sha256_file
from prefect_executorch.machine.compat import cpu_compat
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.validate.report import ValidationReport

from helpers import check_bundle_runs, settled

pytestmark = pytest.mark.usefixtures("prefect_harness")

DYNAMIC_IMAGE = {"forward": {"inputs": [
    {"name": "image", "shape": [2, 3, 8, 8], "dynamic": {0: {"min": 1, "max": 4}}},
]}}


def _run_pulled(spec: BuildSpec, store: ObjectStore, key: BundleKey, dest: Path) -> None:
    """Pull the bundle into a fresh directory and check every method against eager at new shapes."""
    manifest = pull(store, key, dest)
    check_bundle_runs(spec, dest, manifest)


def test_convnet_dynamic_batch_end_to_end(make_spec, tmp_path: Path) -> None:
    spec = make_spec("convnet", methods=DYNAMIC_IMAGE, validation={"samples": 1})
    store = LocalStore(tmp_path / "store")
    ref = build_bundle(spec, store=str(store.root), output=str(tmp_path / "out"))
    assert ref.key.prefix == "convnet/1/xnnpack/cpu-xnnpack-x86_64"
    bundle = store.root / ref.key.prefix
    assert sorted(p.name for p in bundle.iterdir()) == ["manifest.json", "model.bpte", "model.pte", "validation.json"]
    manifest = verify_bundle_dir(bundle)
    for entry in manifest.files:
        assert sha256_file(bundle / entry.path) == entry.sha256
    assert manifest.validation.passed and manifest.validation.shapes == {"forward": ["min", "opt", "max"]}
    assert "XnnpackBackend" in manifest.methods["forward"].delegates
    assert manifest.spec_sha256 == spec.sha256()
    _run_pulled(spec, store, ref.key, tmp_path / "pulled")

    # An unchanged rebuild returns the published bundle (tests/tasks/test_cache.py shows it does not export).
    assert build_bundle(spec, store=str(store.root), output=str(tmp_path / "out")) == ref.model_copy(update={"cache_hit": True})
    assert verify_bundle_dir(bundle) == manifest


def test_two_outputs_two_methods_portable(make_spec, tmp_path: Path) -> None:
    methods = {"forward": {"inputs": [{"name": "x", "shape": [3, 32]}]},
               "encode": {"inputs": [{"name": "x", "shape": [3, 32]}]}}
    spec = make_spec("mlp", methods=methods, target="portable")
    store = LocalStore(tmp_path / "store")
    ref = build_bundle(spec, store=str(store.root))
    manifest = verify_bundle_dir(store.root / ref.key.prefix)
    assert manifest.delegates() == {"forward": [], "encode": []}
    _run_pulled(spec, store, ref.key, tmp_path / "pulled")

    two = make_spec("two_outputs", methods={"forward": {"inputs": [{"name": "x", "shape": [5, 16]}]}})
    ref2 = build_bundle(two, store=str(store.root))
    bundle2 = store.root / ref2.key.prefix
    assert verify_bundle_dir(bundle2).validation.shapes == {"forward": ["static"]}
    report = ValidationReport.model_validate_json((bundle2 / "validation.json").read_text())
    assert [o.path for o in report.cases[0].outputs] == ["[0]", "[1]"]
    _run_pulled(two, store, ref2.key, tmp_path / "pulled2")


def test_a_build_computes_its_compat_key_once(make_spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def counted(*args: Any, **kwargs: Any) -> str:
        key = cpu_compat(*args, **kwargs)  # the real builder: this only counts
        calls.append(key)
        return key

    # The CPU targets hold the builder by name; patch that name and the module's, so no call escapes the count.
    monkeypatch.setattr("prefect_executorch.machine.compat.cpu_compat", counted)
    monkeypatch.setattr("prefect_executorch.targets.cpu.cpu_compat", counted)
    spec = make_spec("mlp", methods={"forward": {"inputs": [{"name": "x", "shape": [3, 32]}]}},
                     validation={"samples": 1, "latency_runs": 0})
    store = LocalStore(tmp_path / "store")
    ref = build_bundle(spec, store=str(store.root), output=str(tmp_path / "out"))
    assert calls == [ref.key.compat] == [verify_bundle_dir(store.root / ref.key.prefix).compat]


def test_external_weights_are_a_paired_ptd(make_spec, tmp_path: Path) -> None:
    spec = make_spec("mlp", methods={"forward": {"inputs": [{"name": "x", "shape": [3, 32]}]}}, external_weights=True)
    store = LocalStore(tmp_path / "store")
    ref = build_bundle(spec, store=str(store.root))
    manifest = verify_bundle_dir(store.root / ref.key.prefix)
    assert manifest.data_files == ["model.ptd"]
    ptd = manifest.file("model.ptd")
    assert ptd.role == "data" and ptd.size > 32 * 64 * 4  # the weights moved out of the .pte
    assert manifest.file("model.pte").size < ptd.size
    _run_pulled(spec, store, ref.key, tmp_path / "pulled")


def test_failed_validation_stops_the_flow_and_publishes_nothing(make_spec, tmp_path: Path) -> None:
    spec = make_spec("convnet", validation={"samples": 1, "atol": 0, "rtol": 0})
    store = LocalStore(tmp_path / "store")
    with pytest.raises(ValidationFailed, match="beyond atol=0"):
        build_bundle(spec, store=str(store.root), output=str(tmp_path / "out"))
    assert store.list("") == []


def test_export_child_crash_is_a_failed_task(make_spec, tmp_path: Path) -> None:
    spec = make_spec("aborts")
    with pytest.raises(ExportFailed, match="SIGABRT") as info:
        build_bundle(spec, store=str(tmp_path / "store"), output=str(tmp_path / "out"))
    # The child's own output (the Python stack it aborted in), beside the message.
    assert "Fatal Python error: Aborted" in info.value.child_output and "in aborts" in info.value.child_output
    assert info.value.child_output not in str(info.value) and "\n" not in str(info.value)
    assert [p.name for p in (tmp_path / "out").iterdir()] == []  # no half export left behind


def test_a_failed_build_reads_as_one_error_line_with_the_childs_output_beside_it(make_spec, tmp_path: Path) -> None:
    """In the run's logs one ERROR line names the cause (no traceback, not once per task it went through); the
    state message is that line; the child's stderr is an artifact keyed per model and target."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
        LogFilter,
        LogFilterFlowRunId,
    )
    from prefect.logging.handlers import APILogHandler

    state = build_bundle(make_spec("aborts"), store=str(tmp_path / "store"), output=str(tmp_path / "out"),
                         return_state=True)
    APILogHandler().flush()
    run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(run_id)
        # The flush waits 5 s at most for the logs to reach the server.
        logs = settled(lambda: client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id]))),
                       until=lambda logs: any(log.level >= 40 for log in logs))
        (artifact,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["child-output-aborts-xnnpack"]),
                                           flow_run_id=ArtifactFilterFlowRunId(any_=[run_id])))
    errors = [log.message for log in logs if log.level >= 40]
    assert len(errors) == 1 and errors[0].startswith("ExportFailed: export of aborts 1 for xnnpack child process "
                                                     "was killed by SIGABRT"), errors
    assert not [log.message for log in logs if "Traceback" in log.message]
    assert run.state is not None and run.state.is_failed() and "\n" not in (run.state.message or "")
    assert "killed by SIGABRT" in (run.state.message or "")
    assert "~~~~text\n" in str(artifact.data) and "Fatal Python error: Aborted" in str(artifact.data)
