"""Triage of a failed validation on a real portable export whose eager model departs from it at one layer.

The program is exported from ``mlp``; the eager model it is validated against loads the same weights
but with ``fc1`` scaled, so the program departs from eager at that layer and at everything after it.
Operator-level triage needs a runtime built with the event tracer (the PyPI wheel of ExecuTorch >= 1.5.1);
``test_triage_names_the_layer_that_departs`` skips with the probe's reason elsewhere, and
``test_triage_without_the_event_tracer_says_why`` runs only there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from prefect_executorch.errors import ValidationFailed
from prefect_executorch.export.exporter import ExportedProgramDir, export_program
from prefect_executorch.spec.buildspec import BuildSpec, parse_spec
from prefect_executorch.tasks.prefect_artifacts import artifact_key
from prefect_executorch.tasks.validate import validate_export
from prefect_executorch.validate.report import ValidationReport
from prefect_executorch.validate.triage import TriageReport, run_with_etdump, triage_failure
from prefect_executorch.validate.validator import require_passed, validate_program

import models
from helpers import spec_data

pytestmark = pytest.mark.usefixtures("prefect_harness")

METHODS = {"forward": {"inputs": [{"name": "x", "shape": [2, 32]}]}}
VALIDATION = {"samples": 1, "latency_runs": 0}


def event_tracer_missing(work: Path) -> str | None:
    """Why this runtime logs no intermediate outputs (None if it does): a one-operator program run with an ETDump."""
    from executorch.exir import to_edge

    program = to_edge(torch.export.export(torch.nn.ReLU(), (torch.randn(4),))).to_executorch()
    (work / "relu.pte").write_bytes(program.buffer)
    return run_with_etdump(work / "relu.pte", None, "forward", (torch.randn(4),), work)


@pytest.fixture(scope="module")
def tracer_missing(tmp_path_factory: pytest.TempPathFactory) -> str | None:
    return event_tracer_missing(tmp_path_factory.mktemp("probe"))


@pytest.fixture(scope="module")
def departed(tmp_path_factory: pytest.TempPathFactory) -> tuple[BuildSpec, ExportedProgramDir, ValidationReport, TriageReport, Path]:
    """Export ``mlp`` (portable), validate it against eager with fc1 scaled by 1.5, triage the failure."""
    root = tmp_path_factory.mktemp("departed")
    export = export_program(parse_spec(spec_data("mlp", target="portable", methods=METHODS, validation=VALIDATION)), root)
    weights = models.mlp().state_dict()
    weights["fc1.weight"] = weights["fc1.weight"] * 1.5
    torch.save(weights, root / "edited.pt")
    spec = parse_spec(spec_data("mlp", target="portable", methods=METHODS, validation=VALIDATION,
                                weights=str(root / "edited.pt")))
    report = validate_program(spec, export.path, export.data_files, scratch_dir=root)
    triage = triage_failure(spec, report, export.path, export.data_files, scratch_dir=root)
    assert triage is not None
    return spec, export, report, triage, root


def test_triage_names_the_layer_that_departs(departed, tracer_missing: str | None) -> None:
    if tracer_missing:
        pytest.skip(tracer_missing)
    _, _, report, triage, _ = departed
    assert not report.passed and triage.skipped is None, triage.skipped
    first, worst = triage.first, triage.worst
    assert first is not None and worst is not None
    # fc1 is the first operator of the program, and the one edited: it departs, so everything after it does too.
    assert first.position == 0 and first.operators == "linear" and first.module == "fc1 (Linear)"
    assert first.source is not None and first.source.startswith(f"{Path(models.__file__)}:")
    assert "self.fc2(torch.tanh(self.fc1(x)))" in first.source
    assert [gap.departs for gap in triage.operators] == [True] * len(triage.operators)
    assert {gap.module for gap in triage.operators} >= {"fc1 (Linear)", "fc2 (Linear)"}
    assert worst.max_abs_error == max(gap.max_abs_error for gap in triage.operators) > 1e-3
    assert triage.rows()[0] == first

    with pytest.raises(ValidationFailed) as info:
        require_passed(report, triage)
    assert f"worst operator of forward {triage.case}: {worst.operators} ({worst.module}" in str(info.value)


def test_triage_without_the_event_tracer_says_why(departed, tracer_missing: str | None) -> None:
    if not tracer_missing:
        pytest.skip("this runtime has the event tracer: triage runs (test_triage_names_the_layer_that_departs)")
    _, _, report, triage, _ = departed
    assert not report.passed
    assert triage.skipped == tracer_missing and "EXECUTORCH_ENABLE_EVENT_TRACER" in triage.skipped
    assert not triage.operators and triage.describe().startswith(f"triage of forward {triage.case} skipped: ")


def test_the_validate_task_attaches_the_triage_and_its_failure_names_the_operator(departed) -> None:
    spec, export, _, triage, root = departed
    with pytest.raises(ValidationFailed) as info:
        validate_export(spec, export, root)
    assert triage.describe() in str(info.value)
    with get_client(sync_client=True) as client:
        # Keyed per model and target: the session's other portable builds of this model share the key.
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[artifact_key("triage", f"{spec.name}-portable")])))
    (artifact, *_) = [a for a in found if a.description == triage.describe()
                      or f"{spec.name}-{spec.version}-portable" in (a.description or "")]
    if triage.skipped:
        assert artifact.type == "markdown" and triage.skipped in str(artifact.data)
    else:
        assert artifact.type == "table" and artifact.description == triage.describe()
        assert [row["operators"] for row in json.loads(str(artifact.data))] == [gap.operators for gap in triage.rows()]
