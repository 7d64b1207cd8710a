"""The build cache: an unchanged rebuild returns the published bundle without exporting."""

from __future__ import annotations

import shutil
from pathlib import Path
from uuid import UUID

import pytest
import torch

from prefect_executorch.artifacts.registry import verify_bundle_dir
from prefect_executorch.artifacts.store import LocalStore
from prefect_executorch.errors import BundleConflict
from prefect_executorch.fingerprint import build_fingerprint
from prefect_executorch.flows.build import build_bundle
from prefect_executorch.spec import BuildSpec
from prefect_executorch.toolchain import Toolchain, probe

from helpers import MODELS


def _task_states(flow_run_id: UUID) -> dict[str, str]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return {run.name.rsplit("-", 1)[0]: run.state.name for run in runs if run.state}


def _build(spec: BuildSpec, store: LocalStore, out: Path) -> tuple[object, dict[str, str]]:
    state = build_bundle(spec, store=str(store.root), output=str(out), return_state=True)
    return state.result(), _task_states(state.state_details.flow_run_id)


def _exports(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith("."))


@pytest.mark.usefixtures("prefect_harness")
def test_unchanged_rebuild_is_cached_and_a_lost_bundle_is_rebuilt(make_spec, tmp_path: Path) -> None:
    spec = make_spec("mlp", methods={"forward": {"inputs": [{"name": "x", "shape": [3, 32]}]}}, target="portable")
    store, out = LocalStore(tmp_path / "store"), tmp_path / "out"
    first, states = _build(spec, store, out)
    assert states["build-and-publish"] == "Completed" and "export" in states
    exports = _exports(out)
    assert len(exports) == 1

    second, states = _build(spec, store, out)
    assert second.cache_hit and not first.cache_hit
    assert second.model_copy(update={"cache_hit": False}) == first
    assert states["check-published"] == "Completed" and "build-and-publish" not in states
    assert "export" not in states and "validate" not in states
    assert _exports(out) == exports  # no export child ran: no new export directory

    # The bundle vanished from the store: the cache record alone must not be trusted.
    shutil.rmtree(store.root / first.key.prefix)
    third, states = _build(spec, store, out)
    assert states["build-and-publish"] == "Completed" and states["export"] == "Completed"
    assert len(_exports(out)) == 2
    assert third.key == first.key and verify_bundle_dir(store.root / third.key.prefix).spec_sha256 == spec.sha256()



@pytest.fixture(scope="module")
def toolchain() -> Toolchain:
    return probe()


@pytest.mark.usefixtures("prefect_harness")
def test_a_changed_build_of_a_published_version_is_refused_before_export(make_spec, tmp_path: Path) -> None:
    spec = make_spec("mlp", methods={"forward": {"inputs": [{"name": "x", "shape": [3, 32]}]}}, target="portable")
    store, out = LocalStore(tmp_path / "store"), tmp_path / "out"
    first, _ = _build(spec, store, out)
    changed = spec.model_copy(update={"validation": spec.validation.model_copy(update={"samples": 2})})
    with pytest.raises(BundleConflict, match=rf"{first.key.prefix} is already published .* by a different build "
                                             r"\(the spec differs\); nothing was exported"):
        build_bundle(changed, store=str(store.root), output=str(out))
    assert len(_exports(out)) == 1  # no second export directory: the refusal came first


def test_fingerprint_follows_content_not_paths(make_spec, toolchain: Toolchain, tmp_path: Path) -> None:
    torch.manual_seed(0)
    state = {"fc1.weight": torch.randn(64, 32), "fc1.bias": torch.zeros(64),
             "fc2.weight": torch.randn(8, 64), "fc2.bias": torch.zeros(8)}
    a, b = tmp_path / "a.pt", tmp_path / "elsewhere" / "b.pt"
    torch.save(state, a)
    b.parent.mkdir()
    shutil.copy(a, b)
    source = tmp_path / "models_copy.py"
    shutil.copy(MODELS, source)

    def key(**overrides: object) -> str:
        fields = {"model": f"{MODELS}:mlp", "weights": str(a), **overrides}
        return build_fingerprint(make_spec("mlp", **fields), toolchain, "cpu-xnnpack-x86_64", "/s").key()

    base = key()
    assert key(weights=str(b)) == base  # same bytes, other path
    assert key(model=f"{source}:mlp") == base  # same source, other path
    assert key(export_timeout_s=5, validation={"samples": 1, "timeout_s": 9}) == base  # limits are not content
    state["fc2.bias"] = torch.ones(8)
    torch.save(state, b)
    assert key(weights=str(b)) != base
    source.write_text(source.read_text() + "\n# edited\n")
    assert key(model=f"{source}:mlp") != base
    assert key(validation={"samples": 2}) != base
    assert key(target="portable") != base
    other = toolchain.model_copy(update={"executorch": "9.9.9"})
    assert build_fingerprint(make_spec("mlp", weights=str(a)), other, "cpu-xnnpack-x86_64", "/s").key() != base
    assert build_fingerprint(make_spec("mlp", weights=str(a)), toolchain, "cpu-xnnpack-x86_64", "/t").key() != base


@pytest.mark.usefixtures("prefect_harness")
def test_a_failed_cell_fails_the_retrain_and_promotes_nothing(make_spec, tmp_path: Path) -> None:
    from prefect_executorch.artifacts.aliases import list_aliases
    from prefect_executorch.errors import BuildFailed
    from prefect_executorch.flows.retrain import retrain

    spec = make_spec("raises")
    weights = tmp_path / "w.pt"
    torch.save({}, weights)
    store = LocalStore(tmp_path / "store")
    cells = [{"target": "xnnpack"}, {"target": "portable"}]
    with pytest.raises(BuildFailed) as info:
        retrain(name="raises", weights_uri=str(weights), spec=spec, targets=cells, store=str(store.root),
                output=str(tmp_path / "out"))
    message = str(info.value)
    assert "2 of 2 builds of raises 1-" in message
    assert "xnnpack@cpu: Failed" in message and "portable@cpu: Failed" in message
    assert "factory exploded on purpose" in message
    assert list_aliases(store, "raises") == {} and store.list("raises/") == []
