"""Store faults on a real SeaweedFS: the server killed mid-publish, resets and 503s on the wire."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from prefect_executorch.artifacts.gc import gc
from prefect_executorch.artifacts.manifest import CLAIM_FILE, MANIFEST_FILE
from prefect_executorch.artifacts.publishing import publish, pull, verify_bundle_dir
from prefect_executorch.artifacts.s3 import S3Settings, S3Store
from prefect_executorch.errors import BundleConflict, BundleNotFound, StoreError
from prefect_executorch.hashing import sha256_file
from prefect_executorch.testing.seaweedfs import SeaweedS3, ram_disk

from faultproxy import FaultProxy, Rule
from helpers import set_aws_env
from realbundle import RealBundle

pytestmark = [pytest.mark.s3, pytest.mark.slow]
MiB = 2**20
#: Fail fast once the server is gone: two attempts, short waits.
IMPATIENT = {"multipart_threshold": 8 * MiB, "part_size": 8 * MiB, "max_concurrency": 4, "max_attempts": 2,
             "retry_backoff_s": 0.1, "connect_timeout_s": 1.0, "read_timeout_s": 20.0}


def test_server_killed_mid_multipart_publish(real_bundle: Callable[[str], RealBundle], faults: Any,
                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fault = faults("store", "S3 server SIGKILLed mid multipart publish (200 MB), restarted")
    bundle = real_bundle("wide_200mb")
    assert sum(entry.size for entry in bundle.manifest.files) >= 200 * MiB
    key = bundle.manifest.key
    with SeaweedS3(root=ram_disk()) as server:
        set_aws_env(monkeypatch, server)
        bucket = server.make_bucket()
        convnet = real_bundle("convnet")
        bystander = publish(S3Store(bucket, "reg", settings=S3Settings(**IMPATIENT)),
                            *convnet.variant(tmp_path / "bystander", version="99")).key
        killed_at: list[int] = []

        def kill_a_third_of_the_way(name: str, done: int, total: int) -> None:
            if done >= total // 3 and not killed_at:
                killed_at.append(done)
                server.kill()

        store = S3Store(bucket, "reg", settings=S3Settings(**IMPATIENT), progress=kill_a_third_of_the_way)
        with fault.expect(StoreError):
            publish(store, bundle.dir, bundle.manifest)
        assert killed_at and killed_at[0] < bundle.manifest.file("model.ptd").size

        server.restart()
        store = S3Store(bucket, "reg", settings=S3Settings(**IMPATIENT))
        left = {info.key for info in store.list("")}
        assert key.key(MANIFEST_FILE) not in left and key.key("model.ptd") not in left
        # The retried publish (same files) resumes under its own claim and completes.
        ref = publish(store, bundle.dir, bundle.manifest)
        assert {info.key for info in store.list("") if not info.key.startswith(bystander.prefix)} == {
            key.key(e.path) for e in bundle.manifest.files} | {key.key(MANIFEST_FILE)}
        assert pull(store, ref.key, tmp_path / "pulled") == bundle.manifest
        assert verify_bundle_dir(tmp_path / "pulled") == bundle.manifest
        # What the killed upload left (an unfinished multipart upload) is gc's, and only that.
        assert store.incomplete_uploads(""), "the killed upload left no unfinished multipart upload to clear"
        report = gc(store, grace=timedelta(0), apply=True)
        assert [o.key for o in report.orphans] == [] and store.incomplete_uploads("") == []
        assert pull(store, ref.key, tmp_path / "again") == bundle.manifest
        fault.check_intact(store, [bystander], tmp_path / "after")
        assert fault.lost == 0


def test_resets_and_503s_during_publish_and_pull(real_bundle: Callable[[str], RealBundle], s3_env: SeaweedS3,
                                                 faults: Any, tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    bundle = real_bundle("wide_24mb")
    rules = [
        Rule("PUT", "reset", 3, match="partNumber=", after=2 * MiB),
        Rule("PUT", "503", 3, match="partNumber="),
        Rule("PUT", "503", 1, match=CLAIM_FILE),
        Rule("PUT", "503", 1, match=MANIFEST_FILE),
        Rule("GET", "reset", 2, match="model.ptd", after=2 * MiB),
        Rule("GET", "503", 2, match="model.pte"),
        Rule("GET", "503", 1, match=MANIFEST_FILE),
    ]
    # One row per rule from the start: a failing run shows its rows too, with what the proxy gave as injected.
    rows = [faults("store", f"{rule.fault} on {rule.method} {rule.match or 'any'} (fault proxy)") for rule in rules]
    try:
        with FaultProxy(int(s3_env.endpoint_url.rsplit(":", 1)[1]), rules) as proxy:
            store = S3Store(s3_env.make_bucket(), "reg", settings=S3Settings(
                endpoint_url=proxy.endpoint_url, multipart_threshold=5 * MiB, part_size=5 * MiB, max_concurrency=2,
                max_attempts=3, retry_backoff_s=0.05))
            ref = publish(store, bundle.dir, bundle.manifest)
            pulled = pull(store, ref.key, tmp_path / "pulled")
            assert store.incomplete_uploads("") == []
    finally:
        for row, rule in zip(rows, rules, strict=True):
            row.outcome(injected=rule.hits, survived=rule.hits)  # each hit retried; they stand if every check passes
    assert [(rule.hits, rule.times) for rule in rules] == [(rule.times, rule.times) for rule in rules]
    assert pulled == bundle.manifest and verify_bundle_dir(tmp_path / "pulled") == bundle.manifest
    for path in (bundle.manifest.program, *bundle.manifest.data_files):
        assert (tmp_path / "pulled" / path).read_bytes() == (bundle.dir / path).read_bytes()
    assert "retry 1/" in caplog.text  # our own retry took over where botocore's stopped


def test_concurrent_publishes_while_the_server_dies(real_bundle: Callable[[str], RealBundle], faults: Any,
                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A publish that loses its server keeps its claim: another build cannot slip in, a rerun of the same build can."""
    fault = faults("store", "S3 killed mid publish; another build, then a rerun, try the key")
    bundle = real_bundle("wide_24mb")
    with SeaweedS3(root=ram_disk()) as server:
        set_aws_env(monkeypatch, server)
        bucket = server.make_bucket()
        started = threading.Event()

        def kill_on_first_part(name: str, done: int, total: int) -> None:
            if not started.is_set():
                started.set()
                server.kill()

        store = S3Store(bucket, "reg", settings=S3Settings(**{**IMPATIENT, "part_size": 5 * MiB,
                                                               "multipart_threshold": 5 * MiB}),
                        progress=kill_on_first_part)
        with fault.expect(StoreError):
            publish(store, bundle.dir, bundle.manifest)
        server.restart()
        store = S3Store(bucket, "reg", settings=S3Settings(**IMPATIENT))
        # Another build of the same name and version (another program) must not slip in before the retry.
        with fault.expect(BundleConflict, match="is being published by .* with other content"):
            publish(store, *real_bundle("mlp").under(bundle).variant(tmp_path))
        # A rerun of the same build (validated again: another report) resumes the publish.
        rerun_dir, rerun = bundle.variant(tmp_path, report_suffix=b"\n")
        assert publish(store, rerun_dir, rerun).key == bundle.manifest.key
        assert pull(store, bundle.manifest.key, tmp_path / "pulled") == rerun


