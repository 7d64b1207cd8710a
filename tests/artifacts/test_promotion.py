"""Promotion beside the bundle an alias serves: real XNNPACK builds of one model, a slower twin and a different one.

``mlp`` 1 is the baseline; 2 is ``mlp_slow`` (same outputs after a deep detour, several times
slower); 3 is ``mlp_other`` (same shapes, other weights). Each test uses its own alias.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from typer.testing import CliRunner

from prefect_executorch.artifacts.aliases import AliasRecord, alias_history, read_alias
from prefect_executorch.artifacts.manifest import BundleKey
from prefect_executorch.artifacts.promotion import PromotionRequest, promote_checked
from prefect_executorch.artifacts.store import LocalStore
from prefect_executorch.cli.main import app
from prefect_executorch.errors import PromotionRefused
from prefect_executorch.flows.build import build_bundle
from prefect_executorch.flows.promote import promote as promote_flow
from prefect_executorch.spec.buildspec import parse_spec
from prefect_executorch.spec.validation import ValidationSpec
from prefect_executorch.validate.report import ValidationReport

from helpers import spec_data

pytestmark = pytest.mark.usefixtures("prefect_harness")
MLP = {"forward": {"inputs": [{"name": "x", "shape": [2, 32]}]}}
#: Short latency windows: the slow twin is several times slower, far beyond any noise.
VALIDATION = {"samples": 1, "latency_runs": 5, "latency_max_s": 2}


@dataclass
class Builds:
    store: LocalStore
    keys: dict[str, BundleKey]


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory, prefect_harness: None) -> Builds:
    store = LocalStore(tmp_path_factory.mktemp("promotion") / "store")
    keys = {}
    for version, factory in (("1", "mlp"), ("2", "mlp_slow"), ("3", "mlp_other")):
        spec = parse_spec(spec_data(factory, name="mlp", version=version, methods=MLP, validation=VALIDATION))
        keys[version] = build_bundle(spec, store=str(store.root)).key
    return Builds(store=store, keys=keys)


def move(store: LocalStore, version: str, alias: str, moved_by: str | None = None, **gates: Any) -> AliasRecord:
    """Promote ``mlp`` ``version`` to ``alias`` through the side-by-side gate."""
    request = PromotionRequest(name="mlp", version=version, alias=alias, **gates)
    return promote_checked(store, request, moved_by=moved_by).record


def test_validation_latency_is_windowed_with_percentiles(builds: Builds) -> None:
    report = ValidationReport.model_validate_json((builds.store.root / builds.keys["1"].prefix / "validation.json")
                                                  .read_text())
    (latency,) = report.latency
    assert latency.eager is not None and latency.program is not None
    for stats in (latency.eager, latency.program):
        assert stats.windows >= 3 and stats.runs >= 15
        assert stats.p50_ms <= stats.p90_ms <= stats.p95_ms <= stats.p99_ms
    assert latency.program_median_ms == latency.program.p50_ms and latency.runs == latency.program.runs
    assert latency.stable == (latency.eager.stable and latency.program.stable)


def test_an_empty_alias_needs_no_comparison(builds: Builds) -> None:
    record = move(builds.store, "2", "empty")
    assert record.comparison is None and not record.forced and record.previous is None
    # Again to the same bundle (an automation and a retrain may race there): nothing moves, nothing is logged.
    assert move(builds.store, "2", "empty") == record
    assert len(alias_history(builds.store, "mlp", "empty")) == 1


def test_a_slower_candidate_cannot_take_the_alias_without_force_and_the_force_is_on_record(builds: Builds) -> None:
    store = builds.store
    move(store, "1", "prod")
    with pytest.raises(PromotionRefused, match=r"latency regression over prod: forward: \+\d+% slower window by window, "
                                               r"limit \+10% \(p50 "):
        move(store, "2", "prod")
    found = read_alias(store, "mlp", "prod")
    assert found is not None and found[0].version == "1"  # refused: nothing moved

    record = move(store, "2", "prod", force=True, moved_by="alice@ci")
    assert record.version == "2" and record.forced and record.moved_by == "alice@ci"
    assert record.previous is not None and record.previous.version == "1"
    assert len(record.overridden) == 1 and record.overridden[0].startswith("latency regression over prod: forward")
    assert record.comparison is not None
    (method,) = record.comparison.methods
    assert method.disagreeing == 0 and method.cases == ValidationSpec().samples  # same outputs: only latency overridden
    assert method.regression is not None and method.regression > 0.10
    history = alias_history(store, "mlp", "prod")
    assert [h.version for h in history] == ["1", "2"]
    assert history[-1].forced and history[-1].overridden == record.overridden and history[-1].moved_by == "alice@ci"


def test_a_looser_regression_limit_lets_the_slower_candidate_through(builds: Builds) -> None:
    move(builds.store, "1", "loose")
    record = move(builds.store, "2", "loose", max_latency_regression=1000)
    assert record.version == "2" and not record.forced and record.overridden == []
    assert record.comparison is not None and record.comparison.disagreements() == []


def test_disagreeing_outputs_are_refused_whatever_the_latency(builds: Builds) -> None:
    move(builds.store, "1", "other")
    with pytest.raises(PromotionRefused, match=r"outputs disagree with other: forward: 2 of 2 inputs disagree; "
                                               r"output \[0\] at static .* beyond atol=") as refused:
        move(builds.store, "3", "other", max_latency_regression=1000)
    assert "pass --allow-output-change if its outputs differ by design" in str(refused.value)
    assert "--max-latency-regression" not in str(refused.value)  # the latency passed: no advice about it
    # New weights differ by design: only latency is gated, and the disagreement stays on record.
    record = move(builds.store, "3", "other", allow_output_change=True, max_latency_regression=1000)
    assert record.version == "3" and not record.forced and record.comparison is not None
    assert record.comparison.disagreements()[0].startswith("forward: 2 of 2 inputs disagree")


def test_cli_refuses_with_one_message_and_records_force(builds: Builds) -> None:
    runner = CliRunner(env={"COLUMNS": "300"})
    store = str(builds.store.root)
    assert runner.invoke(app, ["promote", "mlp", "1", "--alias", "cli", "--store", store]).exit_code == 0
    negative = runner.invoke(app, ["promote", "mlp", "3", "--alias", "cli", "--max-latency-regression", "-0.5",
                                   "--store", store])
    assert negative.exit_code == 2 and "max-latency-regression" in negative.output
    refused = runner.invoke(app, ["promote", "mlp", "3", "--alias", "cli", "--store", store])
    assert refused.exit_code == 1 and "PromotionRefused" in refused.output and "Traceback" not in refused.output
    assert "outputs disagree with cli" in refused.output and "pass --force" in refused.output
    forced = runner.invoke(app, ["promote", "mlp", "3", "--alias", "cli", "--force", "--store", store])
    assert forced.exit_code == 0, forced.output
    assert "forced over: outputs disagree with cli" in forced.output and "differ" in forced.output
    found = read_alias(builds.store, "mlp", "cli")
    assert found is not None and found[0].forced and found[0].version == "3"


def test_flow_attaches_the_comparison_as_a_table_artifact(builds: Builds) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    move(builds.store, "1", "flow")
    record = promote_flow("mlp", "2", "flow", store=str(builds.store.root), force=True)
    assert record.forced
    with get_client(sync_client=True) as client:
        (artifact,) = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["promotion-mlp-flow"])), limit=1)
    assert artifact.type == "table" and "FORCED" in (artifact.description or "")
    assert "latency regression" in (artifact.description or "") and "forward" in str(artifact.data)


def test_a_refused_promotion_is_recorded_under_the_same_key_as_the_moves(builds: Builds) -> None:
    """The artifact's history of a model's alias holds its refusals too, with the comparison that refused."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    move(builds.store, "1", "refusals")
    with pytest.raises(PromotionRefused):
        promote_flow("mlp", "3", "refusals", store=str(builds.store.root))  # mlp_other's weights: outputs differ
    promote_flow("mlp", "2", "refusals", store=str(builds.store.root), max_latency_regression=100.0)
    with get_client(sync_client=True) as client:
        moved, refused = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["promotion-mlp-refusals"])), sort=ArtifactSort.CREATED_DESC)
    assert (refused.description or "").startswith("REFUSED refusals: ") and "outputs disagree" in (refused.description or "")
    assert (moved.description or "").startswith("MOVED refusals: 2 ")
    (row,) = json.loads(refused.data) if isinstance(refused.data, str) else refused.data
    assert row["method"] == "forward" and row["disagreeing"] == row["inputs"] != "0"


