"""Validation against eager PyTorch on real XNNPACK exports: cases, gates, crashes, hangs, re-validation.

Two real builds are shared by the module (an XNNPACK export takes 25-60 s here): ``published`` (XNNPACK,
weights in a .ptd) passes and is published to a local store; ``tight`` (portable) fails its tolerance,
so nothing is published.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

from prefect_executorch.artifacts.aliases import move_alias
from prefect_executorch.artifacts.manifest import BundleKey
from prefect_executorch.artifacts.publishing import verify_bundle_dir
from prefect_executorch.artifacts.store import LocalStore
from prefect_executorch.cli.main import app
from prefect_executorch.errors import ValidationFailed
from prefect_executorch.flows.build import build_bundle
from prefect_executorch.flows.revalidate import revalidate
from prefect_executorch.spec.buildspec import BuildSpec, load_spec, parse_spec
from prefect_executorch.validate.report import ValidationReport
from prefect_executorch.validate.validator import require_passed, validate_program

import models
from helpers import MODELS, spec_data

pytestmark = pytest.mark.usefixtures("prefect_harness")

DYNAMIC = {"forward": {"inputs": [{"name": "x", "shape": [2, 16], "dynamic": {0: {"min": 1, "max": 8}}}]}}
#: XNNPACK takes 3 of the model's 6 operators (two linears, sigmoid); topk, cumsum and gt stay outside.
DELEGATED = 0.5


def mixed_spec(**validation: Any) -> BuildSpec:
    settings = {"samples": 1, "latency_runs": 3, **validation}
    return parse_spec(spec_data("mixed", methods=DYNAMIC, validation=settings, external_weights=True))


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[BuildSpec, LocalStore, BundleKey]:
    """A passing XNNPACK build of ``mixed`` (weights in model.ptd), gated on its delegated fraction."""
    root = tmp_path_factory.mktemp("published")
    spec = mixed_spec(min_delegated_fraction=0.4, methods={"forward": {"extra_shapes": [[[5, 16]]]}})
    store = LocalStore(root / "store")
    ref = build_bundle(spec, store=str(store.root))
    return spec, store, ref.key


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> tuple[ValidationFailed, LocalStore]:
    """A portable build whose logits tolerance (atol = rtol = 0) its kernels cannot meet."""
    root = tmp_path_factory.mktemp("tight")
    validation = {"samples": 1, "latency_runs": 0, "outputs": {"['logits']": {"atol": 0, "rtol": 0}}}
    spec = parse_spec(spec_data("mixed", methods=DYNAMIC, target="portable", validation=validation))
    store = LocalStore(root / "store")
    with pytest.raises(ValidationFailed) as info:
        build_bundle(spec, store=str(store.root))
    return info.value, store


def test_matching_program_passes_at_every_shape_with_exact_ints_and_bools(published) -> None:
    spec, store, key = published
    bundle = store.root / key.prefix
    manifest = verify_bundle_dir(bundle)
    report = ValidationReport.model_validate_json((bundle / "validation.json").read_text())
    assert report.passed and manifest.validation.passed
    assert [(c.shape_label, c.input_shapes) for c in report.cases] == [
        ("min", [[1, 16]]), ("opt", [[2, 16]]), ("max", [[8, 16]]), ("extra[0]", [[5, 16]])]
    assert manifest.validation.shapes == {"forward": ["min", "opt", "max", "extra[0]"]}
    for case in report.cases:
        by_path = {o.path: o for o in case.outputs}
        assert list(by_path) == ["['logits']", "['top'][0]", "['top'][1]"]  # nested dict, program order
        assert by_path["['logits']"].expected_shape == [case.input_shapes[0][0], 8]
        assert by_path["['top'][0]"].actual_dtype == "int64" and by_path["['top'][1]"].actual_dtype == "bool"
        assert by_path["['top'][0]"].tolerance_source == "exact for int64"
        assert by_path["['top'][1]"].tolerance_source == "exact for bool"
        assert by_path["['logits']"].tolerance_source == "default for float32"
        assert 0 <= by_path["['logits']"].max_abs <= 1e-4
        assert all(lo >= -1 and hi <= 1 for lo, hi in case.input_ranges)  # the default uniform range


def test_delegated_fraction_is_read_from_the_lowered_program_and_gated(published) -> None:
    spec, store, key = published
    manifest = verify_bundle_dir(store.root / key.prefix)
    facts = manifest.methods["forward"].delegation
    assert facts is not None and facts.fraction == DELEGATED
    # Named as ExecuTorch's get_delegation_info names them (print_delegation_info shows the same).
    assert set(facts.undelegated) == {"aten_topk_default", "aten_cumsum_default", "aten_gt_scalar"}
    assert manifest.methods["forward"].delegates == ["XnnpackBackend", "XnnpackBackend"]
    assert manifest.validation.delegated_fraction == {"forward": DELEGATED}
    report = ValidationReport.model_validate_json((store.root / key.prefix / "validation.json").read_text())
    (gate,) = report.gates
    assert gate.passed and gate.measured == DELEGATED and gate.limit == 0.4
    (latency,) = report.latency
    # latency_runs=3 is the least per window; windows repeat until three agree (docs/promotion.md).
    assert latency.program is not None and latency.program.runs_per_window >= 3 and latency.program.windows >= 3
    assert latency.runs == latency.program.runs and latency.shape_label == "opt" and latency.program_median_ms > 0
    assert latency.ratio == pytest.approx(latency.program_median_ms / latency.eager_median_ms)


def test_failing_gates_fail_the_report_and_name_their_figures(published, tmp_path: Path) -> None:
    spec, store, key = published
    strict = mixed_spec(min_delegated_fraction=0.9, max_latency_ratio=1e-6)
    report = validate_program(strict, store.root / key.prefix, ["model.ptd"], scratch_dir=tmp_path,
                              delegation=verify_bundle_dir(store.root / key.prefix).delegation())
    assert all(case.passed for case in report.cases) and not report.passed
    assert [(g.gate, g.passed) for g in report.gates] == [("min_delegated_fraction", False), ("max_latency_ratio", False)]
    with pytest.raises(ValidationFailed) as info:
        require_passed(report)
    message = str(info.value)
    assert "validation.min_delegated_fraction on forward: 0.500 of operators delegated (3 of 6), below 0.9" in message
    assert "left outside: aten_cumsum_default x1" in message
    assert "validation.max_latency_ratio on forward" in message and "above 1e-06" in message
    assert report.describe_worst().startswith("gate validation.min_delegated_fraction")
    assert len(report.summary().gates_failed) == 2


def test_tolerance_failure_names_the_output_and_publishes_nothing(tight) -> None:
    error, store = tight
    message = str(error)
    assert "forward['logits']" in message
    assert "beyond atol=0 + rtol=0*|eager| from validation.outputs[\"['logits']\"]" in message
    assert store.list("") == []


def test_a_crashing_child_is_a_validation_failure_and_the_caller_lives(published, tmp_path: Path) -> None:
    spec, store, key = published
    bundle = store.root / key.prefix
    assert verify_bundle_dir(bundle).data_files == ["model.ptd"]
    # XNNPACK weights live in model.ptd; loading the program without it segfaults the runtime.
    with pytest.raises(ValidationFailed) as info:
        validate_program(spec, bundle, [], scratch_dir=tmp_path)
    message = str(info.value)
    assert "was killed by SIGSEGV" in message and "the ExecuTorch runtime crashed" in message
    assert "given: none" in message and "\n" not in message  # one line: the child's stderr is kept beside it
    assert info.value.child_output and info.value.child_output not in message
    report = validate_program(spec, bundle, ["model.ptd"], scratch_dir=tmp_path,
                              delegation=verify_bundle_dir(bundle).delegation())
    assert report.passed and report.used_data_file
    # A CPU target's validation child keeps its address-space limit (GPU children are watched instead).
    assert report.memory_bound == "address space (RLIMIT_AS) 8192 MiB"


def test_a_hanging_child_times_out(published, tmp_path: Path) -> None:
    spec, store, key = published
    hanging = mixed_spec(timeout_s=5, methods={"forward": {"dataset": f"{MODELS}:sleepy_dataset"}})
    started = time.monotonic()
    with pytest.raises(ValidationFailed, match="timed out after 5 s and was killed"):
        validate_program(hanging, store.root / key.prefix, ["model.ptd"], scratch_dir=tmp_path)
    assert time.monotonic() - started < 40
    assert [p.name for p in tmp_path.iterdir()] == []  # the child's scratch files are gone too


def test_user_samples_from_a_file_and_a_dataset_with_value_ranges(published, tmp_path: Path) -> None:
    spec, store, key = published
    samples = [(torch.full((3, 16), 0.25),), (torch.linspace(-5, 5, 7 * 16).reshape(7, 16),)]
    torch.save(samples, tmp_path / "samples.pt")
    data = spec_data("mixed", external_weights=True, methods={"forward": {"inputs": [
        {"name": "x", "shape": [2, 16], "dynamic": {0: {"min": 1, "max": 8}}, "low": 2, "high": 3}]}},
        validation={"samples": 2, "latency_runs": 0, "methods": {"forward": {
            "samples_file": "samples.pt", "dataset": f"{MODELS}:mixed_dataset"}}})
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data))
    user = load_spec(tmp_path / "spec.yaml")  # samples_file resolves against the spec's directory
    report = validate_program(user, store.root / key.prefix, ["model.ptd"], scratch_dir=tmp_path)
    assert report.passed
    by_label: dict[str, list[Any]] = {}
    for case in report.cases:
        by_label.setdefault(case.shape_label, []).append(case)
    assert [c.input_shapes for c in by_label["samples_file"]] == [[[3, 16]], [[7, 16]]]
    assert [c.input_ranges for c in by_label["samples_file"]] == [[[0.25, 0.25]], [[-5.0, 5.0]]]
    assert [c.input_shapes for c in by_label["dataset"]] == [[[1, 16]], [[4, 16]], [[6, 16]]]
    random_cases = [c for label in ("min", "opt", "max") for c in by_label[label]]
    assert len(random_cases) == 6
    assert all(2 <= lo <= hi < 3 for c in random_cases for lo, hi in c.input_ranges)


def _write_spec(path: Path, **overrides: Any) -> Path:
    path.write_text(json.dumps(spec_data("mixed", methods=DYNAMIC, validation={"samples": 1, "latency_runs": 2},
                                         external_weights=True, **overrides)))
    return path


def test_cli_revalidates_a_published_bundle_and_catches_drift(published, tmp_path: Path) -> None:
    spec, store, key = published
    url = f"{store.root}/{key.prefix}/manifest.json"
    runner = CliRunner(env={"COLUMNS": "300"})  # rich wraps table cells at the default 80
    result = runner.invoke(app, ["validate", str(_write_spec(tmp_path / "same.json")), "--bundle", url,
                                 "--output", str(tmp_path / "pulled"), "--report", str(tmp_path / "report.json")])
    assert result.exit_code == 0, result.output
    assert "pulled and verified mixed/1/xnnpack" in result.output and "validation passed" in result.output
    assert "3/6 (50%)" in result.output  # the delegated fraction, from the pulled manifest
    assert ValidationReport.model_validate_json((tmp_path / "report.json").read_text()).passed

    # The eager model drifts (new weights): the old bundle no longer matches it.
    torch.save({k: v + 0.05 for k, v in models.mixed().state_dict().items()}, tmp_path / "drifted.pt")
    drifted = _write_spec(tmp_path / "drifted.json", weights=str(tmp_path / "drifted.pt"))
    result = runner.invoke(app, ["validate", str(drifted), "--bundle", url])
    assert result.exit_code == 1
    assert "note: the spec differs" in result.output
    assert "ValidationFailed" in result.output and "forward['logits']" in result.output and "atol=0.0001" in result.output


def test_revalidate_flow_resolves_an_alias_and_passes(published, tmp_path: Path) -> None:
    spec, store, key = published
    move_alias(store, "mixed", key.version, "prod")
    report = revalidate("mixed", "prod", str(store.root), spec)
    assert report.passed and [c.shape_label for c in report.cases] == ["min", "opt", "max", "extra[0]"]
