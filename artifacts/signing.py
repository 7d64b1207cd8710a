"""Manifest seals: every manifest carries the sha256 of its canonical JSON; optionally an Ed25519 signature.

The digest turns any corruption of ``manifest.json`` (a flipped byte, a truncated object, an edit)
into an ``IntegrityError`` on every read, on any store. It covers the bytes as stored, not only the
parsed values: a manifest must be byte for byte the serialization ``seal`` writes, because two
spellings of one number (``…958`` and ``…959`` past a float's 17th digit, ``e`` and ``E``) parse alike. The signature, made with a private key only
the publishers hold, additionally proves who wrote it: with a public key configured, pull refuses
a manifest that it does not verify. Create a key pair with::

    openssl genpkey -algorithm ed25519 -out manifest-signing.pem
    openssl pkey -in manifest-signing.pem -pubout -out manifest-signing.pub
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from prefect_executorch.errors import IntegrityError, SpecError

DIGEST_FIELD = "digest"
SIGNATURE_FIELD = "signature"
_KEYGEN_HINT = "create one with `openssl genpkey -algorithm ed25519 -out key.pem` (see docs/store.md)"


class SigningSettings(BaseSettings):
    """Where the keys are; each field also reads ``PREFECT_EXECUTORCH_MANIFEST_<FIELD>`` from the environment."""

    model_config = SettingsConfigDict(env_prefix="PREFECT_EXECUTORCH_MANIFEST_", extra="forbid")

    signing_key: Path | None = Field(
        default=None, description="PEM Ed25519 private key; when set, publish signs every manifest with it.")
    public_key: Path | None = Field(
        default=None, description="PEM Ed25519 public key; when set, pull refuses manifests it did not sign.")

    def signer(self) -> Any:
        """The private key (an ``Ed25519PrivateKey``), or None when signing is off."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        if self.signing_key is None:
            return None
        key = _load(self.signing_key, "signing_key", lambda data: load_pem_private_key(data, password=None))
        if not isinstance(key, Ed25519PrivateKey):
            raise SpecError(f"manifest signing_key: {self.signing_key} holds a {type(key).__name__}, not an Ed25519 "
                            f"private key; {_KEYGEN_HINT}")
        return key

    def verifier(self) -> Any:
        """The public key (an ``Ed25519PublicKey``), or None when verification is off."""
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
        from cryptography.hazmat.primitives.serialization import load_pem_public_key

        if self.public_key is None:
            return None
        key = _load(self.public_key, "public_key", load_pem_public_key)
        if not isinstance(key, Ed25519PublicKey):
            raise SpecError(f"manifest public_key: {self.public_key} holds a {type(key).__name__}, not an Ed25519 "
                            f"public key; export it with `openssl pkey -in key.pem -pubout`")
        return key


def _load(path: Path, field: str, parse: Any) -> Any:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"manifest {field}: cannot read {path} ({exc.strerror}); set "
                        f"PREFECT_EXECUTORCH_MANIFEST_{field.upper()} to a PEM file") from None
    try:
        return parse(data)
    except (ValueError, TypeError):
        # The message of a failed parse can quote key material: never repeat it.
        raise SpecError(f"manifest {field}: {path} is not a PEM key without a passphrase; {_KEYGEN_HINT}") from None


def key_id(public_key: Any) -> str:
    """A short, stable name of a public key: sha256 of its raw bytes, 16 hex digits."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return hashlib.sha256(public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)).hexdigest()[:16]


def canonical(document: dict[str, Any]) -> bytes:
    """The bytes the digest and the signature cover: sorted keys, no whitespace, UTF-8."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def seal(document: dict[str, Any], signer: Any = None) -> bytes:
    """``document`` as stored JSON, with its digest and (with ``signer``) its signature."""
    body = canonical(document)
    sealed = {**document, DIGEST_FIELD: hashlib.sha256(body).hexdigest()}
    if signer is not None:
        sealed[SIGNATURE_FIELD] = {"key_id": key_id(signer.public_key()),
                                   "ed25519": base64.b64encode(signer.sign(body)).decode()}
    return _stored(sealed)


def _stored(sealed: dict[str, Any]) -> bytes:
    """The one serialization of a sealed document (json keeps key order, and floats print as their shortest repr)."""
    return json.dumps(sealed, indent=2, ensure_ascii=False).encode()


def unseal(data: bytes, where: str, verifier: Any = None) -> dict[str, Any]:
    """The document in ``data`` after checking its digest (and, with ``verifier``, its signature)."""
    from cryptography.exceptions import InvalidSignature

    try:
        document = json.loads(data)
        if not isinstance(document, dict):
            raise ValueError(f"a JSON {type(document).__name__}, not an object")
        as_sealed = _stored(document)
        digest = document.pop(DIGEST_FIELD, None)
        signature = document.pop(SIGNATURE_FIELD, None)
        body = canonical(document)
    except (ValueError, UnicodeDecodeError) as exc:
        raise IntegrityError(f"{where} is not a valid manifest ({exc}); the object is corrupt") from None
    if digest != hashlib.sha256(body).hexdigest():
        raise IntegrityError(f"{where}: its content does not match its digest {digest!r}; the manifest is corrupt or "
                             "was edited after it was published: refusing it")
    if as_sealed != data:
        raise IntegrityError(f"{where}: its bytes are not the ones that were sealed (same values, other spelling or "
                             "layout); the manifest is corrupt or was edited after it was published: refusing it")
    if verifier is None:
        return document
    if not isinstance(signature, dict):
        raise IntegrityError(f"{where} is not signed, and a manifest public key is configured: refusing it")
    if signature.get("key_id") != key_id(verifier):
        raise IntegrityError(f"{where} is signed by key {signature.get('key_id')!r}, not by the configured public key "
                             f"{key_id(verifier)}: refusing it")
    try:
        verifier.verify(base64.b64decode(str(signature.get("ed25519", "")), validate=True), body)
    except (InvalidSignature, ValueError):
        raise IntegrityError(f"{where}: its Ed25519 signature does not verify: refusing it") from None
    return document
