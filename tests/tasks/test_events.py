"""Prefect events from the tasks, read back from the session's real Prefect API (prefect_test_harness)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prefect import flow

from prefect_executorch.artifacts.store import LocalStore
from prefect_executorch.errors import PrefectExecutorchError, ValidationFailed
from prefect_executorch.flows.build import build_bundle
from prefect_executorch.flows.promote import promote as promote_flow
from prefect_executorch.hashing import sha256_file
from prefect_executorch.spec.buildspec import parse_spec
from prefect_executorch.tasks.assets import asset_uri, bundle_asset_key
from prefect_executorch.tasks.events import EXPORT_FAILED, PROMOTED, PUBLISHED, PULLED, REUSED, VALIDATION_FAILED
from prefect_executorch.tasks.pull import pull_bundle

from helpers import spec_data

pytestmark = pytest.mark.usefixtures("prefect_harness")
MLP = {"forward": {"inputs": [{"name": "x", "shape": [2, 32]}]}}


def read_events(names: Any, resource_prefix: str, expected: int, timeout_s: float = 60) -> list[Any]:
    """Events named by ``names`` (an EventNameFilter) about resources under ``resource_prefix``, once ``expected`` arrived."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventResourceFilter

    deadline = time.monotonic() + timeout_s
    while True:
        with get_client(sync_client=True) as client:
            page = client.read_events(EventFilter(event=names, resource=EventResourceFilter(id_prefix=[resource_prefix])),
                                      limit=50)
        if len(page.events) >= expected or time.monotonic() > deadline:
            return sorted(page.events, key=lambda e: e.occurred)
        time.sleep(1)


def bundle_events(store_url: str, expected: int) -> list[Any]:
    """The prefect-executorch events about bundles of ``store_url``."""
    from prefect.events.filters import EventNameFilter

    found = read_events(EventNameFilter(prefix=["prefect-executorch."]), f"prefect-executorch.bundle.{store_url}/",
                        expected)
    return [e for e in found if e.resource.get("prefect-executorch.store") == store_url]


def asset_events(key_prefix: str, expected: int) -> list[Any]:
    """Prefect's asset materialization events for keys under ``key_prefix``."""
    from prefect.events.filters import EventNameFilter

    return read_events(EventNameFilter(name=["prefect.asset.materialization.succeeded"]), key_prefix, expected)


@flow
def pull_in_a_flow(store: str, dest: str) -> None:
    """The pull task as a deployment runs it."""
    pull_bundle(store, "mlp", dest, alias="prod")


