"""Published bundles and moved aliases as Prefect assets: Prefect's lineage view shows weights -> bundle -> alias.

An asset key is a URI: the bundle's prefix under its store's URL (``s3://bucket/prefix/name/1/xnnpack/cpu-…``,
``file:///…`` for a directory store), an alias likewise under ``<name>/aliases/``. Recording is lineage,
not the publish: a key Prefect cannot take (a path with a space) is logged and skipped.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from prefect import get_run_logger
from prefect.assets import Asset, AssetProperties, materialize
from pydantic import ValidationError

from prefect_executorch.artifacts.manifest import ALIASES_DIR, BundleKey


@materialize("executorch://bundle", by="prefect-executorch")  # the key is replaced on every call
def _materialized(what: str) -> str:
    """The materialization itself already happened (a publish, an alias move); this records it."""
    return what


def asset_uri(location: str) -> str:
    """``location`` as a URI: URLs stay, local paths become ``file://`` URIs."""
    return location if urlparse(location).scheme else Path(location).resolve().as_uri()


def bundle_asset_key(store_url: str, key: BundleKey) -> str:
    """The asset key of a published bundle."""
    return f"{asset_uri(store_url)}/{key.prefix}"


def _record(key: str, name: str, description: str, upstream: list[str]) -> None:
    try:
        asset = Asset(key=key, properties=AssetProperties(name=name, description=description))
        deps: list[Asset | str] = [Asset(key=asset_uri(u)) for u in upstream]
    except ValidationError as exc:
        get_run_logger().warning("not recorded as a Prefect asset (%s): %s", key, exc.errors()[0]["msg"])
        return
    _materialized.with_options(assets=[asset], asset_deps=deps or None)(description)


def record_bundle(store_url: str, key: BundleKey, weights_uri: str | None) -> None:
    """The bundle as an asset materialized from its weights (when they came from a URI)."""
    _record(bundle_asset_key(store_url, key), f"{key.name} {key.version} {key.target}/{key.compat}",
            f"ExecuTorch bundle {key.prefix}", [weights_uri] if weights_uri else [])


def record_alias(store_url: str, alias: str, key: BundleKey) -> None:
    """The alias as an asset materialized from the bundle it points at now."""
    _record(f"{asset_uri(store_url)}/{key.name}/{ALIASES_DIR}/{alias}", f"{key.name} @ {alias}",
            f"alias {alias} of {key.name} -> {key.prefix}", [bundle_asset_key(store_url, key)])
