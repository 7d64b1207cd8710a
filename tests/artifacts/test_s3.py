"""The registry on a real S3 server (SeaweedFS, credentials enforced): publish, promote, pull, faults."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from prefect_executorch.artifacts.aliases import alias_history, move_alias, read_alias
from prefect_executorch.artifacts.catalog import Listing, ls, resolve
from prefect_executorch.artifacts.gc import gc
from prefect_executorch.artifacts.manifest import CLAIM_FILE, MANIFEST_FILE, BundleKey, Manifest
from prefect_executorch.artifacts.publishing import (
    BundleRef,
    file_entries,
    list_bundles,
    publish,
    pull,
    read_manifest,
    verify_bundle_dir,
)
from prefect_executorch.artifacts.s3 import S3Settings, S3Store
from prefect_executorch.artifacts.store import ObjectStore
from prefect_executorch.artifacts.urls import open_store
from prefect_executorch.cli.main import app
from prefect_executorch.errors import (
    BundleConflict,
    IntegrityError,
    ObjectExists,
    SpecError,
    StoreError,
    ToolchainMismatch,
    ValidationFailed,
)
from prefect_executorch.flows.build import build_bundle
from prefect_executorch.flows.promote import promote as promote_flow
from prefect_executorch.hashing import sha256_bytes, sha256_file
from prefect_executorch.machine.toolchain import GpuInfo, Toolchain, probe
from prefect_executorch.spec.buildspec import BuildSpec, parse_spec
from prefect_executorch.testing.seaweedfs import SeaweedS3, free_port

from helpers import check_bundle_runs, fresh_store, set_aws_env, spec_data

pytestmark = pytest.mark.s3
MiB = 2**20
runner = CliRunner()


@dataclass
class Built:
    """One real XNNPACK build published to SeaweedFS through the build flow."""

    spec: BuildSpec
    bucket: str
    url: str
    ref: BundleRef
    manifest: Manifest
    pte: Path


@pytest.fixture(scope="module")
def built(s3_server: SeaweedS3, prefect_harness: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    with pytest.MonkeyPatch.context() as patch:
        set_aws_env(patch, s3_server)
        bucket = s3_server.make_bucket()
        url = f"s3://{bucket}/registry"
        spec = parse_spec(spec_data("convnet", version="1"))
        out = tmp_path_factory.mktemp("export")
        ref = build_bundle(spec, store=url, output=str(out))
        manifest, _ = read_manifest(open_store(url), ref.key)
        yield Built(spec=spec, bucket=bucket, url=url, ref=ref, manifest=manifest, pte=next(out.rglob("model.pte")))


def synthetic(root: Path, built: Built, version: str, *, ptd: bytes | None = None, passed: bool = True,
              compat: str | None = None, target: str | None = None) -> tuple[Path, Manifest]:
    """A bundle directory with the build's real .pte (and an optional .ptd) and its manifest."""
    bundle = root / f"bundle-{uuid.uuid4().hex[:8]}"
    bundle.mkdir(parents=True)
    shutil.copy(built.pte, bundle / "model.pte")
    data_files = []
    if ptd is not None:
        (bundle / "model.ptd").write_bytes(ptd)
        data_files = ["model.ptd"]
    validation = built.manifest.validation.model_copy(update={"passed": passed, "failed_cases": 0 if passed else 1})
    manifest = built.manifest.model_copy(update={
        "version": version, "files": file_entries(bundle, "model.pte", data_files, []), "data_files": data_files,
        "validation": validation, "compat": compat or built.manifest.compat, "target": target or built.manifest.target,
        "created_at": datetime.now(UTC),
    })
    return bundle, manifest


def count_requests(store: S3Store) -> list[str]:
    """Every HTTP attempt the store's client makes from now on (retries included)."""
    sent: list[str] = []
    store.client.meta.events.register("before-send.s3", lambda request, **_: sent.append(request.url))
    return sent


# --- the whole path ----------------------------------------------------------------------------


