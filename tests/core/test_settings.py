"""Settings: every PREFECT_EXECUTORCH_* name reaches its field, from each of Prefect's sources, read when used."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from prefect_executorch.cli.app import DEBUG_ENV, STORE_ENV
from prefect_executorch.errors import InvalidSetting, SpecError
from prefect_executorch.fleet.gpu_slots import GPU_ENV, gpu_index_from_env
from prefect_executorch.fleet.worker import TOOLCHAIN_ENV, WORKER_GPU_ENV
from prefect_executorch.isolation import START_METHOD_ENV
from prefect_executorch.settings import (
    BundledSettings,
    ExecutorchSettings,
    IsolationSettings,
    S3Settings,
    SigningSettings,
    WorkerSettings,
    env_name,
    get_settings,
)
from prefect_executorch.spec.buildspec import parse_spec
from prefect_executorch.validate.bundled import skip_reason

from helpers import spec_data

ROOT = Path(__file__).resolve().parents[2]

#: The names users, prefect.yaml and the docs set today -> (section, field) -> what a value becomes.
NAMES: dict[str, tuple[str | None, str, str, Any]] = {
    "PREFECT_EXECUTORCH_STORE": (None, "store", "s3://bundles/prod", "s3://bundles/prod"),
    "PREFECT_EXECUTORCH_DEBUG": (None, "debug", "1", True),
    "PREFECT_EXECUTORCH_GPU": (None, "gpu", "3", 3),
    "PREFECT_EXECUTORCH_RESULT_STORAGE": (None, "result_storage", "block:s3-bucket/results", "block:s3-bucket/results"),
    "PREFECT_EXECUTORCH_API_WAIT_S": (None, "api_wait_s", "12.5", 12.5),
    "PREFECT_EXECUTORCH_S3_ENDPOINT_URL": ("s3", "endpoint_url", "http://127.0.0.1:8333", "http://127.0.0.1:8333"),
    "PREFECT_EXECUTORCH_S3_REGION": ("s3", "region", "eu-west-3", "eu-west-3"),
    "PREFECT_EXECUTORCH_S3_ADDRESSING_STYLE": ("s3", "addressing_style", "path", "path"),
    "PREFECT_EXECUTORCH_S3_MULTIPART_THRESHOLD": ("s3", "multipart_threshold", "67108864", 64 * 2**20),
    "PREFECT_EXECUTORCH_S3_PART_SIZE": ("s3", "part_size", "6291456", 6 * 2**20),
    "PREFECT_EXECUTORCH_S3_MAX_CONCURRENCY": ("s3", "max_concurrency", "3", 3),
    "PREFECT_EXECUTORCH_S3_MAX_ATTEMPTS": ("s3", "max_attempts", "9", 9),
    "PREFECT_EXECUTORCH_S3_RETRY_MODE": ("s3", "retry_mode", "adaptive", "adaptive"),
    "PREFECT_EXECUTORCH_S3_RETRY_BACKOFF_S": ("s3", "retry_backoff_s", "0.25", 0.25),
    "PREFECT_EXECUTORCH_S3_CONNECT_TIMEOUT_S": ("s3", "connect_timeout_s", "2.5", 2.5),
    "PREFECT_EXECUTORCH_S3_READ_TIMEOUT_S": ("s3", "read_timeout_s", "30", 30.0),
    "PREFECT_EXECUTORCH_S3_PROGRESS": ("s3", "progress", "false", False),
    "PREFECT_EXECUTORCH_SIGNING_KEY": ("signing", "signing_key", "/keys/bundle.pem", Path("/keys/bundle.pem")),
    "PREFECT_EXECUTORCH_SIGNING_PUBLIC_KEY": ("signing", "signing_public_key", "/keys/bundle.pub",
                                              Path("/keys/bundle.pub")),
    "PREFECT_EXECUTORCH_BUNDLED_MAX_PROGRAM_MIB": ("bundled", "bundled_max_program_mib", "1.5", 1.5),
    "PREFECT_EXECUTORCH_BUNDLED_TIMEOUT_S": ("bundled", "bundled_timeout_s", "45", 45.0),
    "PREFECT_EXECUTORCH_CHILD_START": ("isolation", "child_start", "spawn", "spawn"),
    "PREFECT_EXECUTORCH_WORKER_TOOLCHAIN": ("worker", "toolchain", '{"torch": "2.13.0"}', '{"torch": "2.13.0"}'),
    "PREFECT_EXECUTORCH_WORKER_GPU": ("worker", "gpu", "2", 2),
}
SECTIONS = {None: ExecutorchSettings, "s3": S3Settings, "signing": SigningSettings, "bundled": BundledSettings,
            "isolation": IsolationSettings, "worker": WorkerSettings}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No setting from the caller's environment, and no .env or prefect.toml from the working directory."""
    for name in [name for name in os.environ if name.startswith("PREFECT_EXECUTORCH_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def fields(settings: ExecutorchSettings) -> dict[tuple[str | None, str], Any]:
    """Every field's value by (section, field)."""
    found: dict[tuple[str | None, str], Any] = {}
    for key, value in settings.model_dump().items():
        if key in SECTIONS:
            found.update({(key, field): inner for field, inner in value.items()})
        else:
            found[(None, key)] = value
    return found


@pytest.mark.parametrize("name", sorted(NAMES))
def test_each_variable_sets_its_field_and_no_other(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    section, field, raw, expected = NAMES[name]
    before = fields(get_settings())
    monkeypatch.setenv(name, raw)
    after = fields(get_settings())
    assert after[(section, field)] == expected != before[(section, field)]
    assert [key for key in after if after[key] != before[key]] == [(section, field)]


def test_every_field_has_its_name_and_the_names_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    declared = {(section, field) for section, cls in SECTIONS.items() for field in cls.model_fields
                if section is not None or field not in SECTIONS}
    assert declared == {(section, field) for section, field, _, _ in NAMES.values()}
    for name, (section, field, raw, _) in NAMES.items():
        assert env_name(SECTIONS[section], field) == name
        monkeypatch.setenv(name, raw)
    # Prefect's own mapping back to variables agrees, for the values just read.
    assert set(get_settings().to_environment_variables(exclude_unset=True)) == set(NAMES)


def test_the_names_code_writes_for_child_processes_are_the_settings_names() -> None:
    assert STORE_ENV == env_name(ExecutorchSettings, "store")
    assert DEBUG_ENV == env_name(ExecutorchSettings, "debug")
    assert GPU_ENV == env_name(ExecutorchSettings, "gpu")
    assert START_METHOD_ENV == env_name(IsolationSettings, "child_start")
    assert TOOLCHAIN_ENV == env_name(WorkerSettings, "toolchain")
    assert WORKER_GPU_ENV == env_name(WorkerSettings, "gpu")


def test_settings_are_read_when_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    assert gpu_index_from_env() == 5
    monkeypatch.setenv(GPU_ENV, "1")
    assert gpu_index_from_env() == 1
    monkeypatch.setenv(GPU_ENV, "2")
    assert gpu_index_from_env() == 2
    # An empty variable is unset, as `os.environ.get(...) or default` treated it.
    monkeypatch.setenv(GPU_ENV, "")
    assert gpu_index_from_env() == 5


@pytest.mark.parametrize(("name", "value", "says"), [
    ("PREFECT_EXECUTORCH_BUNDLED_MAX_PROGRAM_MIB", "lots", "valid number"),
    ("PREFECT_EXECUTORCH_S3_PART_SIZE", "1024", "greater than or equal to 5242880"),
    ("PREFECT_EXECUTORCH_CHILD_START", "fork", "'forkserver' or 'spawn'"),
    ("PREFECT_EXECUTORCH_DEBUG", "maybe", "valid boolean"),
    ("PREFECT_EXECUTORCH_WORKER_GPU", "-1", "greater than or equal to 0"),
    ("PREFECT_EXECUTORCH_GPU", "gpu0", "valid integer"),
])
def test_an_invalid_value_is_one_error_naming_its_variable(monkeypatch: pytest.MonkeyPatch, name: str, value: str,
                                                           says: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidSetting) as info:
        get_settings()
    message = str(info.value)
    assert message.startswith(f"{name}={value!r}: ")
    assert says in message
    assert message.count("PREFECT_EXECUTORCH_") == 1
    assert isinstance(info.value, SpecError) and info.value.exit_code == 2


def test_a_value_that_does_not_parse_is_an_invalid_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A section's own variable must hold JSON; pydantic-settings fails before any field sees it."""
    monkeypatch.setenv("PREFECT_EXECUTORCH_S3", "part_size=1")
    with pytest.raises(InvalidSetting, match='"s3"') as info:
        get_settings()
    assert "fix or unset it" in str(info.value) and info.value.exit_code == 2


def test_a_library_call_reports_an_invalid_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    program = tmp_path / "model.pte"
    program.write_bytes(b"\0" * 2**20)
    spec = parse_spec(spec_data("convnet", target="xnnpack"))
    assert skip_reason(program, spec) is None
    monkeypatch.setenv("PREFECT_EXECUTORCH_BUNDLED_MAX_PROGRAM_MIB", "one")
    with pytest.raises(InvalidSetting, match="^PREFECT_EXECUTORCH_BUNDLED_MAX_PROGRAM_MIB='one': "):
        skip_reason(program, spec)


def test_the_cli_reports_an_invalid_setting_without_a_traceback(tmp_path: Path) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFECT_EXECUTORCH_")},
           "PREFECT_EXECUTORCH_S3_MAX_CONCURRENCY": "many"}
    result = subprocess.run([sys.executable, "-m", "prefect_executorch.cli", "ls"], capture_output=True, text=True,
                            cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 2, result.stderr
    assert "InvalidSetting: PREFECT_EXECUTORCH_S3_MAX_CONCURRENCY='many': " in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_prefect_toml_dotenv_and_profile_are_read_and_the_environment_wins(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    (tmp_path / "prefect.toml").write_text('[executorch]\nstore = "toml-store"\n\n'
                                           '[executorch.s3]\npart_size = 6291456\n\n'
                                           '[executorch.isolation]\nchild_start = "spawn"\n')
    (tmp_path / ".env").write_text("PREFECT_EXECUTORCH_BUNDLED_TIMEOUT_S=77\n")
    profiles = tmp_path / "profiles.toml"
    profiles.write_text('active = "fleet"\n[profiles.fleet]\nPREFECT_EXECUTORCH_WORKER_GPU = "4"\n'
                        'PREFECT_EXECUTORCH_RESULT_STORAGE = "block:s3-bucket/results"\n')
    for name in ("PREFECT_TEST_MODE", "PREFECT_UNIT_TEST_MODE", "PREFECT_TESTING_UNIT_TEST_MODE",
                 "PREFECT_TESTING_TEST_MODE", "PREFECT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PREFECT_PROFILES_PATH", str(profiles))
    settings = get_settings()
    assert (settings.store, settings.s3.part_size, settings.isolation.child_start) == ("toml-store", 6 * 2**20, "spawn")
    assert settings.bundled.bundled_timeout_s == 77
    assert (settings.worker.gpu, settings.result_storage) == (4, "block:s3-bucket/results")
    monkeypatch.setenv(STORE_ENV, "env-store")
    monkeypatch.setenv(WORKER_GPU_ENV, "1")
    assert (get_settings().store, get_settings().worker.gpu) == ("env-store", 1)


def test_signing_keys_are_paths_and_their_contents_show_nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secrets = []
    for name, key in (("ec.pem", ec.generate_private_key(ec.SECP256R1())),
                      ("rsa.pem", rsa.generate_private_key(public_exponent=65537, key_size=2048))):
        pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()
        (tmp_path / name).write_text(pem)
        secrets += [line for line in pem.splitlines() if "-----" not in line]
    monkeypatch.setenv("PREFECT_EXECUTORCH_SIGNING_KEY", str(tmp_path / "ec.pem"))
    settings = get_settings()
    assert settings.signing.checked_signing_key() == tmp_path / "ec.pem"
    monkeypatch.setenv("PREFECT_EXECUTORCH_SIGNING_KEY", str(tmp_path / "rsa.pem"))
    with pytest.raises(SpecError, match="holds a .*RSAPrivateKey, not an EC private key") as info:
        get_settings().signing.checked_signing_key()
    shown = "\n".join([repr(settings), str(settings), settings.model_dump_json(),
                       str(settings.to_environment_variables()), str(info.value), caplog.text])
    assert str(tmp_path / "ec.pem") in shown
    assert not [line for line in secrets if line in shown]


def test_docs_list_every_setting() -> None:
    table = (ROOT / "docs" / "settings.md").read_text()
    missing = [name for name in NAMES if f"`{name}`" not in table]
    assert not missing, f"docs/settings.md does not list {missing}"
    assert "docs/settings.md" in (ROOT / "README.md").read_text()
