"""Pull a bundle: resolve version or alias to the bundle that fits, download, verify every byte."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prefect import get_run_logger, task

from prefect_executorch.artifacts.catalog import AUTO, Resolved, resolve
from prefect_executorch.artifacts.locate import pull_fresh, resolve_published
from prefect_executorch.artifacts.manifest import MANIFEST_FILE, Manifest
from prefect_executorch.artifacts.publishing import pull
from prefect_executorch.artifacts.urls import open_store
from prefect_executorch.hashing import sha256_file
from prefect_executorch.machine.toolchain import Toolchain
from prefect_executorch.tasks.events import PULLED, emit_bundle_event
from prefect_executorch.tasks.retries import retry_transient

if TYPE_CHECKING:
    from prefect.blocks.core import Block


@task(name="pull", retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=retry_transient)
def pull_bundle(
    store: str | Block,
    name: str,
    dest: str,
    version: str | None = None,
    alias: str | None = None,
    target: str | None = None,
    compat: str = AUTO,
) -> Manifest:
    """Resolve and download a bundle into ``dest`` (a new directory); ``IntegrityError`` leaves nothing there."""
    opened = open_store(store)
    resolved = resolve(opened, name, version=version, alias=alias, target=target, compat=compat)
    manifest = pull(opened, resolved.key, Path(dest), manifest_sha256=resolved.manifest_sha256)
    emit_bundle_event(PULLED, resolved.key, opened.url, sha256_file(Path(dest) / MANIFEST_FILE),
                      payload={"dest": dest, "alias": alias, "reason": resolved.reason})
    _log_pulled(resolved, Path(dest), manifest)
    return manifest


@task(name="pull-published")
def pull_published(
    store: str, name: str, alias_or_version: str, target: str, toolchain: Toolchain, output_root: Path
) -> tuple[Manifest, Path]:
    """Pull ``name`` at a version or alias (the bundle fit to this worker) under ``output_root``, every file checked."""
    opened = open_store(store)
    resolved = resolve_published(opened, name, alias_or_version, target, toolchain)
    manifest, dest = pull_fresh(opened, resolved.key, output_root, resolved.manifest_sha256)
    _log_pulled(resolved, dest, manifest)
    return manifest, dest


def _log_pulled(resolved: Resolved, dest: Path, manifest: Manifest) -> None:
    get_run_logger().info("pulled %s (%s) into %s; %d files verified", resolved.key.prefix, resolved.reason, dest,
                          len(manifest.files))
