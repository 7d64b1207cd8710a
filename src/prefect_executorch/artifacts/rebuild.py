"""Before any export: is this bundle key published already, and by this very build?"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from prefect_executorch.artifacts.manifest import MANIFEST_FILE, BundleKey, Manifest
from prefect_executorch.artifacts.publishing import BundleRef, read_manifest
from prefect_executorch.artifacts.store import ObjectStore
from prefect_executorch.errors import BundleConflict
from prefect_executorch.export.fingerprint import BuildFingerprint, build_fingerprint
from prefect_executorch.hashing import sha256_bytes
from prefect_executorch.machine.toolchain import Toolchain
from prefect_executorch.spec.buildspec import BuildSpec


class PublishedBuild(BaseModel):
    """What the store holds at a bundle key, seen from a build about to start."""

    published: bool
    ref: BundleRef | None = None  # set when the published bundle came from an identical build
    inputs: BuildFingerprint = Field(description="What decides this build's bundle (recorded in its manifest).")
    fingerprint: str = Field(description="This build's fingerprint key: the build's cache key, computed once here.")
    store_url: str = Field(description="The URL of the store the build publishes to.")


def check_rebuild(spec: BuildSpec, toolchain: Toolchain, compat: str, store: ObjectStore) -> PublishedBuild:
    """Return the published bundle of an unchanged rebuild; refuse a changed one before it exports.

    A manifest from before fingerprints were recorded cannot tell, so it is reported as published
    and the caller falls back to its own cache.
    """
    key = BundleKey.of(spec.name, spec.version, spec.target_name, compat)
    fingerprint = build_fingerprint(spec, toolchain, compat, store.url)
    build = {"inputs": fingerprint, "fingerprint": fingerprint.key(), "store_url": store.url}
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
        f"{key.prefix} is already published in {store.url} by a different build ({what_changed(manifest, fingerprint)}); "
        "nothing was exported: give the spec a new version (bundles are never overwritten)"
    )


def identical_build_published(store: ObjectStore, manifest: Manifest) -> BundleRef | None:
    """The bundle published at ``manifest``'s key when a build with its very fingerprint made it (None otherwise).

    A rerun that finds its own bundle there (an attempt that published, then died before it could say so,
    or its retry's twin) has succeeded: the same build, not a conflict.
    """
    key = manifest.key
    if manifest.fingerprint is None or not store.exists(key.key(MANIFEST_FILE)):
        return None
    existing, data = read_manifest(store, key)
    if existing.fingerprint != manifest.fingerprint:
        return None
    return BundleRef(store=store.url, key=key, manifest_key=key.key(MANIFEST_FILE), manifest_sha256=sha256_bytes(data),
                     cache_hit=True)


def _changed_fields(before: Any, after: Any, path: str = "") -> list[str]:
    """Dotted paths of the spec fields whose values differ (``validation.atol``, ``methods.forward.inputs``)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [field for name in sorted(set(before) | set(after))
                for field in _changed_fields(before.get(name), after.get(name), f"{path}.{name}" if path else name)]
    return [] if before == after else [path or "spec"]


def what_changed(manifest: Manifest, now: BuildFingerprint) -> str:
    """What differs between the build that published ``manifest`` and this one, each part named."""
    was = manifest.build_inputs
    if was is None:  # published before manifests recorded their build's inputs
        changed = ["the spec differs"] if manifest.weights_sha256 == now.weights_sha256 else ["the weights differ"]
        return ", ".join(changed) + " (or the model source or the toolchain; this bundle predates the record of each)"
    changed = []
    if was.model_source_sha256 != now.model_source_sha256:
        changed.append(f"the model's source file changed (sha256 {was.model_source_sha256[:12]}… -> "
                       f"{now.model_source_sha256[:12]}…)")
    if was.weights_sha256 != now.weights_sha256:
        changed.append("the weights changed")
    fields = _changed_fields(was.spec, now.spec)
    if fields:
        changed.append("spec fields changed: " + ", ".join(fields))
    tools = [f"{name} {was.toolchain.get(name)} -> {now.toolchain.get(name)}"
             for name in sorted(set(was.toolchain) | set(now.toolchain)) if was.toolchain.get(name) != now.toolchain.get(name)]
    if tools:
        changed.append("the toolchain changed: " + ", ".join(tools))
    return "; ".join(changed) or "its fingerprint differs"
