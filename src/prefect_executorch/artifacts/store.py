"""Object stores: one interface, a local directory and S3, with the same key layout.

Writes never overwrite: ``put_file`` and ``put_bytes`` create only; ``put_bytes(if_match=...)`` is a
compare-and-swap for aliases. Keys are ``/``-separated safe segments under the store's root.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import os
import uuid
from abc import ABC, abstractmethod
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from prefect_executorch.errors import BundleNotFound, IntegrityError, ObjectExists, PreconditionFailed, SpecError
from prefect_executorch.hashing import CHUNK, sha256_file

if TYPE_CHECKING:
    pass

_TMP_PREFIX = ".tmp-"


class ObjectInfo(BaseModel):
    """A stored object."""

    key: str
    size: int
    etag: str
    last_modified: datetime
    sha256: str | None = Field(default=None, description="Whole-object sha256, if the store recorded it on write.")


class IncompleteUpload(BaseModel):
    """An upload that was started and never finished (a multipart upload, a local temporary file)."""

    key: str
    upload_id: str
    started: datetime


class PutResult(BaseModel):
    """What a write stored."""

    key: str
    size: int
    sha256: str
    etag: str


def check_key(key: str) -> str:
    """Refuse keys that could leave the store's root."""
    parts = key.split("/")
    if not key or key.startswith("/") or "\x00" in key or any(p in ("", ".", "..") for p in parts):
        raise SpecError(f"store key {key!r} is not a relative path of plain segments (no '..', '/', NUL)")
    return key


class ObjectStore(ABC):
    """Where bundles live."""

    url: str

    @abstractmethod
    def put_file(self, key: str, path: Path, *, sha256: str | None = None) -> PutResult:
        """Upload ``path`` to a new object; ``ObjectExists`` if ``key`` is taken.

        With ``sha256`` (the manifest's), content that does not hash to it is refused
        (``IntegrityError``) and never becomes visible.
        """

    @abstractmethod
    def put_bytes(self, key: str, data: bytes, *, if_match: str | None = None) -> PutResult:
        """Create ``key`` (``ObjectExists`` if taken) or, with ``if_match``, replace it if its etag matches."""

    @abstractmethod
    def get_bytes(self, key: str) -> tuple[bytes, str]:
        """Content and etag of ``key``; ``BundleNotFound`` if absent."""

    @abstractmethod
    def download_file(self, key: str, dest: Path) -> str:
        """Stream ``key`` into ``dest`` and return its sha256."""

    @abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """Info on ``key``, or None if absent."""

    @abstractmethod
    def list(self, prefix: str) -> list[ObjectInfo]:
        """Objects whose key starts with ``prefix``."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key`` (no error if absent)."""

    def incomplete_uploads(self, prefix: str) -> builtins.list[IncompleteUpload]:
        """Uploads under ``prefix`` that were started and never finished."""
        return []

    def require(self, writable: bool) -> None:  # noqa: B027 - a hook: the S3 store answers at its first request
        """Refuse, before any work, a store that cannot serve (``writable``: a build's, which publishes there)."""

    def abort_upload(self, upload: IncompleteUpload) -> None:  # noqa: B027 - a hook: stores without uploads need none
        """Discard an unfinished upload."""

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""
        return self.head(key) is not None


