"""Every setting of prefect-executorch, on Prefect's ``PrefectBaseSettings`` (as prefect-aws does).

Each field reads ``PREFECT_EXECUTORCH_<...>`` (the names in docs/settings.md), then the same key in
a ``.env`` file, ``prefect.toml`` (table ``[executorch]``, ``[executorch.s3]``…), ``pyproject.toml``
(``[tool.prefect.executorch]``…) and the active Prefect profile (``PREFECT_EXECUTORCH_STORE = …``).
An empty variable counts as unset.

Read when used: ``get_settings()`` builds the object on every call, so a changed environment (a test's
``monkeypatch``, the worker's job variables) is seen by the next read. Importing this module imports
Prefect, so modules that the export and validation children import (``runtime/bundled_cases.py``, ``isolation.py``)
import it inside the functions that read a setting.

No setting holds secret material: the signing keys are paths to PEM files, read only to sign or
verify; S3 credentials come from boto3's chain or a prefect-aws block, never from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

from prefect.settings.base import PrefectBaseSettings, PrefectSettingsConfigDict, build_settings_config
from pydantic import BaseModel, Field, ValidationError
from pydantic_settings import SettingsError

from prefect_executorch.errors import InvalidSetting, SpecError

MiB = 2**20
#: S3's limits: parts of 5 MiB..5 GiB, at most 10,000 of them.
MIN_PART = 5 * MiB
ROOT_PREFIX = "PREFECT_EXECUTORCH_"
_KEYGEN_HINT = "create one with `openssl ecparam -name prime256v1 -genkey -noout -out key.pem` (see docs/store.md)"


def _config(section: str | None = None, *, env_prefix: str | None = None) -> PrefectSettingsConfigDict:
    """Prefect's settings config for ``[executorch.<section>]``; ``env_prefix`` keeps a variable name older than the section."""
    config = build_settings_config(("executorch", section) if section else ("executorch",))
    config["env_ignore_empty"] = True
    if env_prefix is not None:
        config["env_prefix"] = env_prefix
    return config


class OutageBudget(BaseModel):
    """What a publish or pull can spend on a store that stopped answering, from the S3 settings."""

    requests: int = Field(description="HTTP requests at most, every retry counted.")
    longest_wait_s: float = Field(description="Seconds at most before it fails with one line.")


class S3Settings(PrefectBaseSettings):
    """Transfer and retry tuning of ``S3Store``: ``PREFECT_EXECUTORCH_S3_<FIELD>``."""

    # extra="ignore" (Prefect's), not "forbid": a shared .env file holds every section's keys.
    model_config = _config("s3")

    endpoint_url: str | None = Field(
        default=None, description="S3 API endpoint; unset: boto3's chain (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL).")
    region: str | None = Field(default=None, description="Region; unset: boto3's chain, else us-east-1.")
    addressing_style: Literal["auto", "path", "virtual"] | None = Field(
        default=None, description="Bucket in the path or in the host name; unset: boto3's config (auto).")
    multipart_threshold: int = Field(
        default=16 * MiB, ge=MIN_PART, description="Files at least this large go up in parts.")
    part_size: int = Field(
        default=8 * MiB, ge=MIN_PART, description="Bytes per part (raised when a file needs over 10,000).")
    max_concurrency: int = Field(
        default=8, ge=1, le=64, description="Parts uploading at once; memory holds about one more than this.")
    max_attempts: int = Field(
        default=5, ge=1, description="Attempts per request (botocore's), and rounds of ours around parts and downloads.")
    retry_mode: Literal["standard", "adaptive"] = Field(default="standard", description="botocore retry mode.")
    retry_backoff_s: float = Field(default=0.5, ge=0, description="First wait between our rounds around parts and downloads.")
    connect_timeout_s: float = Field(default=10.0, gt=0, description="Seconds to open a connection.")
    read_timeout_s: float = Field(default=120.0, gt=0, description="Seconds to wait for a response.")
    progress: bool | None = Field(
        default=None, description="Rich progress bar on stderr for multipart uploads; unset: if stderr is a terminal.")

    def outage_budget(self) -> OutageBudget:
        """The most requests, and the longest wait, that a publish or pull spends before it gives up on a store that
        stopped answering (docs/store.md, "Retries").

        One request: botocore's ``max_attempts`` attempts, each up to ``connect_timeout_s + read_timeout_s``, with its
        standard mode's backoff between them (at most ``min(2 ** (n - 1), 20)`` s before attempt ``n + 1``). A part or
        a download: up to ``max_attempts`` rounds of ours around that, ``retry_backoff_s * 2 ** (k - 1)`` apart. A
        publish stops at its first failed request; ``max_concurrency`` parts are in flight at once, and a failed
        multipart upload is aborted (one more request). Task retries add nothing: a store that stayed unreachable
        fails with a typed error, which the tasks do not retry.
        """
        attempts = self.max_attempts
        request_s = attempts * (self.connect_timeout_s + self.read_timeout_s) + sum(
            min(2.0 ** (n - 1), 20.0) for n in range(1, attempts))
        rounds_backoff_s = sum(self.retry_backoff_s * 2.0 ** (k - 1) for k in range(1, attempts))
        return OutageBudget(requests=self.max_concurrency * attempts * attempts + attempts,
                            longest_wait_s=attempts * request_s + rounds_backoff_s + request_s)

    def transfer_config(self) -> Any:
        """The same tuning as a boto3 ``TransferConfig`` (for comparing against ``upload_file``)."""
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(multipart_threshold=self.multipart_threshold, multipart_chunksize=self.part_size,
                              max_concurrency=self.max_concurrency)