def test_build_publish_promote_pull_run(built: Built, s3_env: SeaweedS3, tmp_path: Path) -> None:
    store = open_store(built.url)
    assert isinstance(store, S3Store)
    assert built.ref.key.prefix == "convnet/1/xnnpack/cpu-xnnpack-x86_64"
    names = sorted(info.key for info in store.list("convnet/1/"))
    files = ("manifest.json", "model.bpte", "model.pte", "validation.json")
    assert names == [f"convnet/1/xnnpack/cpu-xnnpack-x86_64/{f}" for f in files]
    head = store.client.head_object(Bucket=built.bucket, Key=f"registry/{built.ref.key.key('model.pte')}",
                                    ChecksumMode="ENABLED")
    assert head["Metadata"]["sha256"] == built.manifest.file("model.pte").sha256
    assert base64.b64decode(head["ChecksumSHA256"]).hex() == built.manifest.file("model.pte").sha256

    record = promote_flow("convnet", "1", "prod", store=built.url)
    assert (record.version, record.compat, record.forced) == ("1", "cpu-xnnpack-x86_64", False)
    assert record.manifest_sha256 == built.ref.manifest_sha256 and record.previous is None

    dest = tmp_path / "fresh" / "convnet-prod"
    result = runner.invoke(app, ["pull", "convnet", "--alias", "prod", "--to", str(dest), "--store", built.url])
    assert result.exit_code == 0, result.output
    assert "3 files verified" in result.output
    check_bundle_runs(built.spec, dest, verify_bundle_dir(dest))

    listing = Listing.model_validate_json(runner.invoke(app, ["ls", "convnet", "--json", "--store", built.url]).stdout)
    assert listing.bundles == [built.ref.key] and listing.aliases["prod"] == record and listing.incomplete == []


def test_second_publish_conflicts_first_manifest_intact(built: Built, s3_env: SeaweedS3, tmp_path: Path) -> None:
    store = open_store(built.url)
    before, raw_before = read_manifest(store, built.ref.key)
    bundle, manifest = synthetic(tmp_path, built, "1")
    with pytest.raises(BundleConflict, match=f"manifest sha256 {built.ref.manifest_sha256}"):
        publish(store, bundle, manifest)
    assert read_manifest(store, built.ref.key)[1] == raw_before


def test_retried_publish_skips_what_it_uploaded(built: Built, s3_env: SeaweedS3, tmp_path: Path) -> None:
    store = fresh_store(s3_env)
    bundle, manifest = synthetic(tmp_path, built, "7", ptd=b"w" * 10000)
    store.put_file(manifest.key.key("model.pte"), bundle / "model.pte")  # a publish died after its first file
    ref = publish(store, bundle, manifest)
    assert pull(store, ref.key, tmp_path / "pulled") == manifest
    # Someone else's object under the same key is not ours to reuse.
    other, other_manifest = synthetic(tmp_path, built, "8", ptd=b"x" * 10000)
    store.put_file(other_manifest.key.key("model.ptd"), bundle / "model.ptd")
    with pytest.raises(BundleConflict, match="already exists with other content.*gc"):
        publish(store, other, other_manifest)
    assert not store.exists(other_manifest.key.key(MANIFEST_FILE))


# --- credentials, bucket, network ----------------------------------------------------------------


