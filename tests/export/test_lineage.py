"""Lineage and model card: what a bundle was built from, recorded in its manifest and shown in its report."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from prefect_executorch.artifacts.aliases import read_alias
from prefect_executorch.artifacts.publishing import list_bundles, read_manifest
from prefect_executorch.artifacts.store import LocalStore
from prefect_executorch.errors import SpecError
from prefect_executorch.export.lineage import collect_lineage
from prefect_executorch.hashing import sha256_file
from prefect_executorch.spec.buildspec import parse_spec
from prefect_executorch.tasks.prefect_artifacts import artifact_key

import models
from helpers import MODELS, spec_data

MLP = {"forward": {"inputs": [{"name": "x", "shape": [2, 32]}]}}
CARD = {"description": "A two-layer MLP for the tests.", "license": "Apache-2.0",
        "intended_use": "Exercising the pipeline", "limitations": "Random weights; predicts nothing."}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def test_lineage_records_the_commit_and_a_dirty_work_tree(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "nets").mkdir(parents=True)
    shutil.copy(MODELS, repo / "nets" / "model.py")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "model")
    spec = parse_spec(spec_data("mlp", model=f"{repo / 'nets' / 'model.py'}:mlp", methods=MLP))

    clean = collect_lineage(spec, training_run="run-7")
    assert clean.git is not None and clean.git.commit == git(repo, "rev-parse", "HEAD") and not clean.git.dirty
    assert [(s.path, s.sha256) for s in clean.sources] == [("nets/model.py", sha256_file(MODELS))]
    assert clean.model == "mlp" and clean.training_run == "run-7" and clean.weights_uri is None

    with (repo / "nets" / "model.py").open("a") as file:
        file.write("\n# edited after the commit\n")
    dirty = collect_lineage(spec)
    assert dirty.git is not None and dirty.git.dirty and dirty.git.commit == clean.git.commit
    assert dirty.sources[0].sha256 != clean.sources[0].sha256


def test_lineage_outside_git_keeps_the_digests(tmp_path: Path) -> None:
    shutil.copy(MODELS, tmp_path / "model.py")
    torch.save(models.mlp().state_dict(), tmp_path / "w.pt")
    spec = parse_spec(spec_data("mlp", model=f"{tmp_path / 'model.py'}:mlp", methods=MLP, weights=str(tmp_path / "w.pt")))
    lineage = collect_lineage(spec)
    assert lineage.git is None and [s.path for s in lineage.sources] == ["model.py"]
    assert lineage.weights_uri == str(tmp_path / "w.pt") and lineage.weights_sha256 == sha256_file(tmp_path / "w.pt")


def test_a_card_must_have_a_description() -> None:
    with pytest.raises(SpecError, match="card"):
        parse_spec(spec_data("mlp", methods=MLP, card={"license": "MIT"}))


@pytest.mark.usefixtures("prefect_harness")
def test_a_retrained_bundle_carries_its_lineage_and_card(tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from prefect_executorch.flows.retrain import retrain

    weights = tmp_path / "weights.pt"
    torch.save(models.mlp().state_dict(), weights)
    spec = parse_spec(spec_data("mlp", methods=MLP, card=CARD, validation={"samples": 1, "latency_runs": 0}))
    store = LocalStore(tmp_path / "store")
    (record,) = retrain(name="mlp", weights_uri=str(weights), spec=spec, targets=[{"target": "xnnpack"}],
                        store=str(store.root), training_run="run-42")
    (key,) = list_bundles(store, "mlp")
    manifest, _ = read_manifest(store, key)
    lineage = manifest.lineage
    assert lineage is not None
    assert lineage.training_run == "run-42" and lineage.weights_uri == str(weights)
    assert lineage.weights_sha256 == sha256_file(weights) == manifest.weights_sha256
    assert [(s.path, s.sha256) for s in lineage.sources] == [("tests/models.py", sha256_file(MODELS))]
    work_tree = MODELS.parent.parent
    assert lineage.git is not None and lineage.git.commit == git(work_tree, "rev-parse", "HEAD")
    assert manifest.card is not None and manifest.card.model_dump() == CARD
    found = read_alias(store, "mlp", f"staging-{key.compat}")
    assert found is not None and found[0].version == record.version and record.previous is None

    def artifact(key_: str) -> Any:
        """This build's artifact under ``key_`` (the session's other mlp builds share the key: its history)."""
        with get_client(sync_client=True) as client:
            found_ = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key_])))
        (mine, *_) = [a for a in found_ if key.version in f"{a.description} {a.data}"]
        return mine

    # Keyed per model and target, not version: each artifact's history is the model's builds on that target.
    report = artifact(artifact_key("validation", "mlp-xnnpack"))
    assert "## Model card" in str(report.data) and "**License:** Apache-2.0" in str(report.data)
    assert "Random weights; predicts nothing." in str(report.data)
    assert report.description.startswith("PASSED: validation of mlp-")
    table = json.loads(artifact(artifact_key("validation-table", "mlp-xnnpack")).data)
    assert list(table[0])[0] == "result" and table[0]["result"] == "pass"  # the verdict first
    assert all(isinstance(value, str) and len(value) < 60 for row in table for value in row.values())
    summary = str(artifact(artifact_key("build", "mlp", "xnnpack")).data)
    assert summary.startswith(f"# mlp {key.version} xnnpack: PUBLISHED")
    assert f"`{key.compat}`" in summary and manifest.validation.worst.split(":")[0] in summary
    assert "forward 100%" in summary  # the delegated share, as the report counted it
