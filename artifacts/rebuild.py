"""Before any export: is this bundle key published already, and by this very build?"""

from __future__ import annotations

from pydantic import BaseModel, Field

from prefect_executorch.artifacts.manifest import MANIFEST_FILE, BundleKey, Manifest
from prefect_executorch.artifacts.registry import BundleRef, read_manifest
from prefect_executorch.artifacts.store import ObjectStore
from prefect_executorch.errors import BundleConflict
from prefect_executorch.fingerprint import build_fingerprint
from prefect_executorch.hashing import sha256_bytes
from prefect_executorch.spec import BuildSpec
from prefect_executorch.toolchain import Toolchain


class PublishedBuild(BaseModel):
    """What the store holds at a bundle key, seen from a build about to start."""

    published: bool
    ref: BundleRef | None = None  # set when the published bundle came from an identical build
    fingerprint: str = Field(description="This build's fingerprint key: the build's cache key, computed once here.")
    store_url: str = Field(description="The URL of the store the build publishes to.")


def check_rebuild(spec: BuildSpec, toolchain: Toolchain, compat: str, store: ObjectStore) -> PublishedBuild:
    """Return the published bundle of an unchanged rebuild; refuse a changed one before it exports.

    A manifest from before fingerprints were recorded cannot tell, so it is reported as published
    and the caller falls back to its own cache.
    """
    key = BundleKey.of(spec.name, spec.version, spec.target_name, compat)
    fingerprint = build_fingerprint(spec, toolchain, compat, store.url)
    build = {"fingerprint": fingerprint.key(), "store_url": store.url}
    where = key.key(MANIFEST_FILE)
    if not store.exists(where):
        return PublishedBuild(published=False, **build)
    manifest, data = read_manifest(store, key)
    if manifest.fingerprint is None:
        return PublishedBuild(published=True, **build)
    if manifest.fingerprint == fingerprint.key():
        ref = BundleRef(store=store.url, key=key, manifest_key=where, manifest_sha256=sha256_bytes(data), cache_hit=True)
        return PublishedBuild(published=True, ref=ref, **build)
    raise BundleConflict(
        f"{key.prefix} is already published in {store.url} by a different build ({_what_changed(manifest, spec.sha256(), fingerprint.weights_sha256)}); "
        "nothing was exported: give the spec a new version (bundles are never overwritten)"
    )


def _what_changed(manifest: Manifest, spec_sha256: str, weights_sha256: str | None) -> str:
    changed = []
    if manifest.spec_sha256 != spec_sha256:
        changed.append("the spec differs")
    if manifest.weights_sha256 != weights_sha256:
        changed.append("the weights differ")
    return ", ".join(changed) or "the model source or the toolchain differs"
