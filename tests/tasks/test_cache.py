"""The build cache: an unchanged rebuild returns the published bundle without exporting."""

from __future__ import annotations

import shutil
from pathlib import Path
from uuid import UUID

import pytest
import torch

from prefect_executorch.artifacts.publishing import verify_bundle_dir
from prefect_executorch.artifacts.store import LocalStore
from prefect_executorch.errors import BundleConflict
from prefect_executorch.export.fingerprint import build_fingerprint
from prefect_executorch.flows.build import build_bundle
from prefect_executorch.machine.toolchain import Toolchain, probe
from prefect_executorch.spec.buildspec import BuildSpec

from helpers import MODELS, settled


def _task_states(flow_run_id: UUID) -> dict[str, str]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        # Task runs are recorded from the events the flow's process sends: they may trail its return.
        runs = settled(lambda: client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))),
                       until=lambda runs: bool(runs) and all(run.state and run.state.is_final() for run in runs))
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
                                             r"\(spec fields changed: validation\.samples\); nothing was exported"):
        build_bundle(changed, store=str(store.root), output=str(out))
    assert len(_exports(out)) == 1  # no second export directory: the refusal came first


def _mlp_with_weights(make_spec, tmp_path: Path) -> BuildSpec:
    torch.manual_seed(0)
    weights = tmp_path / "w.pt"
    torch.save({"fc1.weight": torch.randn(64, 32), "fc1.bias": torch.zeros(64),
                "fc2.weight": torch.randn(8, 64), "fc2.bias": torch.zeros(8)}, weights)
    return make_spec("mlp", methods={"forward": {"inputs": [{"name": "x", "shape": [3, 32]}]}}, target="portable",
                     weights=str(weights))


def test_the_cache_key_is_the_fingerprint_made_before_the_task(make_spec, toolchain: Toolchain,
                                                               tmp_path: Path) -> None:
    from prefect_executorch.artifacts.rebuild import check_rebuild
    from prefect_executorch.tasks.cache import BuildCachePolicy

    spec = _mlp_with_weights(make_spec, tmp_path)
    store = LocalStore(tmp_path / "store")
    published = check_rebuild(spec, toolchain, "cpu-portable-x86_64", store)
    assert published.fingerprint == build_fingerprint(spec, toolchain, "cpu-portable-x86_64", store.url).key()
    assert published.store_url == store.url
    # compute_key hashes no file and opens no store: with the weights gone and the store unreachable
    # it still answers, from the fingerprint made before the task ran.
    Path(spec.weights or "").unlink()
    inputs = {"spec": spec, "toolchain": toolchain, "compat": "cpu-portable-x86_64",
              "store": "s3://no-such-bucket/prefix", "published": published}
    assert BuildCachePolicy().compute_key(None, inputs, {}) == "build-" + published.fingerprint  # type: ignore[arg-type]


@pytest.mark.usefixtures("prefect_harness")
def test_a_build_fingerprints_its_inputs_once(make_spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect_executorch.export import fingerprint

    hashed: list[str] = []

    def counted(path: str | Path) -> str:
        hashed.append(str(path))
        return real(path)

    real = fingerprint.sha256_file
    monkeypatch.setattr(fingerprint, "sha256_file", counted)
    spec = _mlp_with_weights(make_spec, tmp_path)
    ref, states = _build(spec, LocalStore(tmp_path / "store"), tmp_path / "out")
    assert states["build-and-publish"] == "Completed"
    # check-published's fingerprint, reused by the cache key and written into the manifest.
    assert hashed.count(str(spec.weights)) == 1, hashed
    assert verify_bundle_dir(tmp_path / "store" / ref.key.prefix).fingerprint is not None


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


def test_samples_and_datasets_count_by_content_not_by_path(make_spec, tmp_path: Path) -> None:
    toolchain = Toolchain(python="3.11", os="Linux", arch="x86_64", torch=torch.__version__)
    method = {"forward": {"inputs": [{"name": "x", "shape": [3, 32]}]}}

    def key(samples: Path, dataset: Path) -> str:
        validation = {"methods": {"forward": {"samples_file": str(samples), "dataset": f"{dataset}:samples"}}}
        spec = make_spec("mlp", methods=method, validation=validation)
        return build_fingerprint(spec, toolchain, "cpu-xnnpack-x86_64", "store").key()

    samples, dataset = tmp_path / "a" / "samples.pt", tmp_path / "a" / "data.py"
    samples.parent.mkdir()
    torch.save([(torch.zeros(3, 32),)], samples)
    dataset.write_text("def samples():\n    return []\n")
    first = key(samples, dataset)
    # Moved: the same content elsewhere is the same build.
    moved = tmp_path / "b"
    shutil.copytree(samples.parent, moved)
    assert key(moved / "samples.pt", moved / "data.py") == first
    # Edited in place: a different build (it was a stale cache hit).
    torch.save([(torch.ones(3, 32),)], samples)
    assert key(samples, dataset) != first
    torch.save([(torch.zeros(3, 32),)], samples)
    assert key(samples, dataset) == first
    dataset.write_text("def samples():\n    return [1]\n")
    assert key(samples, dataset) != first


def test_checking_a_package_model_reference_runs_none_of_its_code(make_spec, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect_executorch.errors import SpecError
    from prefect_executorch.spec.modelref import source_file

    package = tmp_path / "zoo" / "vision"
    package.mkdir(parents=True)
    for init in (tmp_path / "zoo" / "__init__.py", package / "__init__.py"):
        init.write_text(f"open({str(tmp_path / 'ran')!r} + '-' + __name__, 'w').close()\n")
    (package / "nets.py").write_text("def build():\n    raise SystemExit('never called')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = make_spec("mlp").model_copy(update={"model": "zoo.vision.nets:build"})
    spec.check_model_reference()
    assert source_file(spec.model) == package / "nets.py"
    assert not list(tmp_path.glob("ran-*")), "a package __init__ ran"
    for missing in ("zoo.vision.nope:build", "zoo.nets.vision:build", "nowhere_at_all:build"):
        with pytest.raises(SpecError, match=f"model: no module named {missing.split(':')[0]!r}"):
            spec.model_copy(update={"model": missing}).check_model_reference()
