"""Secrets: credentials never reach logs, exceptions, artifacts, results or bundles; anonymous S3 is refused."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from prefect.client.orchestration import get_client
from prefect.settings import get_current_settings

from prefect_executorch.artifacts.urls import open_store
from prefect_executorch.errors import PrefectExecutorchError
from prefect_executorch.flows.build import build_bundle
from prefect_executorch.flows.promote import promote
from prefect_executorch.spec.buildspec import parse_spec
from prefect_executorch.testing.seaweedfs import SeaweedS3

from helpers import spec_data

pytestmark = pytest.mark.s3


def files_under(*roots: Path) -> Iterator[Path]:
    for root in roots:
        if root.is_file():
            yield root
        elif root.is_dir():
            yield from (path for path in root.rglob("*") if path.is_file())


def s3_bucket_block(server: SeaweedS3, bucket: str, secret: str, name: str) -> Any:
    """A saved prefect-aws ``S3Bucket`` block (with its ``AwsCredentials``) for ``server``, loaded back by name."""
    from prefect_aws import AwsCredentials, S3Bucket

    credentials = AwsCredentials(aws_access_key_id=server.access_key, aws_secret_access_key=secret,
                                 region_name=server.region, aws_client_parameters={"endpoint_url": server.endpoint_url})
    credentials.save(f"{name}-credentials", overwrite=True)
    S3Bucket(bucket_name=bucket, bucket_folder="reg", credentials=credentials).save(name, overwrite=True)
    return S3Bucket.load(name)


@pytest.mark.parametrize("source", ["env", "block"])
def test_credentials_never_leak(prefect_harness: None, s3_env: SeaweedS3, faults: Any, tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                                capfd: pytest.CaptureFixture[str], source: str,
                                tmp_path_factory: pytest.TempPathFactory) -> None:
    # Faults: the wrong secret's two failures, then each secret's exposure (searched in logs, errors, artifacts,
    # runs, stored objects and files).
    fault = faults("secrets", f"credentials from {source}: wrong secret, then every secret searched")
    caplog.set_level("DEBUG")
    # The bundle-signing key is a secret too: kept outside every searched directory, it must show up nowhere.
    signing_key = ec.generate_private_key(ec.SECP256R1())
    key_file = tmp_path_factory.mktemp("signing-key") / "bundle-signing.pem"
    key_file.write_bytes(signing_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    monkeypatch.setenv("PREFECT_EXECUTORCH_SIGNING_KEY", str(key_file))
    key_secrets = [f"{signing_key.private_numbers().private_value:x}",
                   *[line for line in key_file.read_text().splitlines() if "-----" not in line]]
    bucket = s3_env.make_bucket()
    url = f"s3://{bucket}/reg"
    wrong = f"wrong-secret-{uuid.uuid4().hex}"
    if source == "env":
        store: Any = url
        wrong_store: Any = url
    else:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
            monkeypatch.delenv(name)  # the blocks alone say where and who
        store = s3_bucket_block(s3_env, bucket, s3_env.secret_key, "secrets-test")
        wrong_store = s3_bucket_block(s3_env, bucket, wrong, "secrets-test-wrong")
    spec = parse_spec(spec_data("convnet", version="1"))
    ref = build_bundle(spec, store=store, output=str(tmp_path / "out"))
    promote(spec.name, "1", "prod", store)
    # The same flows with a wrong secret: they fail, and their errors must not quote it either.
    if source == "env":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    errors: list[BaseException] = []
    for attempt in (lambda: build_bundle(spec.model_copy(update={"version": "2"}), store=wrong_store),
                    lambda: promote(spec.name, "1", "canary", wrong_store)):
        with fault.expect(PrefectExecutorchError) as info:
            attempt()
        errors.append(info.value)
    if source == "env":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_env.secret_key)

    seen: dict[str, str] = {"test log": caplog.text, "stdout+stderr": "".join(capfd.readouterr())}
    seen.update({f"exception {i}": f"{exc!s} {exc!r} {exc.__cause__!r} {exc.__context__!r}"
                 for i, exc in enumerate(errors)})
    with get_client(sync_client=True) as client:
        seen["prefect logs"] = "\n".join(log.message for log in client.read_logs())
        seen["prefect artifacts"] = "\n".join(f"{a.key} {a.data} {a.description}" for a in client.read_artifacts())
        seen["flow runs"] = "\n".join(f"{run.parameters} {run.state.message if run.state else ''}"
                                      for run in client.read_flow_runs())
    reader = open_store(url if source == "env" else store)
    seen.update({f"object {info.key}": reader.get_bytes(info.key)[0].decode("latin-1") for info in reader.list("")})
    database = Path(get_current_settings().server.database.connection_url.get_secret_value().split("///")[-1])
    home = Path(os.environ["PREFECT_HOME"])
    seen.update({f"file {path}": path.read_bytes().decode("latin-1")
                 for path in files_under(tmp_path, home, database)})
    assert f"object {ref.manifest_key}" in seen and f"file {database}" in seen and len(seen) > 10
    assert any(where.startswith(f"object {ref.key.prefix}/model.sig.") for where in seen)  # the bundle was signed
    secrets = (s3_env.secret_key, wrong, *key_secrets)
    leaks = [(where, n) for n, secret in enumerate(secrets) for where, text in seen.items() if secret in text]
    # Each secret is one more fault: its exposure, survived when it appears in none of the places searched.
    fault.outcome(injected=len(secrets), survived=len(secrets) - len({n for _, n in leaks}))
    fault.check_intact(reader, [ref.key], tmp_path / "after")
    assert leaks == [], f"a secret appears in {[where for where, _ in leaks]}"


def test_anonymous_requests_are_refused(s3_env: SeaweedS3, faults: Any) -> None:
    fault = faults("secrets", "anonymous get, list, put, list buckets")
    bucket = s3_env.make_bucket()
    s3_env.client().put_object(Bucket=bucket, Key="reg/m/1/t/c/model.pte", Body=b"program")
    anonymous = boto3.client("s3", endpoint_url=s3_env.endpoint_url, region_name=s3_env.region,
                             config=Config(signature_version=UNSIGNED, s3={"addressing_style": "path"}))
    attempts = [
        lambda: anonymous.get_object(Bucket=bucket, Key="reg/m/1/t/c/model.pte"),
        lambda: anonymous.list_objects_v2(Bucket=bucket),
        lambda: anonymous.put_object(Bucket=bucket, Key="reg/m/1/t/c/manifest.json", Body=b"{}"),
        lambda: anonymous.list_buckets(),
    ]
    for attempt in attempts:
        with fault.expect(ClientError) as info:
            attempt()
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert [o["Key"] for o in s3_env.client().list_objects_v2(Bucket=bucket)["Contents"]] == ["reg/m/1/t/c/model.pte"]
