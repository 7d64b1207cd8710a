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
from _common import interleaved, report, spread  # noqa: E402
from publish_1gib import timed, write_random  # noqa: E402

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
        base, ours_runs = spread([s for s, _, _ in runs["baseline"]]), spread([s for s, _, _ in runs["ours"]])
        ours_rss = max(rss for _, rss, _ in runs["ours"])
        passed = report("pull", base["median_s"] / ours_runs["median_s"], ">=0.95", {
            "size_mib": round(mib),
            "runs (interleaved; throughput ratio of the medians)": args.runs,
            "baseline download_file + hashlib": base,
            "baseline MiB/s (median)": round(mib / base["median_s"], 1),
            "baseline peak RSS growth MiB (max)": round(max(rss for _, rss, _ in runs["baseline"]) / MiB),
            "S3Store.download_file (hashed while received)": ours_runs,
            "ours MiB/s (median)": round(mib / ours_runs["median_s"], 1),
            "ours peak RSS growth MiB (max)": round(ours_rss / MiB),
            "peak RSS growth within 128 MiB": ours_rss <= 128 * MiB,
        })
        return 0 if passed else 1
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
