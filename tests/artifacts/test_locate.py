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


def test_the_newest_version_is_chosen_in_pep440_order_among_bundles_that_fit_this_machine(tmp_path: Path) -> None:
    from prefect_executorch.artifacts.catalog import newest_fitting_version
    from prefect_executorch.errors import ToolchainMismatch
    from prefect_executorch.machine.toolchain import probe

    here = probe()
    fits_here, elsewhere = f"cpu-xnnpack-{here.arch}", f"cpu-xnnpack-{'aarch64' if here.arch == 'x86_64' else 'x86_64'}"
    for version, compat in [("1.9", fits_here), ("1.10", fits_here), ("nightly", fits_here), ("2.0", elsewhere)]:
        folder = tmp_path / "m" / version / "xnnpack" / compat
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text("{}")
    # 1.10 after 1.9 (not as text); 2.0 is for another processor; 'nightly' is no PEP 440 version.
    assert newest_fitting_version(LocalStore(tmp_path), "m", here) == "1.10"
    with pytest.raises(ToolchainMismatch, match="no bundle of n fits this machine"):
        (tmp_path / "n" / "1" / "xnnpack" / elsewhere).mkdir(parents=True)
        (tmp_path / "n" / "1" / "xnnpack" / elsewhere / "manifest.json").write_text("{}")
        newest_fitting_version(LocalStore(tmp_path), "n", here)
