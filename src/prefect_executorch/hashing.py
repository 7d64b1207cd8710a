"""Streaming sha256 helpers (files are never read whole)."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK = 8 * 2**20


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    # file_digest reads into one reused 256 KiB buffer, so memory stays flat whatever the file size.
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of bytes."""
    return hashlib.sha256(data).hexdigest()