class SigningSettings(PrefectBaseSettings):
    """Where the bundle-signing keys are: ``PREFECT_EXECUTORCH_SIGNING_KEY``, ``PREFECT_EXECUTORCH_SIGNING_PUBLIC_KEY``."""

    model_config = _config("signing", env_prefix=ROOT_PREFIX)

    signing_key: Path | None = Field(
        default=None, description="PEM EC (P-256) private key file; when set, publish signs every bundle with it.")
    signing_public_key: Path | None = Field(
        default=None, description="PEM EC public key file; when set, pull refuses bundles it does not verify.")

    def checked_signing_key(self) -> Path | None:
        """The private key's path after checking it is a usable EC key, or None when signing is off."""
        from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        if self.signing_key is None:
            return None
        key = _load(self.signing_key, "SIGNING_KEY", lambda data: load_pem_private_key(data, password=None))
        if not isinstance(key, EllipticCurvePrivateKey):
            raise SpecError(f"PREFECT_EXECUTORCH_SIGNING_KEY: {self.signing_key} holds a {type(key).__name__}, not an "
                            f"EC private key; {_KEYGEN_HINT}")
        return self.signing_key

    def checked_public_key(self) -> Path | None:
        """The public key's path after checking it is an EC public key, or None when verification is off."""
        from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey
        from cryptography.hazmat.primitives.serialization import load_pem_public_key

        if self.signing_public_key is None:
            return None
        key = _load(self.signing_public_key, "SIGNING_PUBLIC_KEY", load_pem_public_key)
        if not isinstance(key, EllipticCurvePublicKey):
            raise SpecError(f"PREFECT_EXECUTORCH_SIGNING_PUBLIC_KEY: {self.signing_public_key} holds a "
                            f"{type(key).__name__}, not an EC public key; export it with `openssl ec -in key.pem -pubout`")
        return self.signing_public_key


def _load(path: Path, setting: str, parse: Any) -> Any:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"PREFECT_EXECUTORCH_{setting}: cannot read {path} ({exc.strerror}); set it to a PEM file") from None
    try:
        return parse(data)
    except (ValueError, TypeError):
        # The message of a failed parse can quote key material: never repeat it.
        raise SpecError(f"PREFECT_EXECUTORCH_{setting}: {path} is not a PEM key without a passphrase; {_KEYGEN_HINT}") from None


class BundledSettings(PrefectBaseSettings):
    """When a bundle carries a ``model.bpte``: ``PREFECT_EXECUTORCH_BUNDLED_<FIELD>``."""

    model_config = _config("bundled", env_prefix=ROOT_PREFIX)

    bundled_max_program_mib: float = Field(
        default=512, ge=0,
        description="Programs larger than this get no model.bpte (it embeds the program a second time).")
    bundled_timeout_s: float = Field(default=600, gt=0, description="Wall-time limit of the child that runs the cases.")


