"""Fetch a weights file from a store URL (``s3://bucket/key``, ``file:///path``, a path), verified by sha256."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from pydantic import BaseModel

from prefect_executorch.artifacts.urls import open_store
from prefect_executorch.errors import IntegrityError, SpecError
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.fields import check_name


class FetchedWeights(BaseModel):
    """A weights file copied into a build's directory."""

    uri: str
    path: str
    sha256: str
    size: int

    def apply(self, spec: BuildSpec, version: str | None = None) -> BuildSpec:
        """``spec`` built from these weights, under ``version`` if given."""
        update: dict[str, str] = {"weights": self.path}
        if version is not None:
            update["version"] = check_name(version, "version")
        return spec.model_copy(update=update)

    def default_version(self, spec: BuildSpec) -> str:
        """``<spec version>-<first 12 hex of the weights' sha256>``: one version per weights file."""
        return f"{spec.version}-{self.sha256[:12]}"


def split_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/dir/w.pt`` -> (``s3://bucket/dir``, ``w.pt``): the store holding the file, and its key."""
    if "://" not in uri:
        path = Path(uri).expanduser().resolve()
        return str(path.parent), path.name
    parent, _, name = uri.rstrip("/").rpartition("/")
    if not parent or not name or parent.endswith(":/"):
        raise SpecError(f"weights_uri: {uri!r} names no file; use s3://bucket/path/weights.pt or a file path")
    return parent, name


def fetch_weights(uri: str, dest_dir: Path, expected_sha256: str | None = None) -> FetchedWeights:
    """Download ``uri`` into ``dest_dir`` as ``weights-<sha256>.pt``; refuse bytes that miss ``expected_sha256``."""
    parent, key = split_uri(uri)
    dest_dir.mkdir(parents=True, exist_ok=True)
    partial = dest_dir / f".weights-{uuid.uuid4().hex}.partial"
    try:
        sha = open_store(parent).download_file(key, partial)
        if expected_sha256 and sha != expected_sha256.lower():
            raise IntegrityError(
                f"weights_uri: {uri} has sha256 {sha}, but the request says {expected_sha256}; "
                "the file was replaced or corrupted after the request was made: send a new request"
            )
        final = dest_dir / f"weights-{sha}.pt"
        os.replace(partial, final)
    finally:
        partial.unlink(missing_ok=True)
    return FetchedWeights(uri=uri, path=str(final), sha256=sha, size=final.stat().st_size)
