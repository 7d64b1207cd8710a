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
from _common import interleaved, report  # noqa: E402
from publish_1gib import throughput_figures, timed, write_random  # noqa: E402

from prefect_executorch.artifacts.s3 import MiB, S3Settings, S3Store  # noqa: E402
from prefect_executorch.hashing import sha256_file  # noqa: E402
from prefect_executorch.testing.seaweedfs import SeaweedS3  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3, help="Timed downloads per side (the medians are compared).")
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
            runs = interleaved({"baseline": lambda _: timed(baseline), "ours": lambda _: timed(ours)}, args.runs)
        if {sha for _, _, sha in runs["baseline"] + runs["ours"]} != {want}:
            raise SystemExit(f"sha256 differs: stored {want}, runs {runs}")
        mib = size / MiB
        ratio, ours_rss, figures = throughput_figures(
            runs, mib, "baseline download_file + hashlib", "S3Store.download_file (hashed while received)")
        passed = report("pull", ratio, ">=0.95", {"size_mib": round(mib), **figures},
                        checks={"peak RSS growth within 128 MiB": ours_rss <= 128 * MiB})
        return 0 if passed else 1
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
