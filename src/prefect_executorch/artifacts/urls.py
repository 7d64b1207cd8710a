"""The store a URL names: a local directory or S3 (``s3://bucket/prefix``), or a prefect-aws S3Bucket block.

Apart from ``store.py`` so that the S3 store builds on the store's base without a circle; boto3 is
imported only for an S3 URL.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from prefect_executorch.artifacts.store import LocalStore, ObjectStore
from prefect_executorch.errors import SpecError

if TYPE_CHECKING:
    from prefect.blocks.core import Block


def open_store(url: str | Path | ObjectStore | Block, *, endpoint_url: str | None = None) -> ObjectStore:
    """A store from a URL (``s3://bucket/prefix``, ``file:///dir``, a directory), a store, or an S3Bucket block."""
    if isinstance(url, ObjectStore):
        return url
    if hasattr(url, "bucket_name") and hasattr(url, "credentials"):  # a prefect-aws S3Bucket block
        from prefect_executorch.artifacts.s3 import S3Store

        return S3Store.from_block(url)
    if not isinstance(url, (str, Path)):
        raise SpecError(f"store: expected a URL, a directory or an S3Bucket block, found {type(url).__name__}")
    text = str(url)
    parsed = urlparse(text)
    if parsed.scheme == "s3":
        from prefect_executorch.artifacts.s3 import S3Store

        return S3Store.from_url(text, endpoint_url=endpoint_url)
    if parsed.scheme == "file":
        return LocalStore(parsed.path)
    if parsed.scheme and len(parsed.scheme) > 1:
        raise SpecError(f"store: unsupported URL scheme {parsed.scheme!r} in {text!r}; use s3://bucket/prefix or a directory")
    return LocalStore(text)

