"""Pull + verify throughput and memory: ``S3Store.download_file`` (hashes while it downloads)
against raw boto3 ``download_file`` followed by a separate hashlib pass.

    python benchmarks/pull_verify.py                  # 1 GiB
    python benchmarks/pull_verify.py --size-mib 64    # CI smoke run

The last line is ``RESULT pull ratio=<ours/baseline throughput> goal=>=0.95 PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import boto3
from botocore.config import Config

sys.path.insert(0, str(Path(__file__).parent))
from _common import report  # noqa: E402
from publish_1gib import timed, write_random  # noqa: E402

from prefect_executorch.artifacts.s3 import MiB, S3Settings, S3Store  # noqa: E402
from prefect_executorch.hashing import sha256_file  # noqa: E402
from prefect_executorch.testing.seaweedfs import SeaweedS3  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    args = parser.parse_args()
    settings = S3Settings()
    size = args.size_mib * MiB
    server = SeaweedS3().start()
    try:
        session = boto3.session.Session(aws_access_key_id=server.access_key,
                                        aws_secret_access_key=server.secret_key, region_name=server.region)
        bucket = server.make_bucket()
        raw = session.client("s3", endpoint_url=server.endpoint_url,
                             config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                                           max_pool_connections=settings.max_concurrency + 4))
        store = S3Store(bucket, "bench", session=session, settings=settings.model_copy(
            update={"endpoint_url": server.endpoint_url, "addressing_style": "path"}))
        with tempfile.TemporaryDirectory(prefix="pull-bench-") as tmp:
            source = Path(tmp) / "blob.bin"
            write_random(source, size)
            want = store.put_file("blob.bin", source).sha256
            source.unlink()

            def baseline() -> str:
                raw.download_file(bucket, "bench/blob.bin", str(Path(tmp) / "base.bin"),
                                  Config=settings.transfer_config())
                return sha256_file(Path(tmp) / "base.bin")

            def ours() -> str:
                return store.download_file("blob.bin", Path(tmp) / "ours.bin")

            baseline(), ours()  # warm-up: connections and page cache alike
            base_s, base_rss, base_sha = timed(baseline)
            ours_s, ours_rss, ours_sha = timed(ours)
        if not base_sha == ours_sha == want:
            raise SystemExit(f"sha256 differs: stored {want}, baseline {base_sha}, ours {ours_sha}")
        mib = size / MiB
        passed = report("pull", base_s / ours_s, ">=0.95", {
            "size_mib": round(mib),
            "baseline download_file + hashlib": f"{base_s:.2f} s, {mib / base_s:.1f} MiB/s, peak RSS +{base_rss / MiB:.0f} MiB",
            "S3Store.download_file (hashed while received)":
                f"{ours_s:.2f} s, {mib / ours_s:.1f} MiB/s, peak RSS +{ours_rss / MiB:.0f} MiB",
            "peak RSS growth within 128 MiB": ours_rss <= 128 * MiB,
        })
        return 0 if passed else 1
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
