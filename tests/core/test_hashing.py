"""``hashing``: the streaming sha256 of a file equals hashlib's of its bytes and never holds the file whole."""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from pathlib import Path

import pytest

from prefect_executorch.hashing import sha256_bytes, sha256_file

MiB = 2**20


@pytest.mark.parametrize("size", [0, 1, 2**18 - 1, 2**18, 2**18 + 1, 3 * MiB + 7])
def test_sha256_file_matches_the_bytes(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    assert sha256_file(path) == sha256_bytes(data) == hashlib.sha256(data).hexdigest()
    assert sha256_file(str(path)) == sha256_bytes(data)


def test_sha256_file_never_reads_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "big"
    with open(path, "wb") as out:
        for _ in range(48):
            out.write(os.urandom(MiB))
    tracemalloc.start()
    try:
        sha256_file(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * MiB, f"hashing a 48 MiB file peaked at {peak / MiB:.1f} MiB of Python memory"


def test_sha256_file_of_a_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        sha256_file(tmp_path / "absent")
