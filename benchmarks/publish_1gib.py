"""Publish throughput and memory: ``S3Store.put_file`` against raw boto3 ``upload_file`` + a hashlib pass.

Both sides end with the same facts: the object stored and the file's sha256 known. The baseline
uploads with boto3's ``upload_file`` (same part size and concurrency, boto3's default checksums)
and then hashes the file in a second pass; ``S3Store`` sends SHA-256 checksums on the wire,
refuses to overwrite, and hashes while it uploads. Both run in the same process against the same
SeaweedFS (started here unless ``--endpoint-url``), one after the other, baseline first, after
one untimed warm-up upload each.

    python benchmarks/publish_1gib.py                  # 1 GiB
    python benchmarks/publish_1gib.py --size-mib 64    # CI smoke run

The last line is ``RESULT publish ratio=<ours/baseline throughput> goal=>=0.95 PASS|FAIL``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

sys.path.insert(0, str(Path(__file__).parent))
from _common import interleaved, report, spread  # noqa: E402

from prefect_executorch.artifacts.s3 import MiB, S3Settings, S3Store  # noqa: E402
from prefect_executorch.hashing import sha256_file  # noqa: E402
from prefect_executorch.testing.seaweedfs import SeaweedS3  # noqa: E402


def rss_bytes() -> int:
    """Resident set size of this process."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def peak_rss_growth() -> Iterator[list[int]]:
    """Sample RSS every 20 ms; yields a list whose one item becomes the peak growth in bytes."""
    start, peak, stop = rss_bytes(), [rss_bytes()], threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            peak[0] = max(peak[0], rss_bytes())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    result = [0]
    try:
        yield result
    finally:
        stop.set()
        thread.join()
        result[0] = max(peak[0], rss_bytes()) - start


def timed(run: Callable[[], str]) -> tuple[float, int, str]:
    """Seconds, peak RSS growth and the sha256 ``run`` returns."""
    with peak_rss_growth() as growth:
        started = time.perf_counter()
        sha = run()
        seconds = time.perf_counter() - started
    return seconds, growth[0], sha


def throughput_figures(runs: dict[str, list[tuple[float, int, str]]], mib: float, baseline: str,
                       ours: str) -> tuple[float, int, dict[str, Any]]:
    """Throughput ratio of the medians (ours / baseline), our largest peak RSS growth, and the figures of both sides."""
    times = {side: spread([seconds for seconds, _, _ in runs[side]]) for side in ("baseline", "ours")}
    peaks = {side: max(rss for _, rss, _ in runs[side]) for side in ("baseline", "ours")}
    figures: dict[str, Any] = {"runs (interleaved; throughput ratio of the medians)": len(runs["ours"])}
    for side, label in (("baseline", baseline), ("ours", ours)):
        figures[label] = times[side]
        figures[f"{side} MiB/s (median)"] = round(mib / times[side]["median_s"], 1)
        figures[f"{side} peak RSS growth MiB (max)"] = round(peaks[side] / MiB)
    return times["baseline"]["median_s"] / times["ours"]["median_s"], peaks["ours"], figures


def write_random(path: Path, size: int) -> None:
    """``size`` bytes of random data, written in 16 MiB blocks."""
    block = os.urandom(16 * MiB)
    with open(path, "wb") as handle:
        left = size
        while left:
            n = min(left, len(block))
            handle.write(block[:n])
            left -= n
            block = block[1:] + block[:1] if left else block  # blocks differ, so nothing dedups


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3, help="Timed uploads per side (the medians are compared).")
    parser.add_argument("--part-size-mib", type=int, default=None, help="Default: S3Settings' part size.")
    parser.add_argument("--concurrency", type=int, default=None, help="Default: S3Settings' max_concurrency.")
    parser.add_argument("--endpoint-url", default=None, help="An existing S3 endpoint (credentials from env).")
    parser.add_argument("--bucket", default=None, help="With --endpoint-url: an existing bucket.")
    parser.add_argument("--workdir", default=None, help="Where to write the test file (default: a temp dir).")
    args = parser.parse_args()

    settings = S3Settings()
    updates = {}
    if args.part_size_mib:
        updates["part_size"] = args.part_size_mib * MiB
    if args.concurrency:
        updates["max_concurrency"] = args.concurrency
    settings = settings.model_copy(update=updates)
    size = args.size_mib * MiB

    server = None if args.endpoint_url else SeaweedS3().start()
    try:
        endpoint = args.endpoint_url or server.endpoint_url  # type: ignore[union-attr]
        session = boto3.session.Session(
            aws_access_key_id=server.access_key if server else None,
            aws_secret_access_key=server.secret_key if server else None,
            region_name=server.region if server else None,
        )
        bucket = args.bucket or (server.make_bucket() if server else None)
        if bucket is None:
            parser.error("--bucket is required with --endpoint-url")
        raw = session.client("s3", endpoint_url=endpoint,
                             config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                                           max_pool_connections=settings.max_concurrency + 4))
        store = S3Store(bucket, "bench", session=session,
                        settings=settings.model_copy(update={"endpoint_url": endpoint, "addressing_style": "path"}))

        with tempfile.TemporaryDirectory(dir=args.workdir, prefix="publish-bench-") as tmp:
            path = Path(tmp) / "blob.bin"
            write_random(path, size)
            sha256_file(path)  # warm the page cache for both sides alike

            def baseline(name: str = "blob.bin", source: Path = path) -> str:
                raw.upload_file(str(source), bucket, f"baseline/{name}", Config=settings.transfer_config())
                return sha256_file(source)

            def ours(name: str = "blob.bin", source: Path = path) -> str:
                return store.put_file(f"ours/{name}", source).sha256

            # Warm both sides up (connections, the server's first volume) before timing either.
            warm = Path(tmp) / "warm.bin"
            write_random(warm, 2 * settings.part_size)
            baseline("warm.bin", warm)
            ours("warm.bin", warm)

            # Each round uploads to its own key: ours is create-only.
            runs = interleaved({"baseline": lambda i: timed(lambda: baseline(f"blob-{i}.bin")),
                                "ours": lambda i: timed(lambda: ours(f"blob-{i}.bin"))}, args.runs)
        if len({sha for _, _, sha in runs["baseline"] + runs["ours"]}) != 1:
            raise SystemExit(f"sha256 differs: {runs}")
        stored = store.head("ours/blob-0.bin")
        assert stored is not None and stored.size == size

        mib = size / MiB
        bound = (settings.max_concurrency + 1) * settings.part_size
        ratio, ours_rss, figures = throughput_figures(
            runs, mib, "baseline upload_file + hashlib", "S3Store.put_file (sha256 on the wire, create-only, hashed while sent)")
        passed = report("publish", ratio, ">=0.95", {
            "size_mib": round(mib),
            "part_mib": settings.part_size // MiB,
            "concurrency": settings.max_concurrency,
            **figures,
            "memory bound (concurrency + 1) x part": f"{bound / MiB:.0f} MiB",
        }, checks={"peak RSS growth within (concurrency + 1) x part": ours_rss <= bound})
        return 0 if passed else 1
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
