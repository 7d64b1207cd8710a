"""``S3Store``: the object store on S3 (or any S3 API such as SeaweedFS or MinIO), through boto3.

Every write carries a SHA-256 checksum the server verifies (a corrupted body or part is refused
with ``BadDigest``) and is create-only (``If-None-Match: *``, also on ``CompleteMultipartUpload``)
or a compare-and-swap (``If-Match``). Large files go up as a multipart upload of our own: boto3's
``upload_file`` cannot send ``If-None-Match`` on the completing request (s3transfer passes only SSE
and payer arguments to it), and its per-part checksums would mean a second read for the whole-file
sha256. Here the file is read once, each part is hashed for the wire and fed to a running
whole-file sha256, and at most ``max_concurrency`` parts are in memory.

Credentials, region and endpoint come from boto3's standard chain (``AWS_*`` variables,
``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``, profiles, instance roles), an explicit
``endpoint_url``, or a prefect-aws ``S3Bucket``/``AwsCredentials`` block. Nothing here ever
formats a secret into a message or a log line.
"""

from __future__ import annotations

import base64
import builtins
import hashlib
import logging
import math
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ProxyConnectionError,
    SSLError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from prefect_executorch.artifacts.store import IncompleteUpload, ObjectInfo, ObjectStore, PutResult, check_key
from prefect_executorch.errors import (
    BundleConflict,
    BundleNotFound,
    IntegrityError,
    ObjectExists,
    PreconditionFailed,
    PrefectExecutorchError,
    SpecError,
    StoreError,
)
from prefect_executorch.settings import MiB, S3Settings, read_settings

if TYPE_CHECKING:
    from botocore.config import _S3Dict
    from prefect_aws import S3Bucket
    from types_boto3_s3 import S3Client
    from types_boto3_s3.type_defs import CompletedPartTypeDef, HeadObjectOutputTypeDef, PutObjectRequestTypeDef

logger = logging.getLogger(__name__)

#: S3's limits (the least part size, MIN_PART, lives with the settings it bounds): at most 10,000 parts.
MAX_PARTS = 10_000
#: Object metadata key holding the whole object's hex sha256 (``x-amz-meta-sha256``).
SHA256_META = "sha256"
_BUCKET_RE_HINT = "3-63 lowercase letters, digits, '.' or '-', starting and ending with a letter or digit"
_AUTH_CODES = frozenset({
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken", "TokenRefreshRequired",
    "AuthorizationHeaderMalformed", "InvalidClientTokenId", "UnrecognizedClientException",
})
_DENIED_CODES = frozenset({"AccessDenied", "AllAccessDisabled", "Forbidden", "403"})
_DIGEST_CODES = frozenset({"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch", "InvalidChecksum"})
_CONDITION_CODES = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict"})
_MISSING_KEY_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
#: Not worth another round of our own: botocore already retried reaching the endpoint.
_UNREACHABLE = (EndpointConnectionError, ConnectTimeoutError, ProxyConnectionError, SSLError)
#: botocore's transient exceptions (retries/standard.py), and a body cut short after the headers (response.py).
_TRANSIENT = (BotoConnectionError, HTTPClientError, IncompleteReadError)
T = TypeVar("T")
Progress = Callable[[str, int, int], None]


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def _hex_to_b64(hex_digest: str) -> str:
    try:
        raw = bytes.fromhex(hex_digest)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise SpecError(f"sha256: {hex_digest!r} is not a hex SHA-256 digest (64 hex characters)")
    return _b64(raw)


def _etag(response: Mapping[str, object]) -> str:
    return str(response.get("ETag", "")).strip('"')


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _another_round(exc: Exception) -> bool:
    """Whether ``exc`` is transient and botocore stopped retrying it only for its limits (or never could)."""
    if isinstance(exc, ClientError):
        # botocore marks the response it gave up on; a 4xx it never retries carries neither mark.
        metadata = exc.response.get("ResponseMetadata", {})
        return bool(metadata.get("MaxAttemptsReached") or metadata.get("RetryQuotaReached"))
    return isinstance(exc, _TRANSIENT) and not isinstance(exc, _UNREACHABLE)


def check_bucket(bucket: str) -> str:
    """Refuse bucket names S3 would refuse, before any request."""
    # ASCII only: str.islower()/isdigit() also accept letters and digits of other scripts, which S3 refuses.
    ok = re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket) is not None and ".." not in bucket
    if not ok:
        raise SpecError(f"store URL: bucket {bucket!r} is not a valid S3 bucket name; use {_BUCKET_RE_HINT}")
    return bucket


