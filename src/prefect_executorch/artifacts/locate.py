"""Find a published bundle: from its manifest's URL, or by model name and version or alias."""

from __future__ import annotations

import uuid
from pathlib import Path

from pydantic import ValidationError

from prefect_executorch.artifacts.catalog import Resolved, resolve
from prefect_executorch.artifacts.manifest import MANIFEST_FILE, BundleKey, Manifest
from prefect_executorch.artifacts.publishing import list_bundles, pull
from prefect_executorch.artifacts.store import ObjectStore
from prefect_executorch.errors import SpecError
from prefect_executorch.machine.toolchain import Toolchain

#: How a bundle's manifest is addressed: the store, then the key's four segments, then the file.
MANIFEST_URL_FORM = "<store-url-or-dir>/<name>/<version>/<target>/<compat>/manifest.json"


def parse_manifest_url(url: str, field: str = "--bundle") -> tuple[str, BundleKey]:
    """Split a manifest's URL (``s3://bucket/prefix/...``, ``file://...`` or a path) into store URL and key."""
    text = url.rstrip("/")
    parts = text.rsplit("/", 5)
    if len(parts) < 5 or parts[-1] != MANIFEST_FILE:
        raise SpecError(f"{field}: expected {MANIFEST_URL_FORM}, got {url!r}")
    if len(parts) == 5:
        parts.insert(0, ".")
    store, name, version, target, compat = parts[:5]
    if store in ("", "s3:", "s3:/", "file:", "file:/"):
        store += "/"
    if store == "s3://":
        raise SpecError(f"{field}: {url!r} names no bucket; expected s3://bucket[/prefix]/<name>/.../{MANIFEST_FILE}")
    try:
        return store, BundleKey(name=name, version=version, target=target, compat=compat)
    except ValidationError as exc:
        problems = "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in exc.errors())
        raise SpecError(f"{field}: {url!r} is not {MANIFEST_URL_FORM}: {problems}") from None


def resolve_published(
    store: ObjectStore, name: str, alias_or_version: str, target: str, toolchain: Toolchain
) -> Resolved:
    """``name`` at a published version, else at the alias of that name, for ``target`` and fit to this machine."""
    is_version = bool(list_bundles(store, name, alias_or_version))
    return resolve(store, name, version=alias_or_version if is_version else None,
                   alias=None if is_version else alias_or_version, target=target, toolchain=toolchain)


def pull_fresh(store: ObjectStore, key: BundleKey, root: Path, manifest_sha256: str | None = None) -> tuple[Manifest, Path]:
    """Pull ``key`` into a new directory under ``root`` named after the key, every file checked; return both."""
    dest = root / f"{key.prefix.replace('/', '-')}-{uuid.uuid4().hex[:8]}"
    return pull(store, key, dest, manifest_sha256=manifest_sha256), dest