class IsolationSettings(PrefectBaseSettings):
    """How export and validation children start: ``PREFECT_EXECUTORCH_CHILD_START``."""

    model_config = _config("isolation", env_prefix=ROOT_PREFIX)

    child_start: Literal["forkserver", "spawn"] = Field(
        default="forkserver",
        description="forkserver: children forked from one preloaded server; spawn: a fresh interpreter per child.")


class WorkerSettings(PrefectBaseSettings):
    """What ``prefect-executorch worker`` hands the ``executorch`` worker: ``PREFECT_EXECUTORCH_WORKER_<FIELD>``."""

    model_config = _config("worker")

    toolchain: str | None = Field(
        default=None, description="The CLI's probe of this machine as JSON (set by the CLI); unset: the worker probes.")
    gpu: int | None = Field(default=None, ge=0, description="The GPU index this worker is pinned to; unset: none.")


class ExecutorchSettings(PrefectBaseSettings):
    """Every setting: ``PREFECT_EXECUTORCH_<FIELD>`` at the top, one nested model per section."""

    model_config = _config()

    store: str | None = Field(
        default=None, description="Bundle store (directory or s3://bucket/prefix) the CLI and deployments use.")
    debug: bool = Field(default=False, description="CLI errors with their traceback (what --debug sets).")
    gpu: int | None = Field(
        default=None, ge=0,
        description="The GPU a flow run builds on (the worker sets it per run); unset: a single CUDA_VISIBLE_DEVICES, else 0.")
    result_storage: str | None = Field(
        default=None, description="Where build flows persist task results when given none: a directory, or "
        "block:<type>/<name> for a storage block (an s3-bucket block for a fleet); unset: Prefect's default.")
    api_wait_s: float = Field(
        default=30.0, ge=0, description="How long a command or flow waits for the Prefect server PREFECT_API_URL names "
        "to answer (a server still starting) before it stops with one line.")
    s3: S3Settings = Field(default_factory=S3Settings, description="S3 transfer and retries.")
    signing: SigningSettings = Field(default_factory=SigningSettings, description="Bundle-signing keys.")
    bundled: BundledSettings = Field(default_factory=BundledSettings, description="Bundled validation cases.")
    isolation: IsolationSettings = Field(default_factory=IsolationSettings, description="Child processes.")
    worker: WorkerSettings = Field(default_factory=WorkerSettings, description="The executorch worker.")


S = TypeVar("S", bound=PrefectBaseSettings)
_SECTIONS: tuple[type[PrefectBaseSettings], ...] = (
    S3Settings, SigningSettings, BundledSettings, IsolationSettings, WorkerSettings)


def env_name(section: type[PrefectBaseSettings], field: str) -> str:
    """The environment variable of ``section.field``, e.g. ``PREFECT_EXECUTORCH_S3_PART_SIZE``."""
    return f"{section.model_config.get('env_prefix', '')}{field}".upper()


_FIX = "fix or unset it (docs/settings.md lists every setting)"


def read_settings(section: type[S]) -> S:
    """``section`` read now; an invalid value is one ``InvalidSetting`` naming its variable."""
    try:
        return section()
    except ValidationError as exc:
        # A nested section fails inside its own constructor: the error's title names that class.
        candidates: tuple[type[PrefectBaseSettings], ...] = (section, *_SECTIONS)
        failed = next((cls for cls in candidates if cls.__name__ == exc.title), section)
        problems = "; ".join(
            f"{env_name(failed, str(error['loc'][0]))}={error['input']!r}: {error['msg']}" if error["loc"]
            else error["msg"] for error in exc.errors(include_url=False))
        raise InvalidSetting(f"{problems}; {_FIX}") from None
    except SettingsError as exc:
        # A value no field sees: a section's variable that is not JSON, a prefect.toml that does not parse.
        cause = f" ({exc.__cause__})" if exc.__cause__ else ""
        raise InvalidSetting(f"{exc}{cause}; {_FIX}") from None


def get_settings() -> ExecutorchSettings:
    """Every setting, read now from the environment, .env, prefect.toml, pyproject.toml and the Prefect profile."""
    return read_settings(ExecutorchSettings)
