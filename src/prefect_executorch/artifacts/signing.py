"""Manifest seals and bundle signatures.

The seal: every manifest carries the sha256 of its canonical JSON. The digest turns any
corruption of ``manifest.json`` (a flipped byte, a truncated object, an edit) into an
``IntegrityError`` on every read, on any store. It covers the bytes as stored, not only the
parsed values: a manifest must be byte for byte the serialization ``seal`` writes, because two
spellings of one number (``…958`` and ``…959`` past a float's 17th digit, ``e`` and ``E``) parse alike.

The signature (OpenSSF model signing, the sigstore/model-transparency format): with a private
key, publish adds ``model.sig`` covering every other file of the bundle, manifest included;
anyone verifies it with ``model_signing`` and the public key. With a public key configured, pull
refuses a bundle that is unsigned, signed by another key, or edited. Create a key pair with::

    openssl ecparam -name prime256v1 -genkey -noout -out bundle-signing.pem
    openssl ec -in bundle-signing.pem -pubout -out bundle-signing.pub

Manifests signed by the retired Ed25519 scheme (a ``signature`` field) still unseal: the field is
outside the digest and is ignored (docs/store.md).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from prefect_executorch.errors import IntegrityError

DIGEST_FIELD = "digest"
#: The retired Ed25519 signature of schema-2 manifests: outside the digest, ignored on read.
LEGACY_SIGNATURE_FIELD = "signature"
SIGNATURE_FILE = "model.sig"


def _hashing() -> Any:
    from model_signing import hashing

    # Recorded in the signature, so model_signing's verifier (and its CLI) leaves the signature out too.
    return hashing.Config().set_ignored_paths(paths=[SIGNATURE_FILE])


def sign_directory(directory: Path, private_key: Path) -> bytes:
    """Sign every file of ``directory`` with model_signing; the ``model.sig`` it wrote, as bytes."""
    from model_signing import signing

    signing.Config().use_elliptic_key_signer(private_key=private_key).set_hashing_config(_hashing()).sign(
        directory, directory / SIGNATURE_FILE)
    return (directory / SIGNATURE_FILE).read_bytes()


def verify_directory(directory: Path, public_key: Path, where: str) -> None:
    """``IntegrityError`` unless ``directory/model.sig`` verifies every other file of it with ``public_key``."""
    from model_signing import verifying

    if not (directory / SIGNATURE_FILE).is_file():
        raise IntegrityError(f"{where} is not signed (no {SIGNATURE_FILE}), and PREFECT_EXECUTORCH_SIGNING_PUBLIC_KEY "
                             "is set: refusing it; publish it again with PREFECT_EXECUTORCH_SIGNING_KEY")
    try:
        verifying.Config().use_elliptic_key_verifier(public_key=public_key).set_hashing_config(_hashing()).verify(
            directory, directory / SIGNATURE_FILE)
    except Exception as exc:  # noqa: BLE001 - model_signing raises ValueError and the crypto library's own errors
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise IntegrityError(f"{where}: {SIGNATURE_FILE} does not verify with the public key "
                             f"{public_key} ({first}); the bundle was signed by another key or edited after "
                             "signing: refusing it") from None


def canonical(document: dict[str, Any]) -> bytes:
    """The bytes the digest covers: sorted keys, no whitespace, UTF-8."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def seal(document: dict[str, Any]) -> bytes:
    """``document`` as stored JSON, with its digest."""
    return _stored({**document, DIGEST_FIELD: hashlib.sha256(canonical(document)).hexdigest()})


def _stored(sealed: dict[str, Any]) -> bytes:
    """The one serialization of a sealed document (json keeps key order, and floats print as their shortest repr)."""
    return json.dumps(sealed, indent=2, ensure_ascii=False).encode()


def unseal(data: bytes, where: str) -> dict[str, Any]:
    """The document in ``data`` after checking its digest."""
    try:
        document = json.loads(data)
        if not isinstance(document, dict):
            raise ValueError(f"a JSON {type(document).__name__}, not an object")
        as_sealed = _stored(document)
        digest = document.pop(DIGEST_FIELD, None)
        document.pop(LEGACY_SIGNATURE_FIELD, None)
        body = canonical(document)
    except (ValueError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"{where} is not a valid manifest ({exc}); the object is corrupt") from None
    if digest != hashlib.sha256(body).hexdigest():
        raise IntegrityError(f"{where}: its content does not match its digest {digest!r}; the manifest is corrupt or "
                             "was edited after it was published: refusing it")
    if as_sealed != data:
        raise IntegrityError(f"{where}: its bytes are not the ones that were sealed (same values, other spelling or "
                             "layout); the manifest is corrupt or was edited after it was published: refusing it")
    return document