def test_parts_get_rounds_past_botocores_retries_small_writes_do_not(s3_env: SeaweedS3, tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """botocore retries each request; only a part (and a download) gets further rounds of ours, a 4xx none."""
    part_503s = Rule("PUT", "503", 3, match="partNumber=")  # more than botocore's 2 attempts at one part
    small_503s = Rule("PUT", "503", 2, match="small.json")  # exactly botocore's 2 attempts
    with FaultProxy(int(s3_env.endpoint_url.rsplit(":", 1)[1]), [part_503s, small_503s]) as proxy:
        store = S3Store(s3_env.make_bucket(), "reg", settings=S3Settings(
            endpoint_url=proxy.endpoint_url, multipart_threshold=5 * MiB, part_size=5 * MiB, max_concurrency=1,
            max_attempts=2, retry_backoff_s=0.05))
        big = tmp_path / "big"
        big.write_bytes(bytes(range(256)) * (6 * MiB // 256))
        assert store.put_file("m/1/t/c/model.ptd", big).sha256 == sha256_file(big)
        assert "upload part 1 of" in caplog.text and "retry 1/1" in caplog.text

        before = proxy.requests
        with pytest.raises(StoreError, match="S3 error SlowDown"):
            store.put_bytes("m/1/t/c/small.json", b"{}")
        assert proxy.requests - before == 2  # botocore's attempts, no round of ours

        before = proxy.requests
        with pytest.raises(BundleNotFound):
            store.get_bytes("m/1/t/c/absent.json")
        assert proxy.requests - before == 1  # a 404 is neither botocore's retry nor ours
    assert (part_503s.hits, small_503s.hits) == (3, 2)