class LocalStore(ObjectStore):
    """A directory with the same layout as the S3 store; etags are content sha256s."""

    def __init__(self, root: str | Path) -> None:
        try:
            self.root = Path(root).expanduser().resolve()
        except RuntimeError as exc:  # "~someone" for a user this machine does not know
            raise SpecError(f"store: cannot resolve the directory {str(root)!r} ({exc}); give an absolute path") from None
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def require(self, writable: bool) -> None:
        """Refuse a path that is a file or, for reading, missing; for writing, make the directory and write a file there.

        A wrong path otherwise looked like an empty store to `ls` and `pull`, and failed a build with a raw
        traceback after its export and validation.
        """
        if self.root.exists() and not self.root.is_dir():
            raise SpecError(f"store: {self.url} is a file, not a directory; give a directory or s3://bucket/prefix")
        if not writable:
            if not self.root.exists():
                raise SpecError(f"store: {self.url} does not exist; check --store (or $PREFECT_EXECUTORCH_STORE)")
            return
        # Made and written to as a publish would, then left as found: a build that fails publishes no folder.
        made = [folder for folder in (self.root, *self.root.parents) if not folder.exists()]
        probe = self.root / f"{_TMP_PREFIX}write-check-{uuid.uuid4().hex}"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise SpecError(f"store: cannot write bundles to {self.url}: {exc.strerror or exc} "
                            f"({exc.filename or self.url}); give a directory this user can write") from None
        finally:
            for folder in made:  # deepest first
                with contextlib.suppress(OSError):
                    folder.rmdir()

    def _tmp(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.with_name(f"{_TMP_PREFIX}{uuid.uuid4().hex}-{path.name}")

    def _link_new(self, tmp: Path, path: Path, key: str) -> None:
        try:
            os.link(tmp, path)  # atomic create-if-absent
        except FileExistsError:
            raise ObjectExists(
                f"{key} already exists in {self.url}; nothing was overwritten", key=key,
                existing_sha256=sha256_file(path),
            ) from None
        finally:
            tmp.unlink(missing_ok=True)

    def put_file(self, key: str, path: Path, *, sha256: str | None = None) -> PutResult:
        target = self._path(key)
        tmp = self._tmp(target)
        digest = hashlib.sha256()
        size = 0
        with open(path, "rb") as src, open(tmp, "wb") as dst:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                dst.write(chunk)
                size += len(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        sha = digest.hexdigest()
        if sha256 is not None and sha != sha256:
            tmp.unlink(missing_ok=True)
            raise IntegrityError(f"{path}: sha256 {sha} does not match the expected {sha256}; {key} was not written")
        self._link_new(tmp, target, key)
        return PutResult(key=key, size=size, sha256=sha, etag=sha)

    def put_bytes(self, key: str, data: bytes, *, if_match: str | None = None) -> PutResult:
        target = self._path(key)
        tmp = self._tmp(target)
        with open(tmp, "wb") as dst:
            dst.write(data)
            dst.flush()
            os.fsync(dst.fileno())
        sha = hashlib.sha256(data).hexdigest()
        result = PutResult(key=key, size=len(data), sha256=sha, etag=sha)
        if if_match is None:
            self._link_new(tmp, target, key)
            return result
        lock_path = self.root / ".locks" / hashlib.sha256(key.encode()).hexdigest()
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current = sha256_file(target) if target.exists() else None
            if current != if_match:
                tmp.unlink(missing_ok=True)
                raise PreconditionFailed(
                    f"{key} changed since it was read (etag {current}, expected {if_match}); nothing was written",
                    key=key, current_etag=current,
                )
            os.replace(tmp, target)
        return result

    def get_bytes(self, key: str) -> tuple[bytes, str]:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            raise BundleNotFound(f"{key} does not exist in {self.url}") from None
        return data, hashlib.sha256(data).hexdigest()

    def download_file(self, key: str, dest: Path) -> str:
        source = self._path(key)
        if not source.is_file():
            raise BundleNotFound(f"{key} does not exist in {self.url}")
        digest = hashlib.sha256()
        with open(source, "rb") as src, open(dest, "wb") as dst:
            while chunk := src.read(CHUNK):
                digest.update(chunk)
                dst.write(chunk)
        return digest.hexdigest()

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        if not path.is_file():
            return None
        return self._info(key, path, etag=sha256_file(path))

    @staticmethod
    def _info(key: str, path: Path, etag: str) -> ObjectInfo:
        stat = path.stat()
        return ObjectInfo(
            key=key, size=stat.st_size, etag=etag,
            last_modified=datetime.fromtimestamp(stat.st_mtime, tz=UTC),
        )

    def list(self, prefix: str) -> list[ObjectInfo]:
        base = self.root / prefix.rstrip("/") if prefix else self.root
        if not base.exists():
            return []
        found = []
        for path in sorted(base.rglob("*")):
            rel = path.relative_to(self.root).as_posix()
            if path.is_file() and not path.name.startswith(_TMP_PREFIX) and not rel.startswith(".locks/"):
                found.append(self._info(rel, path, etag=""))
        return found

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        # A directory store has folders where S3 has only key prefixes: leave no empty one behind.
        for parent in path.parents:
            if parent == self.root or not parent.is_relative_to(self.root):
                break
            try:
                parent.rmdir()
            except OSError:  # not empty (or already gone)
                break

    def incomplete_uploads(self, prefix: str) -> builtins.list[IncompleteUpload]:
        base = self.root / prefix.rstrip("/") if prefix else self.root
        if not base.exists():
            return []
        return [
            IncompleteUpload(key=path.relative_to(self.root).as_posix(), upload_id=path.name,
                             started=datetime.fromtimestamp(path.stat().st_mtime, tz=UTC))
            for path in sorted(base.rglob(f"{_TMP_PREFIX}*")) if path.is_file()
        ]

    def abort_upload(self, upload: IncompleteUpload) -> None:  # noqa: B027 - a hook: stores without uploads need none
        path = self.root / upload.key
        if path.name.startswith(_TMP_PREFIX):
            path.unlink(missing_ok=True)