class S3Store(ObjectStore):
    """A bucket and key prefix on an S3 API; same key layout and semantics as ``LocalStore``."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        session: boto3.session.Session | None = None,
        settings: S3Settings | None = None,
        progress: Progress | None = None,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.bucket = check_bucket(bucket)
        self.prefix = check_key(prefix.strip("/")) if prefix.strip("/") else ""
        self.url = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.settings = settings or read_settings(S3Settings)
        self._progress = progress
        self._session = session or boto3.session.Session()
        s3_options: _S3Dict = {
            # The x-amz-checksum-sha256 header is signed and the server checks the body against it,
            # so hashing the body a second time for the signature (botocore's default over http) is waste.
            "payload_signing_enabled": False,
        }
        if self.settings.addressing_style:
            s3_options["addressing_style"] = self.settings.addressing_style
        config = Config(
            signature_version="s3v4",
            s3=s3_options,
            retries={"mode": self.settings.retry_mode, "total_max_attempts": self.settings.max_attempts},
            connect_timeout=self.settings.connect_timeout_s,
            read_timeout=self.settings.read_timeout_s,
            max_pool_connections=self.settings.max_concurrency + 4,
            # We send SHA-256 ourselves; botocore's default CRC32 would be a second checksum pass.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        options: dict[str, Any] = {
            "endpoint_url": self.settings.endpoint_url,
            "region_name": self.settings.region or self._session.region_name or "us-east-1",
            **(client_options or {}),
        }
        # A block's own botocore options win over ours, key by key (botocore's Config.merge).
        options["config"] = config.merge(options["config"]) if options.get("config") else config
        try:
            self.client: S3Client = self._session.client("s3", **options)
        except (BotoCoreError, ValueError) as exc:
            raise StoreError(f"cannot create an S3 client for {self.url}: {exc}") from None
        self.endpoint = str(self.client.meta.endpoint_url)

    # construction ---------------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: str, *, endpoint_url: str | None = None, **kwargs: Any) -> S3Store:
        """A store from ``s3://bucket/prefix``; ``endpoint_url`` overrides boto3's chain."""
        parsed = urlparse(url)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise SpecError(f"store URL: {url!r} is not s3://bucket[/prefix]")
        if parsed.query or parsed.fragment:
            raise SpecError(f"store URL: {url!r} has a query or fragment; use s3://bucket[/prefix] and --endpoint-url")
        settings = kwargs.pop("settings", None) or read_settings(S3Settings)
        if endpoint_url:
            settings = settings.model_copy(update={"endpoint_url": endpoint_url})
        return cls(parsed.netloc, parsed.path, settings=settings, **kwargs)

    @classmethod
    def from_block(cls, block: S3Bucket, *, settings: S3Settings | None = None) -> S3Store:
        """A store from a prefect-aws ``S3Bucket`` block (bucket, folder, credentials, client parameters)."""
        credentials = block.credentials
        # The client arguments prefect-aws itself would use (credentials._get_client_cached): endpoint,
        # verify/CA bundle, SSL, API version, botocore config, and the credentials' region.
        options = credentials.aws_client_parameters.get_params_override()
        if credentials.region_name:
            options["region_name"] = credentials.region_name
        return cls(block.bucket_name, block.bucket_folder or "", session=credentials.get_boto3_session(),
                   settings=settings, client_options=options)

    def __repr__(self) -> str:
        return f"S3Store({self.url!r}, endpoint={self.endpoint!r})"

    # errors ---------------------------------------------------------------------------------

    def _full(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _where(self, key: str | None) -> str:
        return f"{self.url}/{key}" if key else self.url

    def _credential_source(self) -> str:
        try:
            creds = self._session.get_credentials()
        except BotoCoreError:
            return "unknown source"
        return f"credentials from {creds.method}" if creds is not None else "no credentials"

    def _translate(self, exc: Exception, key: str | None, what: str) -> PrefectExecutorchError:
        """Our typed error for a botocore failure; messages name the object, never a secret."""
        where = self._where(key)
        if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
            return StoreError(
                f"{what} {where}: no usable AWS credentials were found; set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or pass a prefect-aws block")
        if isinstance(exc, (BotoConnectionError, HTTPClientError)):
            failure = "cannot reach" if isinstance(exc, _UNREACHABLE) else "lost the connection to"
            return StoreError(
                f"{what} {where}: {failure} the S3 endpoint {self.endpoint} ({type(exc).__name__}; retried with "
                f"backoff, max_attempts={self.settings.max_attempts}); check the endpoint URL "
                "(--endpoint-url / AWS_ENDPOINT_URL_S3) and the network")
        if not isinstance(exc, ClientError):
            return StoreError(f"{what} {where}: {type(exc).__name__}: {exc}")
        code, status = _code(exc), _status(exc)
        if code == "NoSuchBucket":
            return StoreError(
                f"{what} {where}: bucket {self.bucket!r} does not exist at {self.endpoint}; create it "
                f"(aws s3 mb s3://{self.bucket}) or fix the store URL")
        if code in _AUTH_CODES:
            return StoreError(
                f"{what} {where}: the S3 endpoint {self.endpoint} rejected the credentials ({code}; "
                f"{self._credential_source()}): the access key id is unknown or the secret key is wrong. "
                "Check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE (secrets are never shown)")
        if code in _DENIED_CODES:
            # A HEAD carries no error body, so a wrong secret and a missing permission look alike.
            return StoreError(
                f"{what} {where}: the S3 endpoint {self.endpoint} refused access ({code}; "
                f"{self._credential_source()}): the secret key may be wrong or the credentials lack permission "
                "for this bucket or prefix (secrets are never shown)")
        if code in _CONDITION_CODES:
            return PreconditionFailed(f"{what} {where}: the write's condition failed ({code})", key=key or "")
        if code in _DIGEST_CODES:
            return IntegrityError(
                f"{what} {where}: the server refused the body because its SHA-256 checksum did not match ({code}); "
                "the data changed in transit or on disk while uploading; nothing was stored")
        if code in _MISSING_KEY_CODES or status == 404:
            return BundleNotFound(f"{where} does not exist")
        message = exc.response.get("Error", {}).get("Message", "")
        return StoreError(f"{what} {where}: S3 error {code or status}: {message}")

    def _call(self, what: str, key: str | None, request: Callable[[], T]) -> T:
        """One request; botocore retries transient failures itself (``retry_mode``, ``max_attempts``)."""
        try:
            return request()
        except (BotoCoreError, ClientError) as exc:
            raise self._translate(exc, key, what) from None

    def _retrying(self, what: str, key: str, request: Callable[[], T]) -> T:
        """A part or a download, given further rounds (with backoff) where botocore's own retries end.

        botocore retries each request (``retry_mode``, ``max_attempts``): connection errors, 5xx, 503 SlowDown
        and other throttling, a part's body re-sent from its start. It cannot retry a response body that breaks
        while streaming (its retries end when the headers arrive), and it stops at its client-wide retry quota,
        which parallel parts drain together; one lost part would lose the whole multipart upload.
        """
        attempts = self.settings.max_attempts
        for attempt in range(1, attempts + 1):
            try:
                return request()
            except (BotoCoreError, ClientError) as exc:
                if attempt == attempts or not _another_round(exc):
                    raise self._translate(exc, key, what) from None
                delay = self.settings.retry_backoff_s * 2 ** (attempt - 1) * (0.5 + random.random() / 2)
                logger.warning("%s %s failed (%s); retry %d/%d in %.1f s",
                               what, self._where(key), type(exc).__name__, attempt, attempts - 1, delay)
                time.sleep(delay)
        raise AssertionError("unreachable")

    # reads ----------------------------------------------------------------------------------

    def _head(self, key: str) -> HeadObjectOutputTypeDef | None:
        try:
            return self._call("head", key, lambda: self.client.head_object(Bucket=self.bucket, Key=self._full(key)))
        except BundleNotFound:
            return None

    def head(self, key: str) -> ObjectInfo | None:
        response = self._head(key)
        if response is None:
            return None
        return ObjectInfo(key=key, size=int(response["ContentLength"]), etag=_etag(response),
                          last_modified=response["LastModified"], sha256=response.get("Metadata", {}).get(SHA256_META))

    def _existing_sha256(self, key: str) -> str | None:
        """sha256 of the object at ``key`` (None if absent): its stored checksum, else its streamed content."""
        info = self.head(key)
        if info is None:
            return None
        if info.sha256:
            return info.sha256
        # Written by another tool: hash it while streaming it to nowhere.
        return self._stream(key, None)

    def get_bytes(self, key: str) -> tuple[bytes, str]:
        def read() -> tuple[bytes, str]:
            response = self.client.get_object(Bucket=self.bucket, Key=self._full(key))
            return response["Body"].read(), _etag(response)

        return self._retrying("read", key, read)

    def _stream(self, key: str, dest: Path | None) -> str:
        def attempt() -> str:
            response = self.client.get_object(Bucket=self.bucket, Key=self._full(key))
            digest = hashlib.sha256()
            if dest is None:
                for chunk in response["Body"].iter_chunks(MiB):
                    digest.update(chunk)
                return digest.hexdigest()
            with open(dest, "wb") as out:  # truncates what a failed attempt left
                for chunk in response["Body"].iter_chunks(MiB):
                    digest.update(chunk)
                    out.write(chunk)
            return digest.hexdigest()

        return self._retrying("download", key, attempt)

    def download_file(self, key: str, dest: Path) -> str:
        return self._stream(key, dest)

    def list(self, prefix: str) -> list[ObjectInfo]:
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        cut = len(self.prefix) + 1 if self.prefix else 0

        def run() -> list[ObjectInfo]:
            found = []
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
                for item in page.get("Contents", []):
                    found.append(ObjectInfo(key=item["Key"][cut:], size=int(item["Size"]), etag=_etag(item),
                                            last_modified=item["LastModified"]))
            return found

        return self._call("list", prefix or None, run)

    def delete(self, key: str) -> None:
        self._call("delete", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=self._full(key)))

    def incomplete_uploads(self, prefix: str) -> builtins.list[IncompleteUpload]:
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        cut = len(self.prefix) + 1 if self.prefix else 0

        def run() -> builtins.list[IncompleteUpload]:
            found = []
            for page in self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=full):
                for item in page.get("Uploads", []):
                    found.append(IncompleteUpload(key=item["Key"][cut:], upload_id=item["UploadId"],
                                                  started=item["Initiated"]))
            return found

        return self._call("list uploads", prefix or None, run)

    def abort_upload(self, upload: IncompleteUpload) -> None:
        self._call("abort upload", upload.key, lambda: self.client.abort_multipart_upload(
            Bucket=self.bucket, Key=self._full(upload.key), UploadId=upload.upload_id))

    # writes ---------------------------------------------------------------------------------

    def _exists_error(self, key: str) -> ObjectExists:
        return ObjectExists(f"{self._where(key)} already exists; nothing was overwritten", key=key,
                            existing_sha256=self._existing_sha256(key))

    def put_bytes(self, key: str, data: bytes, *, if_match: str | None = None) -> PutResult:
        sha = hashlib.sha256(data).hexdigest()
        request: PutObjectRequestTypeDef = {"Bucket": self.bucket, "Key": self._full(key), "Body": data,
                                            "ChecksumSHA256": _hex_to_b64(sha), "Metadata": {SHA256_META: sha}}
        if if_match is not None:
            request["IfMatch"] = f'"{if_match}"'
        else:
            request["IfNoneMatch"] = "*"
        try:
            response = self._call("write", key, lambda: self.client.put_object(**request))
        except PreconditionFailed:
            raise self._condition_error(key, if_match) from None
        except BundleNotFound:  # AWS answers If-Match on a missing key with 404
            if if_match is None:
                raise
            raise self._condition_error(key, if_match) from None
        return PutResult(key=key, size=len(data), sha256=sha, etag=_etag(response))

    def _condition_error(self, key: str, if_match: str | None) -> BundleConflict:
        """What a failed ``If-None-Match``/``If-Match`` means, with the object's current state."""
        if if_match is None:
            return self._exists_error(key)
        info = self.head(key)
        current = info.etag if info else None
        return PreconditionFailed(
            f"{self._where(key)} changed since it was read (etag {current}, expected {if_match}); nothing was written",
            key=key, current_etag=current)

    def put_file(self, key: str, path: Path, *, sha256: str | None = None) -> PutResult:
        size = path.stat().st_size
        if self._head(key) is not None:
            # Fail before sending a byte: a retried publish skips what it already uploaded.
            raise self._exists_error(key)
        if size < self.settings.multipart_threshold:
            return self._put_small(key, path, size, sha256)
        return self._put_multipart(key, path, size, sha256)

    def _put_small(self, key: str, path: Path, size: int, expected: str | None) -> PutResult:
        data = path.read_bytes()  # below the multipart threshold: bounded by it
        if len(data) != size:
            raise IntegrityError(f"{path} changed size while it was read ({size} -> {len(data)} bytes)")
        # With the manifest's sha256 the server itself checks the file against the manifest.
        sha = expected or hashlib.sha256(data).hexdigest()
        try:
            response = self._call("upload", key, lambda: self.client.put_object(
                Bucket=self.bucket, Key=self._full(key), Body=data, ChecksumSHA256=_hex_to_b64(sha),
                Metadata={SHA256_META: sha}, IfNoneMatch="*"))
        except PreconditionFailed:
            raise self._condition_error(key, None) from None
        return PutResult(key=key, size=size, sha256=sha, etag=_etag(response))

    def _put_multipart(self, key: str, path: Path, size: int, expected: str | None) -> PutResult:
        full = self._full(key)
        part_size = max(self.settings.part_size, math.ceil(size / MAX_PARTS))
        metadata = {SHA256_META: expected} if expected else {}
        upload_id = self._call("start upload", key, lambda: self.client.create_multipart_upload(
            Bucket=self.bucket, Key=full, ChecksumAlgorithm="SHA256", Metadata=metadata))["UploadId"]
        try:
            with self._progress_bar(key, size) as advance:
                parts, sha = self._send_parts(key, path, upload_id, part_size, advance)
            if expected is not None and sha != expected:
                raise IntegrityError(
                    f"{path}: sha256 {sha} does not match the expected {expected}; the file changed after the "
                    f"manifest was written; the upload of {self._where(key)} was aborted")
            response = self._call("complete upload", key, lambda: self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=full, UploadId=upload_id, MultipartUpload={"Parts": parts}, IfNoneMatch="*"))
        except PreconditionFailed:
            self._abort_quietly(key, upload_id)
            raise self._condition_error(key, None) from None
        except BaseException:
            self._abort_quietly(key, upload_id)
            raise
        return PutResult(key=key, size=size, sha256=sha, etag=_etag(response))

    def _send_parts(self, key: str, path: Path, upload_id: str, part_size: int,
                    advance: Callable[[int], None]) -> tuple[builtins.list[CompletedPartTypeDef], str]:
        """Read ``path`` once, in order; hash it whole while parts upload in parallel."""
        whole = hashlib.sha256()
        slots = threading.BoundedSemaphore(self.settings.max_concurrency)
        failed = threading.Event()
        futures: list[Future[CompletedPartTypeDef]] = []

        def done(future: Future[CompletedPartTypeDef]) -> None:
            if future.exception() is not None:
                failed.set()  # before the slot is free: no part starts after a failed one (the outage budget)
            slots.release()

        with open(path, "rb") as handle, ThreadPoolExecutor(self.settings.max_concurrency,
                                                            thread_name_prefix="s3-part") as pool:
            number = 0
            while True:
                slots.acquire()  # bounds memory: no more than max_concurrency parts read ahead
                chunk = b"" if failed.is_set() else handle.read(part_size)
                if not chunk:
                    slots.release()
                    break
                number += 1
                whole.update(chunk)
                future = pool.submit(self._send_part, key, upload_id, number, chunk, advance)
                future.add_done_callback(done)
                futures.append(future)
                del chunk
        return [future.result() for future in futures], whole.hexdigest()

    def _send_part(self, key: str, upload_id: str, number: int, data: bytes,
                   advance: Callable[[int], None]) -> CompletedPartTypeDef:
        checksum = _b64(hashlib.sha256(data).digest())
        response = self._retrying(f"upload part {number} of", key, lambda: self.client.upload_part(
            Bucket=self.bucket, Key=self._full(key), UploadId=upload_id, PartNumber=number, Body=data,
            ChecksumSHA256=checksum))
        advance(len(data))
        return {"PartNumber": number, "ETag": response["ETag"], "ChecksumSHA256": checksum}

    def _abort_quietly(self, key: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self._full(key), UploadId=upload_id)
        except (BotoCoreError, ClientError) as exc:
            # gc removes it later; the original error matters more.
            logger.warning("could not abort the upload of %s (%s); `prefect-executorch gc` will remove it",
                           self._where(key), type(exc).__name__)

    @contextmanager
    def _progress_bar(self, key: str, total: int) -> Iterator[Callable[[int], None]]:
        lock = threading.Lock()
        sent = [0]
        callback = self._progress
        show = sys.stderr.isatty() if self.settings.progress is None else self.settings.progress
        if callback is None and not show:
            yield lambda n: None
            return
        bar: Any = None
        if callback is None:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

            bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                           TransferSpeedColumn(), console=Console(stderr=True), transient=True)
            task = bar.add_task(f"upload {key}", total=total)
            bar.start()

        def advance(n: int) -> None:
            with lock:
                sent[0] += n
                if callback is not None:
                    callback(key, sent[0], total)
                else:
                    bar.update(task, completed=sent[0])

        try:
            yield advance
        finally:
            if bar is not None:
                bar.stop()

