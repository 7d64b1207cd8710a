"""Locating published bundles: manifest URLs split into store and key; a name that is neither version nor alias."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefect_executorch.artifacts.locate import parse_manifest_url, resolve_published
from prefect_executorch.artifacts.store import LocalStore
from prefect_executorch.errors import BundleNotFound, SpecError


def test_manifest_urls_split_into_store_and_key() -> None:
    store, key = parse_manifest_url("s3://bucket/pre/fix/m/1.0/xnnpack/cpu-xnnpack-x86_64/manifest.json")
    assert store == "s3://bucket/pre/fix" and key.prefix == "m/1.0/xnnpack/cpu-xnnpack-x86_64"
    assert parse_manifest_url("s3://bucket/m/1/portable/c/manifest.json")[0] == "s3://bucket"
    assert parse_manifest_url("m/1/portable/c/manifest.json")[0] == "."
    for bad, message in [("s3://bucket/m/1/x/c/model.pte", "expected"), ("s3://m/1/x/c/manifest.json", "no bucket"),
                         ("/s/M/1/x/c/manifest.json", "not a valid name")]:
        with pytest.raises(SpecError, match=message):
            parse_manifest_url(bad)


def test_a_name_that_is_neither_version_nor_alias_is_not_found(tmp_path: Path) -> None:
    from prefect_executorch.machine.toolchain import probe

    with pytest.raises(BundleNotFound, match="no model m in .*; models there: none"):
        resolve_published(LocalStore(tmp_path), "m", "prod", "xnnpack", probe())
