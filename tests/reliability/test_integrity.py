"""Integrity: whatever happened to the stored objects, pull refuses them and writes nothing."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from prefect_executorch.artifacts.manifest import MANIFEST_FILE, VALIDATION_FILE, BundleKey
from prefect_executorch.artifacts.publishing import BundleRef, publish, pull, signature_key, verify_bundle_dir
from prefect_executorch.artifacts.signing import SIGNATURE_FILE, seal
from prefect_executorch.artifacts.store import LocalStore, ObjectStore
from prefect_executorch.errors import IntegrityError, SpecError
from prefect_executorch.settings import SigningSettings

from realbundle import RealBundle, store_kind


def overwrite(store: ObjectStore, key: str, data: bytes) -> None:
    """Replace an object behind the store's back, as corruption on disk or an intruder would."""
    if isinstance(store, LocalStore):
        (store.root / key).write_bytes(data)
    else:
        store.client.put_object(Bucket=store.bucket, Key=f"{store.prefix}/{key}", Body=data)  # type: ignore[attr-defined]


def refused(fault: Any, store: ObjectStore, key: BundleKey, dest: Path, match: str, **pull_options: Any) -> None:
    """Pull must raise ``IntegrityError`` (matching ``match``) and leave nothing beside ``dest``: one fault survived."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    before = set(dest.parent.iterdir())
    with fault.expect(IntegrityError, match=match):
        pull(store, key, dest, **pull_options)
    assert set(dest.parent.iterdir()) == before and not dest.exists()


@pytest.fixture
def published(real_bundle: Callable[[str], RealBundle], any_store: ObjectStore, tmp_path: Path) -> BundleRef:
    return publish(any_store, *real_bundle("convnet").variant(tmp_path / "src"))


@pytest.fixture
def bystander(real_bundle: Callable[[str], RealBundle], any_store: ObjectStore, tmp_path: Path) -> BundleKey:
    """Another bundle in the same store before the fault: it must still pull and verify after it."""
    return publish(any_store, *real_bundle("convnet").variant(tmp_path / "bystander", version="99")).key


@pytest.mark.parametrize("target", ["model.pte", "model.ptd", MANIFEST_FILE])
def test_flipped_bytes_are_refused(published: BundleRef, bystander: BundleKey, any_store: ObjectStore, faults: Any,
                                   tmp_path: Path, target: str) -> None:
    fault = faults("integrity", f"flipped bit in {target} ({store_kind(any_store)})")
    key = published.key.key(target)
    original, _ = any_store.get_bytes(key)
    # Every 97th byte of the manifest (its JSON syntax, names, numbers and checksums); three spots elsewhere.
    positions = range(0, len(original), 97) if target == MANIFEST_FILE else [0, len(original) // 2, len(original) - 1]
    for n, position in enumerate(positions):
        corrupt = bytearray(original)
        corrupt[position] ^= 0x01
        overwrite(any_store, key, bytes(corrupt))
        refused(fault, any_store, published.key, tmp_path / "out" / f"try-{n}",
                "manifest|does not match the manifest" if target == MANIFEST_FILE else f"{target}: sha256 .* does not match")
    overwrite(any_store, key, original)
    fault.check_intact(any_store, [published.key, bystander], tmp_path / "after")  # restored, and the other one
    assert (fault.injected, fault.survived, fault.lost) == (len(positions), len(positions), 0)


def test_numbers_spelled_another_way_are_refused(published: BundleRef, any_store: ObjectStore, faults: Any,
                                                 tmp_path: Path) -> None:
    fault = faults("integrity", f"respelled float in manifest.json ({store_kind(any_store)})")
    # The same values in other bytes: a trailing zero, an upper-case exponent, a float's digit past its 17th.
    original, _ = any_store.get_bytes(published.manifest_key)
    text = original.decode()
    number = re.search(r"(?<=: )-?\d+\.\d+(?=,?\n)", text)
    assert number is not None, "the manifest holds no float to respell"
    value = number.group()
    respelled = [value + "0", f"{float(value):.17e}".replace("e", "E"), repr(float(value)) + "1" * (20 - len(value))]
    respelled = [r for r in respelled if float(r) == float(value) and r != value]
    assert len(respelled) >= 2
    for n, spelling in enumerate(respelled):
        edited = text[:number.start()] + spelling + text[number.end():]
        assert json.loads(edited) == json.loads(text)
        overwrite(any_store, published.manifest_key, edited.encode())
        refused(fault, any_store, published.key, tmp_path / "out" / f"try-{n}", "bytes are not the ones that were sealed")
    overwrite(any_store, published.manifest_key, original)
    fault.check_intact(any_store, [published.key], tmp_path / "after")
    assert fault.lost == 0


@pytest.mark.parametrize("target", ["model.pte", "model.ptd", MANIFEST_FILE])
def test_truncated_objects_are_refused(published: BundleRef, bystander: BundleKey, any_store: ObjectStore,
                                       faults: Any, tmp_path: Path, target: str) -> None:
    fault = faults("integrity", f"truncated {target} ({store_kind(any_store)})")
    key = published.key.key(target)
    original, _ = any_store.get_bytes(key)
    for n, length in enumerate([0, len(original) // 2, len(original) - 1]):
        overwrite(any_store, key, original[:length])
        refused(fault, any_store, published.key, tmp_path / "out" / f"try-{n}", "manifest|does not match the manifest")
    fault.check_intact(any_store, [bystander], tmp_path / "after")
    assert fault.lost == 0


def test_data_file_of_another_bundle_is_refused(real_bundle: Callable[[str], RealBundle], any_store: ObjectStore,
                                                faults: Any, tmp_path: Path) -> None:
    fault = faults("integrity", f".ptd of another bundle ({store_kind(any_store)})")
    convnet = real_bundle("convnet")
    mine = publish(any_store, *convnet.variant(tmp_path / "a", version="30"))
    other = publish(any_store, *real_bundle("mlp").under(convnet).variant(tmp_path / "b", version="31"))
    overwrite(any_store, mine.key.key("model.ptd"), any_store.get_bytes(other.key.key("model.ptd"))[0])
    refused(fault, any_store, mine.key, tmp_path / "out" / "a", "model.ptd: sha256 .* corrupt or was swapped")
    fault.check_intact(any_store, [other.key], tmp_path / "after")  # the bundle whose .ptd was copied
    assert fault.lost == 0


def test_manifest_pointing_outside_its_prefix_is_refused(real_bundle: Callable[[str], RealBundle],
                                                         any_store: ObjectStore, faults: Any, bystander: BundleKey,
                                                         tmp_path: Path) -> None:
    fault = faults("integrity", f"manifest pointing outside its prefix ({store_kind(any_store)})")
    convnet = real_bundle("convnet")
    first = publish(any_store, *convnet.variant(tmp_path / "a", version="40"))
    second = publish(any_store, *convnet.variant(tmp_path / "b", version="41"))
    raw, _ = any_store.get_bytes(first.manifest_key)
    # A valid, sealed manifest of another bundle, copied in.
    overwrite(any_store, second.manifest_key, raw)
    refused(fault, any_store, second.key, tmp_path / "out" / "b", "describes convnet/40/.*not convnet/41/")
    # A manifest whose files reach out of the bundle, sealed again so that only the path gives it away.
    document = json.loads(raw)
    del document["digest"]
    document["files"][0]["path"] = "../../41/xnnpack/" + document["files"][0]["path"]
    overwrite(any_store, first.manifest_key, seal(document))
    refused(fault, any_store, first.key, tmp_path / "out" / "a", "must be a plain file name inside the bundle")
    fault.check_intact(any_store, [bystander], tmp_path / "after")
    assert fault.lost == 0


def key_pair(directory: Path, name: str) -> tuple[Path, Path]:
    """A new EC P-256 key pair as PEM files: (private, public)."""
    key = ec.generate_private_key(ec.SECP256R1())
    directory.mkdir(parents=True, exist_ok=True)
    private, public = directory / f"{name}.pem", directory / f"{name}.pub"
    private.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    return private, public


def test_signed_bundles(real_bundle: Callable[[str], RealBundle], any_store: ObjectStore, faults: Any,
                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from model_signing import hashing, verifying

    fault = faults("integrity", f"unsigned / foreign-signed / edited bundle, key configured ({store_kind(any_store)})")
    convnet = real_bundle("convnet")
    (ours, ours_public), (theirs, _) = key_pair(tmp_path / "keys", "ours"), key_pair(tmp_path / "keys", "theirs")
    signed = publish(any_store, *convnet.variant(tmp_path / "a", version="50"), signing=SigningSettings(signing_key=ours))
    unsigned = publish(any_store, *convnet.variant(tmp_path / "b", version="51"), signing=SigningSettings())
    by_them = publish(any_store, *convnet.variant(tmp_path / "c", version="52"),
                      signing=SigningSettings(signing_key=theirs))
    assert pull(any_store, signed.key, tmp_path / "ok", signing=SigningSettings(signing_public_key=ours_public)).version == "50"
    # What a consumer runs: model_signing's own verifier, the public key, the signature left out of the hash.
    assert sorted(p.name for p in (tmp_path / "ok").iterdir()) == sorted(
        [e.path for e in convnet.manifest.files] + [MANIFEST_FILE, SIGNATURE_FILE])
    verifying.Config().use_elliptic_key_verifier(public_key=ours_public).set_hashing_config(
        hashing.Config().set_ignored_paths(paths=[SIGNATURE_FILE])).verify(tmp_path / "ok", tmp_path / "ok" / SIGNATURE_FILE)
    # The public key from the environment, as a deployment would configure it.
    monkeypatch.setenv("PREFECT_EXECUTORCH_SIGNING_PUBLIC_KEY", str(ours_public))
    refused(fault, any_store, unsigned.key, tmp_path / "out" / "b", "is not signed .*PREFECT_EXECUTORCH_SIGNING_PUBLIC_KEY is set")
    refused(fault, any_store, by_them.key, tmp_path / "out" / "c", "model.sig does not verify with the public key")
    # Edited and sealed again (a valid digest), the signature copied to where the edited manifest looks for it.
    document = json.loads(any_store.get_bytes(signed.manifest_key)[0])
    document["validation"]["passed"] = not document["validation"]["passed"]
    del document["digest"]
    forged = seal(document)
    signature, _ = any_store.get_bytes(signature_key(signed.key, any_store.get_bytes(signed.manifest_key)[0]))
    overwrite(any_store, signed.manifest_key, forged)
    any_store.put_bytes(signature_key(signed.key, forged), signature)
    refused(fault, any_store, signed.key, tmp_path / "out" / "a", "model.sig does not verify .*edited after signing")
    # A file of the pulled bundle edited on disk.
    (tmp_path / "ok" / VALIDATION_FILE).write_text("{}")
    with fault.expect(IntegrityError, match="model.sig does not verify"):
        verify_bundle_dir(tmp_path / "ok")


def test_bundles_signed_by_the_retired_ed25519_scheme_stay_readable(published: BundleRef, any_store: ObjectStore,
                                                                    tmp_path: Path) -> None:
    raw = any_store.get_bytes(published.manifest_key)[0]
    document = json.loads(raw)
    legacy = json.dumps({**document, "signature": {"key_id": "0123456789abcdef", "ed25519": "c2ln"}},
                        indent=2, ensure_ascii=False).encode()
    overwrite(any_store, published.manifest_key, legacy)
    assert pull(any_store, published.key, tmp_path / "legacy").version == published.key.version


def test_unusable_keys_name_the_setting(tmp_path: Path) -> None:
    (tmp_path / "not-a-key.pem").write_text("-----BEGIN PRIVATE KEY-----\nsecret-ish\n-----END PRIVATE KEY-----\n")
    with pytest.raises(SpecError, match="PREFECT_EXECUTORCH_SIGNING_KEY: .* is not a PEM key") as info:
        SigningSettings(signing_key=tmp_path / "not-a-key.pem").checked_signing_key()
    assert "secret-ish" not in str(info.value)
    with pytest.raises(SpecError, match="PREFECT_EXECUTORCH_SIGNING_PUBLIC_KEY: cannot read .*absent.pub"):
        SigningSettings(signing_public_key=tmp_path / "absent.pub").checked_public_key()
    ed25519 = tmp_path / "ed25519.pem"
    ed25519.write_bytes(Ed25519PrivateKey.generate().private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    with pytest.raises(SpecError, match="holds a .*Ed25519PrivateKey.*, not an EC private key"):
        SigningSettings(signing_key=ed25519).checked_signing_key()


def test_a_store_folder_given_as_a_bundle_is_sent_to_pull(real_bundle: Callable[[str], RealBundle], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A local store's folder holds the bundle's files beside ``model.sig.<manifest sha256>``; with a public key set,
    a command given that folder says to pull it, rather than calling a signed bundle unsigned."""
    store = LocalStore(tmp_path / "store")
    private, public = key_pair(tmp_path / "keys", "ours")
    ref = publish(store, *real_bundle("convnet").variant(tmp_path / "src", version="7"),
                  signing=SigningSettings(signing_key=private))
    monkeypatch.setenv("PREFECT_EXECUTORCH_SIGNING_PUBLIC_KEY", str(public))
    with pytest.raises(IntegrityError, match=r"inside the store, not a pulled bundle.*`prefect-executorch pull "
                                             r"convnet --version 7 --to DIR`"):
        verify_bundle_dir(store.root / ref.key.prefix)
    pull(store, ref.key, tmp_path / "pulled")
    assert verify_bundle_dir(tmp_path / "pulled").version == "7"