def test_publish_promote_pull_and_a_failed_validation_are_events_about_the_bundle(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    spec = parse_spec(spec_data("mlp", methods=MLP, validation={"samples": 1, "latency_runs": 0}))
    ref = build_bundle(spec, store=store.url)
    record = promote_flow("mlp", "1", "prod", store=store.url)
    assert promote_flow("mlp", "1", "prod", store=store.url) == record  # already there: no second event
    pull_in_a_flow(store.url, str(tmp_path / "pulled"))
    # Zero tolerance on portable kernels: the validation fails and nothing is published.
    tight = parse_spec(spec_data("mlp", version="2", methods=MLP, target="portable",
                                 validation={"samples": 1, "latency_runs": 0, "atol": 0, "rtol": 0, "min_cosine": 1}))
    with pytest.raises(ValidationFailed):
        build_bundle(tight, store=store.url)

    events = bundle_events(store.url, expected=4)
    assert [e.event for e in events] == [PUBLISHED, PROMOTED, PULLED, VALIDATION_FAILED]
    published, promoted, pulled, failed = events
    bundle_id = f"prefect-executorch.bundle.{store.url}/{ref.key.prefix}"
    for event in (published, promoted, pulled):
        assert event.resource.id == bundle_id  # one stable id for every event about the bundle
        assert event.resource["prefect-executorch.manifest-sha256"] == ref.manifest_sha256
        assert (event.resource["prefect-executorch.name"], event.resource["prefect-executorch.version"]) == ("mlp", "1")
        assert event.resource["prefect-executorch.target"] == "xnnpack"
        assert event.resource["prefect-executorch.compat"] == ref.key.compat
    assert sha256_file(tmp_path / "pulled" / "manifest.json") == ref.manifest_sha256
    assert published.payload["validation_passed"] is True and published.payload["manifest_key"] == ref.manifest_key
    assert published.resource["prefect-executorch.validated"] == "true"  # what the staging trigger matches
    assert published.resource["prefect-executorch.retrain"] == "false"  # a build, not a retrain: staging moves
    assert promoted.payload["alias"] == "prod" and promoted.payload["forced"] is False
    assert promoted.payload["moved_by"] == record.moved_by and promoted.payload["previous"] is None
    related = {r.role: r.id for r in promoted.related}
    assert related["alias"] == f"prefect-executorch.alias.{store.url}/mlp/prod"
    assert related["flow-run"].startswith("prefect.flow-run.")  # Prefect ties it to the promote run
    assert pulled.payload["alias"] == "prod"
    assert failed.resource.id.startswith(f"prefect-executorch.bundle.{store.url}/mlp/2/portable/")
    assert "prefect-executorch.manifest-sha256" not in failed.resource  # nothing was published
    assert "validation cases failed" in failed.payload["error"]

    # Prefect's asset lineage: the bundle, then the alias materialized from it.
    bundle_asset = bundle_asset_key(store.url, ref.key)
    alias_asset = f"{asset_uri(store.url)}/mlp/aliases/prod"
    assets = asset_events(asset_uri(store.url), expected=2)
    assert {e.resource.id for e in assets} == {bundle_asset, alias_asset}
    alias_event = next(e for e in assets if e.resource.id == alias_asset)
    assert {(r.role, r.id) for r in alias_event.related} >= {("asset", bundle_asset),
                                                             ("asset-materialized-by", "prefect-executorch")}


def test_a_cache_hit_and_the_clis_commands_are_events_and_a_link_to_the_bundle(tmp_path: Path) -> None:
    """A rebuild that exports nothing says so, from a flow and from the CLI; the CLI's promote emits like the flow's."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.settings import PREFECT_API_URL

    store = LocalStore(tmp_path / "store")
    data = spec_data("mlp", methods=MLP, validation={"samples": 1, "latency_runs": 0})
    ref = build_bundle(parse_spec(data), store=store.url)
    assert build_bundle(parse_spec(data), store=store.url).manifest_sha256 == ref.manifest_sha256
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(data))
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    for command in (["build", str(spec_file)], ["promote", "mlp", "1", "--alias", "prod"]):
        done = subprocess.run([sys.executable, "-m", "prefect_executorch.cli", *command, "--store", store.url], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Still processing items" not in done.stderr  # Prefect's queues draining at exit: not the user's business

    events = bundle_events(store.url, expected=4)
    assert [(e.event, e.payload.get("how")) for e in events] == [
        (PUBLISHED, None), (REUSED, "flow"), (REUSED, "cli"), (PROMOTED, None)]
    assert all(e.resource["prefect-executorch.manifest-sha256"] == ref.manifest_sha256 for e in events)
    assert events[3].payload["alias"] == "prod"
    with get_client(sync_client=True) as client:
        links = [link for link in client.read_artifacts(
                 artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["bundle-mlp-xnnpack"])))
                 if store.url in str(link.data)]  # this test's builds (the session's other tests build mlp too)
    assert sorted(link.description.split(";")[0] for link in links) == [
        "cache hit: an identical build's bundle, nothing exported", "published"]
    key = ref.key
    assert all(f"- **manifest:** `{store.url.rstrip('/')}/{ref.manifest_key}`" in str(link.data) for link in links)
    assert all(f"prefect-executorch pull mlp --version 1 --target xnnpack --compat {key.compat}" in str(link.data)
               for link in links)


@pytest.mark.parametrize(("factory", "error", "output"), [("raises", "SpecError", True),
                                                        ("kills_itself", "ExportFailed", False)])
def test_every_failed_export_is_an_event_and_leaves_its_summary(tmp_path: Path, factory: str, error: str,
                                                                output: bool) -> None:
    """A model factory that raises, or whose process dies: the export.failed event the notify automation fires on, and
    the build's summary saying what failed, with the child's output beside it (a killed child printed none)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    store = LocalStore(tmp_path / "store")
    # A version of its own: the session's server holds other tests' failed builds of these factories too.
    spec = parse_spec(spec_data(factory, version=f"events-{factory}", methods=MLP,
                                validation={"samples": 1, "latency_runs": 0}))
    with pytest.raises(PrefectExecutorchError) as raised:
        build_bundle(spec, store=store.url)
    events = bundle_events(store.url, expected=1)
    assert [e.event for e in events] == [EXPORT_FAILED]
    assert events[0].payload["error"] == str(raised.value).splitlines()[0]
    with get_client(sync_client=True) as client:
        summaries = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(
            any_=[f"build-{spec.name}-xnnpack"])))
        outputs = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(
            any_=[f"child-output-{spec.name}-xnnpack"])))
    ours = [a for a in summaries if str(a.data).startswith(f"# {spec.name} {spec.version} xnnpack: FAILED at export")]
    assert len(ours) == 1 and str(raised.value).splitlines()[0] in str(ours[0].data), summaries
    assert f"**{error}:**" in str(ours[0].data) and type(raised.value).__name__ == error
    assert output == (f"`child-output-{spec.name}-xnnpack`" in str(ours[0].data))
    assert not output or outputs