def test_wrong_credentials_clear_error_no_secret(
    built: Built, s3_env: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    secret = f"wrong-{uuid.uuid4().hex}"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    caplog.set_level("DEBUG")
    bundle, manifest = synthetic(tmp_path, built, "2")
    with pytest.raises(StoreError) as info:
        publish(open_store(built.url), bundle, manifest)
    message = str(info.value)
    assert "secret key may be wrong" in message and "credentials from env" in message
    assert secret not in message and secret not in repr(info.value) and secret not in caplog.text
    result = runner.invoke(app, ["pull", "convnet", "--version", "1", "--compat", "cpu-xnnpack-x86_64",
                                 "--to", str(tmp_path / "d"), "--store", built.url])
    assert result.exit_code == 1 and "SignatureDoesNotMatch" in result.output and "Traceback" not in result.output
    assert secret not in result.output and not (tmp_path / "d").exists()


def test_missing_bucket_names_it(s3_env: SeaweedS3, tmp_path: Path) -> None:
    store = S3Store.from_url("s3://no-such-bucket-here/reg")
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(StoreError, match="bucket 'no-such-bucket-here' does not exist at http://127.0.0.1"):
        store.put_file("convnet/1/xnnpack/c/model.pte", tmp_path / "f")
    result = runner.invoke(app, ["ls", "convnet", "--store", "s3://no-such-bucket-here"])
    assert result.exit_code == 1 and "no-such-bucket-here" in result.output


def test_unreachable_server_is_retried_then_clear(s3_env: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_EXECUTORCH_S3_MAX_ATTEMPTS", "3")
    monkeypatch.setenv("PREFECT_EXECUTORCH_S3_CONNECT_TIMEOUT_S", "1")
    endpoint = f"http://127.0.0.1:{free_port()}"
    store = S3Store.from_url("s3://some-bucket/reg", endpoint_url=endpoint)
    sent = count_requests(store)
    started = time.monotonic()
    with pytest.raises(StoreError, match=f"cannot reach the S3 endpoint {endpoint}.*max_attempts=3"):
        store.get_bytes("convnet/aliases/prod.json")
    assert len(sent) == 3 and time.monotonic() - started < 15


@contextmanager
def silent_server() -> Iterator[str]:
    """An endpoint that accepts every connection and never answers: a store mid-outage (a hung proxy or server)."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:  # closed: the test is over
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()
        for connection in held:
            connection.close()


def test_a_store_that_never_answers_fails_a_publish_and_a_pull_within_the_outage_budget(
        built: Built, s3_env: SeaweedS3, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The budget docs/store.md states, computed from the settings, bounds what an outage costs: every request, every
    retry of botocore's and ours, and the time, before one line says what failed."""
    for field, value in {"MAX_ATTEMPTS": "2", "CONNECT_TIMEOUT_S": "1", "READ_TIMEOUT_S": "1",
                         "RETRY_BACKOFF_S": "0.1"}.items():
        monkeypatch.setenv(f"PREFECT_EXECUTORCH_S3_{field}", value)
    budget = S3Settings().outage_budget()
    assert (budget.requests, budget.longest_wait_s) == (8 * 2 * 2 + 2, 2 * (2 * 2 + 1) + 0.1 + 5)
    defaults = S3Settings.model_construct().outage_budget()  # the fields' defaults, no environment
    assert f"{defaults.requests} requests and {defaults.longest_wait_s:,} s" in (Path(__file__).parents[2] / "docs" / "store.md").read_text()
    with silent_server() as endpoint:
        store = S3Store.from_url("s3://some-bucket/reg", endpoint_url=endpoint)
        sent = count_requests(store)
        started = time.monotonic()
        with pytest.raises(StoreError) as info:
            publish(store, *synthetic(tmp_path, built, "30"))
        elapsed = time.monotonic() - started
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
        pulled = runner.invoke(app, ["pull", "convnet", "--version", "1", "--compat", "cpu-xnnpack-x86_64",
                                     "--to", str(tmp_path / "p"), "--store", "s3://some-bucket/reg"])
    assert f"lost the connection to the S3 endpoint {endpoint} (ReadTimeoutError" in str(info.value)
    assert "\n" not in str(info.value)
    assert 2 <= len(sent) <= budget.requests and elapsed <= budget.longest_wait_s, (len(sent), elapsed)
    assert pulled.exit_code == 1 and pulled.output.strip().count("\n") == 0, pulled.output
    assert f"the S3 endpoint {endpoint}" in pulled.output and not (tmp_path / "p").exists()


# --- integrity -------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["a/b", "..", "", "Upper", "../etc"])
def test_bad_names_refused_before_any_request(built: Built, s3_env: SeaweedS3, tmp_path: Path, bad: str) -> None:
    store = S3Store.from_url(built.url)
    sent = count_requests(store)
    bundle, manifest = synthetic(tmp_path, built, "6")
    attempts: list[Callable[[], Any]] = [
        lambda: publish(store, bundle, manifest.model_copy(update={"name": bad})),
        lambda: publish(store, bundle, manifest.model_copy(update={"version": bad})),
        lambda: resolve(store, bad, version="1", compat="cpu-xnnpack-x86_64"),
        lambda: resolve(store, "convnet", alias=bad, compat="cpu-xnnpack-x86_64"),
        lambda: move_alias(store, bad, "1", "prod"),
        lambda: move_alias(store, "convnet", "1", bad),
        lambda: pull(store, BundleKey.of("convnet", bad, "xnnpack", "cpu-xnnpack-x86_64"), tmp_path / "x"),
        lambda: ls(store, bad),
        lambda: gc(store, bad or "/"),
    ]
    for attempt in attempts:
        with pytest.raises(SpecError, match="is not a valid name"):
            attempt()
    result = runner.invoke(app, ["pull", bad, "--version", "1", "--to", str(tmp_path / "y"), "--store", built.url])
    assert result.exit_code == 2 and "is not a valid name" in result.output
    assert sent == []


# --- aliases ----------------------------------------------------------------------------------------


def test_promote_unvalidated_refused_unless_forced(built: Built, any_store: ObjectStore, tmp_path: Path) -> None:
    publish(any_store, *synthetic(tmp_path, built, "20", passed=False))
    with pytest.raises(ValidationFailed, match="failed its validation.*--force"):
        move_alias(any_store, "convnet", "20", "prod")
    assert read_alias(any_store, "convnet", "prod") is None
    record = move_alias(any_store, "convnet", "20", "prod", force=True)
    assert record.forced and not record.validation_passed
    assert [h.forced for h in alias_history(any_store, "convnet", "prod")] == [True]


def test_cli_promote_force_and_ls(built: Built, s3_env: SeaweedS3, tmp_path: Path) -> None:
    store = fresh_store(s3_env)
    publish(store, *synthetic(tmp_path, built, "21", passed=False))
    args = ["promote", "convnet", "21", "--alias", "prod", "--store", store.url]
    refused = runner.invoke(app, args)
    assert refused.exit_code == 1 and "ValidationFailed" in refused.output and "Traceback" not in refused.output
    forced = runner.invoke(app, [*args, "--force"])
    assert forced.exit_code == 0 and "forced" in forced.output
    table = runner.invoke(app, ["ls", "convnet", "--store", store.url])
    assert table.exit_code == 0 and "21" in table.output and "prod" in table.output


# --- resolve ------------------------------------------------------------------------------------------


def test_resolve_picks_what_fits(built: Built, s3_env: SeaweedS3, tmp_path: Path) -> None:
    store = fresh_store(s3_env)
    arch = probe().arch
    other = "aarch64" if arch != "aarch64" else "x86_64"
    for compat, target in [(f"cpu-xnnpack-{arch}", "xnnpack"), (f"cpu-portable-{arch}", "portable"),
                           (f"cpu-xnnpack-{other}", "xnnpack"), ("cu132-sm90-trt11.1-x86_64", "tensorrt"),
                           ("cu132-sm80plus-trt11.1plus-x86_64", "tensorrt")]:
        publish(store, *synthetic(tmp_path, built, "30", compat=compat, target=target))
    publish(store, *synthetic(tmp_path, built, "31", compat="cu132-sm90-trt11.1-x86_64", target="tensorrt"))

    assert resolve(store, "convnet", version="30").key.compat == f"cpu-xnnpack-{arch}"
    assert resolve(store, "convnet", version="30", target="portable").key.compat == f"cpu-portable-{arch}"
    with pytest.raises(ToolchainMismatch, match="no bundle of convnet 31 fits this machine.*needs CUDA channel cu132"):
        resolve(store, "convnet", version="31")
    gpu = Toolchain(python="3.11", os="Linux", arch="x86_64", torch="2.14.0+cu132", cuda_channel="cu132",
                    tensorrt="11.1.0.5", gpus=[GpuInfo(index=0, name="H100", sm="sm90", total_memory_mib=80000)])
    chosen = resolve(store, "convnet", version="30", target="tensorrt", toolchain=gpu)
    assert chosen.key.compat == "cu132-sm90-trt11.1-x86_64"
    ampere = gpu.model_copy(update={"tensorrt": "11.3.0", "gpus": [gpu.gpus[0].model_copy(update={"sm": "sm86"})]})
    assert resolve(store, "convnet", version="30", target="tensorrt", toolchain=ampere).key.compat == \
        "cu132-sm80plus-trt11.1plus-x86_64"
    with pytest.raises(ToolchainMismatch, match="sm90, this GPU is sm86"):
        resolve(store, "convnet", version="31", toolchain=ampere)


# --- transfers ----------------------------------------------------------------------------------------


def test_multipart_upload_checksummed_and_verified(built: Built, s3_env: SeaweedS3, tmp_path: Path) -> None:
    progress: list[int] = []
    store = S3Store(s3_env.make_bucket(), "reg", settings=S3Settings(multipart_threshold=5 * MiB, part_size=5 * MiB),
                    progress=lambda key, done, total: progress.append(done))
    bundle, manifest = synthetic(tmp_path, built, "40", ptd=os.urandom(12 * MiB))
    ref = publish(store, bundle, manifest)
    head = store.client.head_object(Bucket=store.bucket, Key=f"reg/{ref.key.key('model.ptd')}", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"].endswith("-3") and head["ContentLength"] == 12 * MiB
    assert head["Metadata"]["sha256"] == sha256_file(bundle / "model.ptd")
    assert sorted(progress)[-1] == 12 * MiB and len(progress) == 3
    assert pull(store, ref.key, tmp_path / "pulled") == manifest
    assert store.incomplete_uploads("") == []


def test_server_refuses_a_wrong_checksum(s3_env: SeaweedS3, tmp_path: Path) -> None:
    store = fresh_store(s3_env, multipart_threshold=5 * MiB, part_size=5 * MiB)
    small, big = tmp_path / "small", tmp_path / "big"
    small.write_bytes(b"program bytes")
    big.write_bytes(os.urandom(11 * MiB))
    # The expected sha256 travels as x-amz-checksum-sha256: the server, not us, refuses the body.
    with pytest.raises(IntegrityError, match="BadDigest"):
        store.put_file("m/1/t/c/model.pte", small, sha256=hashlib.sha256(b"other bytes").hexdigest())
    assert store.head("m/1/t/c/model.pte") is None
    # In parts, our running hash catches it before the upload completes; nothing becomes visible.
    with pytest.raises(IntegrityError, match="upload of .* was aborted"):
        store.put_file("m/1/t/c/model.ptd", big, sha256="0" * 64)
    assert store.head("m/1/t/c/model.ptd") is None and store.incomplete_uploads("") == []
    # And the server checks every part's checksum itself.
    key = "reg/m/1/t/c/part-test"
    upload = store.client.create_multipart_upload(Bucket=store.bucket, Key=key, ChecksumAlgorithm="SHA256")
    body = os.urandom(5 * MiB)
    wrong = base64.b64encode(hashlib.sha256(body[:-1]).digest()).decode()
    with pytest.raises(ClientError, match="BadDigest"):
        store.client.upload_part(Bucket=store.bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=body,
                                 ChecksumSHA256=wrong)
    store.client.abort_multipart_upload(Bucket=store.bucket, Key=key, UploadId=upload["UploadId"])


def test_fresh_buckets_do_not_exhaust_the_servers_volumes(s3_server: SeaweedS3) -> None:
    """Each bucket takes a volume of its own; the test server must have room for a whole session's buckets."""
    def free_volumes() -> int:
        url = f"http://127.0.0.1:{s3_server.ports['master']}/dir/status"
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(json.load(response)["Topology"]["Free"])

    before = free_volumes()
    s3_server.client().put_object(Bucket=s3_server.make_bucket(), Key="k", Body=b"one")
    deadline = time.monotonic() + 10  # the master learns of the new volume at the volume server's next heartbeat
    while free_volumes() >= before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert free_volumes() < before, "a write into a fresh bucket should take a volume of its own"
    # Left to its default (free disk / volume size) weed allowed 43 here, fewer than a full run makes.
    assert free_volumes() >= 1000


def test_the_servers_data_is_far_from_weeds_free_space_floor(s3_server: SeaweedS3) -> None:
    """weed refuses every write once its data's filesystem has under 1% free: a full CI disk must not reach it."""
    assert s3_server.workdir is not None
    stat = os.statvfs(s3_server.workdir)
    assert stat.f_bavail / stat.f_blocks > 0.05, s3_server.diagnostics()
    assert f"data: {s3_server.workdir}" in s3_server.diagnostics()


def test_create_only_and_compare_and_swap(s3_env: SeaweedS3, tmp_path: Path) -> None:
    store = fresh_store(s3_env)
    first = store.put_bytes("m/aliases/a.json", b"one")
    with pytest.raises(ObjectExists) as exists:
        store.put_bytes("m/aliases/a.json", b"two")
    assert exists.value.existing_sha256 == sha256_bytes(b"one")
    second = store.put_bytes("m/aliases/a.json", b"two", if_match=first.etag)
    with pytest.raises(BundleConflict, match="changed since it was read"):
        store.put_bytes("m/aliases/a.json", b"three", if_match=first.etag)
    assert store.get_bytes("m/aliases/a.json") == (b"two", second.etag)


# --- gc --------------------------------------------------------------------------------------------------


def test_gc_removes_only_old_orphans(built: Built, any_store: ObjectStore, tmp_path: Path) -> None:
    bundle, manifest = synthetic(tmp_path, built, "50")
    kept = publish(any_store, bundle, manifest)
    stale_claim = kept.key.key(CLAIM_FILE)  # a publisher died between its manifest and removing its claim
    any_store.put_bytes(stale_claim, b'{"files_sha256": "0", "builder": "gone"}')
    orphan = BundleKey.of("convnet", "51", "xnnpack", manifest.compat)
    any_store.put_file(orphan.key("model.pte"), bundle / "model.pte")
    unfinished = orphan.key("model.ptd")
    if isinstance(any_store, S3Store):
        any_store.client.create_multipart_upload(Bucket=any_store.bucket, Key=f"reg/{unfinished}")
    else:
        leftover = any_store.root / orphan.prefix / ".tmp-dead-model.ptd"
        leftover.write_bytes(b"half")

    assert gc(any_store).orphans == []  # younger than the 24 h grace: a publish may still be running
    later = datetime.now(UTC) + timedelta(hours=25)
    dry = gc(any_store, now=later)
    assert [o.key for o in dry.orphans] == [stale_claim, orphan.key("model.pte")] and not dry.applied
    assert [u.key for u in dry.uploads] == [unfinished if isinstance(any_store, S3Store) else
                                            f"{orphan.prefix}/.tmp-dead-model.ptd"]
    assert any_store.exists(orphan.key("model.pte"))
    applied = gc(any_store, "convnet", now=later, apply=True)
    assert applied.applied and len(applied.orphans) == 2
    assert not any_store.exists(orphan.key("model.pte")) and any_store.incomplete_uploads("") == []
    assert not any_store.exists(stale_claim) and any_store.exists(kept.manifest_key)
    assert pull(any_store, kept.key, tmp_path / "kept") == manifest
    assert gc(any_store, now=later).orphans == []


def test_cli_gc_dry_run_then_apply(built: Built, s3_env: SeaweedS3, tmp_path: Path) -> None:
    store = fresh_store(s3_env)
    bundle, manifest = synthetic(tmp_path, built, "52")
    store.put_file(manifest.key.key("model.pte"), bundle / "model.pte")
    dry = runner.invoke(app, ["gc", "--grace-hours", "0", "--store", store.url])
    assert dry.exit_code == 0 and "would remove convnet/52/" in dry.output and "dry run" in dry.output
    assert store.exists(manifest.key.key("model.pte"))
    applied = runner.invoke(app, ["gc", "--grace-hours", "0", "--apply", "--store", store.url])
    assert applied.exit_code == 0 and "removed convnet/52/" in applied.output
    assert store.list("") == []


# --- prefect-aws blocks (the `aws` extra) ---------------------------------------------------------------


def test_prefect_aws_block_is_a_store(built: Built, s3_server: SeaweedS3, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    prefect_aws = pytest.importorskip("prefect_aws", reason="prefect-aws is the optional `aws` extra")
    set_aws_env(monkeypatch, s3_server)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(name)  # the block alone says where and who
    credentials = prefect_aws.AwsCredentials(
        aws_access_key_id=s3_server.access_key, aws_secret_access_key=s3_server.secret_key,
        region_name=s3_server.region, aws_client_parameters={"endpoint_url": s3_server.endpoint_url})
    block = prefect_aws.S3Bucket(bucket_name=s3_server.make_bucket(), bucket_folder="blocks", credentials=credentials)
    store = open_store(block)
    assert isinstance(store, S3Store) and store.url == f"s3://{block.bucket_name}/blocks"
    bundle, manifest = synthetic(tmp_path, built, "60")
    ref = publish(store, bundle, manifest)
    record = promote_flow("convnet", "60", "prod", store=block)
    assert record.manifest_sha256 == ref.manifest_sha256
    resolved = resolve(store, "convnet", alias="prod", compat=manifest.compat)
    assert pull(store, resolved.key, tmp_path / "pulled", manifest_sha256=resolved.manifest_sha256) == manifest


def test_prefect_aws_block_client_parameters_reach_the_client(s3_server: SeaweedS3,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """What prefect-aws's get_params_override() gives (endpoint, verify, config) reaches our client, ours kept."""
    prefect_aws = pytest.importorskip("prefect_aws", reason="prefect-aws is the optional `aws` extra")
    set_aws_env(monkeypatch, s3_server)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(name)
    credentials = prefect_aws.AwsCredentials(
        aws_access_key_id=s3_server.access_key, aws_secret_access_key=s3_server.secret_key, region_name="eu-west-3",
        aws_client_parameters={"endpoint_url": s3_server.endpoint_url, "verify": False,
                               "config": {"retries": {"mode": "adaptive", "total_max_attempts": 2},
                                          "s3": {"addressing_style": "path"}}})
    block = prefect_aws.S3Bucket(bucket_name=s3_server.make_bucket(), bucket_folder="p", credentials=credentials)
    store = S3Store.from_block(block, settings=S3Settings(retry_mode="standard", max_attempts=7))
    config = store.client.meta.config
    assert store.endpoint == s3_server.endpoint_url and store.client.meta.region_name == "eu-west-3"
    assert config.retries == {"mode": "adaptive", "total_max_attempts": 2}  # the block's, over our settings
    assert config.s3 == {"addressing_style": "path"}
    assert config.request_checksum_calculation == "when_required" and config.connect_timeout == 10.0  # ours
    assert store.client._endpoint.http_session._verify is False  # noqa: SLF001 (botocore keeps it nowhere public)
    store.put_bytes("m/1/t/c/x.json", b"{}")
    assert store.get_bytes("m/1/t/c/x.json")[0] == b"{}"


def test_cli_build_reaches_s3_through_its_endpoint_url_option(s3_server: SeaweedS3, tmp_path: Path) -> None:
    # boto3's chain knows credentials but no endpoint: only --endpoint-url leads to the server.
    env = {name: value for name, value in {**os.environ, **s3_server.env()}.items()
           if name not in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "PREFECT_EXECUTORCH_STORE")}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(spec_data("mlp", methods={"forward": {"inputs": [{"name": "x", "shape": [2, 32]}]}},
                                         target="portable")))
    url = f"s3://{s3_server.make_bucket()}/reg"
    done = subprocess.run([sys.executable, "-m", "prefect_executorch.cli", "build", str(spec), "--store", url,
                           "--endpoint-url", s3_server.endpoint_url], capture_output=True, text=True, env=env,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "fresh build: mlp/1/portable/" in done.stdout
    store = S3Store.from_url(url, endpoint_url=s3_server.endpoint_url)
    assert [key.version for key in list_bundles(store, "mlp")] == ["1"]