def test_programs_that_cannot_share_a_process_are_compared_in_two_children(builds: Builds,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect_executorch.artifacts.promotion import compare_bundles
    from prefect_executorch.isolation import run_isolated
    from prefect_executorch.targets import get_target

    current = move(builds.store, "1", "apart")
    validation = ValidationSpec.model_validate(VALIDATION)
    together = compare_bundles(builds.store, current, builds.keys["3"], validation=validation,
                               scratch_dir=builds.store.root.parent / "together")
    # As the cuda target declares: each program in a child of its own, the current one's outputs handed over.
    monkeypatch.setattr(type(get_target("xnnpack")), "one_program_per_process", True)
    children: list[str] = []
    monkeypatch.setattr("prefect_executorch.artifacts.promotion.run_isolated", _counting(children, run_isolated))
    apart = compare_bundles(builds.store, current, builds.keys["3"], validation=validation,
                            scratch_dir=builds.store.root.parent / "apart")
    assert children == ["current", "candidate"]
    (one,), (two,) = together.methods, apart.methods
    assert (two.cases, two.disagreeing) == (one.cases, one.disagreeing) == (1, 1)  # mlp_other's weights differ
    assert two.worst == one.worst
    assert two.current is not None and two.candidate is not None and two.shape_label == one.shape_label
    same = compare_bundles(builds.store, current, builds.keys["2"], validation=validation,
                           scratch_dir=builds.store.root.parent / "apart-same")
    assert same.disagreements() == [] and same.methods[0].cases == 1


def _counting(children: list[str], run: Any) -> Any:
    def counted(command: str, request: Any, *args: Any, **kwargs: Any) -> Any:
        children.append(request.alone)
        return run(command, request, *args, **kwargs)

    return counted
