"""Find a published bundle and pull it, verified, into a fresh directory."""

from __future__ import annotations

import uuid
from pathlib import Path

from prefect import get_run_logger, task

from prefect_executorch.artifacts.locate import resolve_bundle
from prefect_executorch.artifacts.manifest import BundleKey, Manifest
from prefect_executorch.artifacts.registry import pull
from prefect_executorch.artifacts.store import open_store


@task(name="resolve-bundle")
def resolve_published(store: str, name: str, alias_or_version: str, target: str, compat: str) -> BundleKey:
    """The key of ``name`` at a version or alias, for this worker's target and compat."""
    key = resolve_bundle(open_store(store), name, alias_or_version, target, compat)
    get_run_logger().info("%s %s is %s", name, alias_or_version, key.prefix)
    return key


@task(name="pull-bundle")
def pull_published(store: str, key: BundleKey, output_root: Path) -> tuple[Manifest, Path]:
    """Pull ``key`` into a new directory under ``output_root``, every file checked against its manifest."""
    dest = output_root / f"{key.prefix.replace('/', '-')}-{uuid.uuid4().hex[:8]}"
    manifest = pull(open_store(store), key, dest)
    get_run_logger().info("pulled and verified %s (%d files) into %s", key.prefix, len(manifest.files), dest)
    return manifest, dest
