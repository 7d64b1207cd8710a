"""Find a published bundle by version or alias and pull it, verified, into a fresh directory."""

from __future__ import annotations

import uuid
from pathlib import Path

from prefect import get_run_logger, task

from prefect_executorch.artifacts.locate import resolve_published
from prefect_executorch.artifacts.manifest import Manifest
from prefect_executorch.artifacts.registry import pull
from prefect_executorch.artifacts.store import open_store
from prefect_executorch.toolchain import Toolchain


@task(name="pull-published")
def pull_published(
    store: str, name: str, alias_or_version: str, target: str, toolchain: Toolchain, output_root: Path
) -> tuple[Manifest, Path]:
    """Pull ``name`` at a version or alias (the bundle fit to this worker) under ``output_root``, every file checked."""
    opened = open_store(store)
    resolved = resolve_published(opened, name, alias_or_version, target, toolchain)
    dest = output_root / f"{resolved.key.prefix.replace('/', '-')}-{uuid.uuid4().hex[:8]}"
    manifest = pull(opened, resolved.key, dest, manifest_sha256=resolved.manifest_sha256)
    get_run_logger().info("pulled %s (%s) into %s; %d files verified", resolved.key.prefix, resolved.reason, dest,
                          len(manifest.files))
    return manifest, dest
