"""Find a published bundle: from its manifest's URL, or by model name and version (or alias)."""

from __future__ import annotations

import json

from pydantic import ValidationError

from prefect_executorch.artifacts.manifest import MANIFEST_FILE, BundleKey
from prefect_executorch.artifacts.store import ObjectStore
from prefect_executorch.errors import BundleNotFound, SpecError

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


def alias_key(name: str, alias: str) -> str:
    """Where an alias of ``name`` lives in the store."""
    return f"{name}/aliases/{alias}.json"


def resolve_bundle(store: ObjectStore, name: str, alias_or_version: str, target: str, compat: str) -> BundleKey:
    """The bundle ``name`` at a version (for this target and compat) or at an alias, as published in ``store``.

    An alias is ``<name>/aliases/<alias>.json`` holding ``{"version", "target", "compat"}``; a version
    that exists wins over an alias of the same name.
    """
    key = BundleKey(name=name, version=alias_or_version, target=target, compat=compat)
    if store.exists(key.key(MANIFEST_FILE)):
        return key
    if store.exists(alias_key(name, alias_or_version)):
        data, _ = store.get_bytes(alias_key(name, alias_or_version))
        try:
            alias = json.loads(data)
            return BundleKey(name=name, version=alias["version"], target=alias.get("target", target),
                             compat=alias.get("compat", compat))
        except (ValueError, KeyError, TypeError) as exc:
            raise BundleNotFound(
                f"{alias_key(name, alias_or_version)} in {store.url} is not a valid alias ({exc}); "
                "move the alias again to repair it"
            ) from None
    published = sorted({info.key.split("/")[1] for info in store.list(f"{name}/")
                        if info.key.endswith(f"/{target}/{compat}/{MANIFEST_FILE}")})
    raise BundleNotFound(
        f"{name}: no version or alias {alias_or_version!r} for {target}/{compat} in {store.url}; "
        f"published versions for this target: {published[:20] or 'none'}"
    )
