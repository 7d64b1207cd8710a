"""Publish and pull bundles: objects first, manifest last; every byte verified on the way back."""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, ValidationError

from prefect_executorch.artifacts.manifest import (
    ALIASES_DIR,
    CLAIM_FILE,
    MANIFEST_FILE,
    VALIDATION_FILE,
    BundleKey,
    FileEntry,
    Manifest,
    method_entries,
    platform_facts,
)
from prefect_executorch.artifacts.signing import (
    SIGNATURE_FILE,
    canonical,
    seal,
    sign_directory,
    unseal,
    verify_directory,
)
from prefect_executorch.artifacts.store import ObjectStore
from prefect_executorch.errors import (
    BundleConflict,
    BundleNotFound,
    DestinationExists,
    IntegrityError,
    NotABundle,
    ObjectExists,
    PrefectExecutorchError,
)
from prefect_executorch.export.exporter import ExportedProgramDir
from prefect_executorch.export.fingerprint import BuildFingerprint
from prefect_executorch.export.lineage import Lineage
from prefect_executorch.hashing import sha256_bytes, sha256_file
from prefect_executorch.machine.toolchain import Toolchain
from prefect_executorch.runtime.bundled_cases import BUNDLED_FILE
from prefect_executorch.spec.asr import PREPROCESSOR_PROGRAM, SPEECH_MODEL_FILES, TRANSCRIPTION_CASES_FILE
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.fields import check_name
from prefect_executorch.spec.llm import GENERATION_CASES_FILE, TOKENIZER_CONFIG_FILES, TOKENIZER_FILE
from prefect_executorch.targets import get_target
from prefect_executorch.targets.delegation import DelegationFacts
from prefect_executorch.validate.bundled import bundled_facts
from prefect_executorch.validate.report import ValidationReport

if TYPE_CHECKING:
    from prefect_executorch.settings import SigningSettings
    from prefect_executorch.targets.base import Target

logger = logging.getLogger(__name__)


def _signing(given: SigningSettings | None) -> SigningSettings:
    # Imported on use: the settings import Prefect (~1 s), which the CLI's check for a published
    # version must not wait for (it decides whether the child processes start).
    from prefect_executorch.settings import SigningSettings, read_settings

    return given or read_settings(SigningSettings)


class BundleRef(BaseModel):
    """A published bundle."""

    store: str
    key: BundleKey
    manifest_key: str
    manifest_sha256: str
    cache_hit: bool = Field(False, description="The bundle was already published by an identical build.")


def file_entries(bundle_dir: Path, program: str, data_files: list[str], reports: list[str],
                 bundled: list[str] | None = None, kind_files: tuple[str, list[str]] | None = None) -> list[FileEntry]:
    """Size and sha256 of every file of a bundle directory, with its role (``kind_files``: a model kind's files and
    their role, ``generation`` or ``speech``)."""
    role, named = kind_files or ("", [])
    roles = ([(program, "program")] + [(f, "data") for f in data_files] + [(f, "bundled") for f in bundled or []]
             + [(f, role) for f in named] + [(f, "report") for f in reports])
    return [
        FileEntry(path=name, size=(bundle_dir / name).stat().st_size, sha256=sha256_file(bundle_dir / name), role=role)
        for name, role in roles
    ]


def list_bundles(store: ObjectStore, name: str, version: str | None = None) -> list[BundleKey]:
    """Published bundles of ``name`` (of one ``version`` if given): those with a manifest."""
    check_name(name, "name")
    prefix = f"{name}/{check_name(version, 'version')}/" if version else f"{name}/"
    found = []
    for info in store.list(prefix):
        parts = info.key.split("/")
        if len(parts) == 5 and parts[4] == MANIFEST_FILE and parts[1] != ALIASES_DIR:
            found.append(BundleKey.of(*parts[:4]))
    return found


def manifest_bytes(manifest: Manifest) -> bytes:
    """The stored form of ``manifest``: sealed with its digest."""
    return seal(manifest.model_dump(mode="json"))


def parse_manifest(data: bytes, where: str) -> Manifest:
    """A manifest from its stored bytes; ``IntegrityError`` unless its digest holds."""
    document = unseal(data, where)
    try:
        return Manifest.model_validate(document)
    except ValidationError as exc:
        raise IntegrityError(f"{where} is not a valid manifest: {exc}") from None


def read_manifest(store: ObjectStore, key: BundleKey) -> tuple[Manifest, bytes]:
    """The verified manifest of ``key`` and its stored bytes."""
    where = key.key(MANIFEST_FILE)
    data, _ = store.get_bytes(where)
    manifest = parse_manifest(data, where)
    if manifest.key != key:
        raise IntegrityError(
            f"{where} describes {manifest.key.prefix}, not {key.prefix}: refusing a manifest "
            "that points outside its own prefix"
        )
    return manifest, data


class PublishClaim(BaseModel):
    """Who is publishing a bundle key: the first publisher creates it, every other one backs off."""

    files_sha256: str = Field(
        description="sha256 over the program and data entries: a retry, or a rerun of the same build, matches.")
    builder: str
    started: datetime = Field(default_factory=lambda: datetime.now(UTC))


def _files_sha256(manifest: Manifest) -> str:
    # Reports are left out: a rerun of a crashed build validates again and resumes its own publish.
    built = [entry.model_dump() for entry in manifest.files if entry.role != "report"]
    return sha256_bytes(canonical({"files": built}))


def _claim(store: ObjectStore, manifest: Manifest) -> bool:
    """Claim the bundle key for this publish; True if this call created the claim, False for a retry's own."""
    claim = PublishClaim(files_sha256=_files_sha256(manifest), builder=manifest.builder)
    claim_key = manifest.key.key(CLAIM_FILE)
    try:
        store.put_bytes(claim_key, claim.model_dump_json().encode())
        return True
    except ObjectExists:
        pass
    try:
        holder = PublishClaim.model_validate_json(store.get_bytes(claim_key)[0])
    except BundleNotFound:  # the holder finished (or gave up) between our two requests
        return _claim(store, manifest)
    except ValidationError:
        holder = None
    if holder is not None and holder.files_sha256 == claim.files_sha256:
        return False
    who = f"{holder.builder} since {holder.started:%Y-%m-%d %H:%M:%S} UTC" if holder else "an unknown publisher"
    raise BundleConflict(
        f"{manifest.key.prefix} is being published by {who} with other content; nothing was written. If that "
        "publish died, `prefect-executorch gc` removes its claim after the grace period; or publish a new version"
    )


def _release(store: ObjectStore, manifest: Manifest) -> None:
    try:
        store.delete(manifest.key.key(CLAIM_FILE))
    except PrefectExecutorchError as exc:  # the outcome is decided; gc removes a stale claim
        logger.warning("could not remove the publish claim of %s (%s)", manifest.key.prefix, type(exc).__name__)


def publish(store: ObjectStore, bundle_dir: Path, manifest: Manifest, *,
            signing: SigningSettings | None = None) -> BundleRef:
    """Claim the key, upload the bundle's files (and signature), then its manifest with create-only semantics.

    Of concurrent publishers of one key exactly one succeeds; the others get ``BundleConflict`` and
    nothing they sent is visible. A retry of a failed publish (same files) resumes where it stopped.
    With a signing key (default: from the environment) the bundle is signed as it will be pulled.
    """
    key = manifest.key
    manifest_key = key.key(MANIFEST_FILE)
    body = manifest_bytes(manifest)
    private_key = _signing(signing).checked_signing_key()
    signature = _sign(bundle_dir, manifest, body, private_key) if private_key else None
    if store.exists(manifest_key):
        raise _published_already(store, key)
    created = _claim(store, manifest)
    try:
        _upload_files(store, bundle_dir, manifest)
        if signature is not None:
            _put_signature(store, key, body, signature)
        try:
            store.put_bytes(manifest_key, body)
        except ObjectExists as exc:
            if exc.existing_sha256 != sha256_bytes(body):
                raise _published_already(store, key) from None
            # Our own write landed and its answer was lost; the retry found it.
    except BundleConflict:
        if created:
            _release(store, manifest)
        raise
    _release(store, manifest)
    return BundleRef(store=store.url, key=key, manifest_key=manifest_key, manifest_sha256=sha256_bytes(body))


def is_signed(store: ObjectStore, ref: BundleRef) -> bool:
    """Whether a ``model.sig`` of ``ref``'s very manifest is stored."""
    return store.exists(_signature_object(ref.key, ref.manifest_sha256))


def sign_unsigned(store: ObjectStore, ref: BundleRef, *, signing: SigningSettings | None = None) -> bool:
    """Sign a published bundle that has no signature, where a signing key is set (a cache hit of a build that
    signs now: what ``IntegrityError``'s advice asks for); whether it signed it now.

    The bundle is downloaded into a scratch folder with every checksum verified, signed exactly as it is pulled,
    and its signature stored beside the manifest (named by the manifest's sha256, as ``publish`` stores it):
    nothing published is rewritten.
    """
    from prefect_executorch.scratch import scratch_dir
    from prefect_executorch.settings import SigningSettings

    private_key = _signing(signing).checked_signing_key()
    if private_key is None or is_signed(store, ref):
        return False
    with scratch_dir("sign") as scratch:
        copy = scratch / "bundle"
        # No public key while pulling: the bundle is unsigned, which is what this mends.
        manifest = pull(store, ref.key, copy, manifest_sha256=ref.manifest_sha256,
                        signing=SigningSettings(signing_key=None, signing_public_key=None))
        body = (copy / MANIFEST_FILE).read_bytes()
        _put_signature(store, ref.key, body, _sign(copy, manifest, body, private_key))
    return True


def _signature_object(key: BundleKey, manifest_sha256: str) -> str:
    return key.key(f"{SIGNATURE_FILE}.{manifest_sha256}")


def signature_key(key: BundleKey, manifest_body: bytes) -> str:
    """Where the signature of one manifest is stored: named by the manifest's sha256, so that two attempts
    at one bundle key never overwrite each other's signature and the manifest that lands finds its own."""
    return _signature_object(key, sha256_bytes(manifest_body))


def _sign(bundle_dir: Path, manifest: Manifest, body: bytes, private_key: Path) -> bytes:
    """``model.sig`` over the bundle exactly as a pull lays it out: its files and the final manifest."""
    laid_out = bundle_dir / f".signing-{uuid.uuid4().hex[:8]}"
    laid_out.mkdir()
    try:
        for entry in manifest.files:
            os.link(bundle_dir / entry.path, laid_out / entry.path)
        (laid_out / MANIFEST_FILE).write_bytes(body)
        return sign_directory(laid_out, private_key)
    finally:
        shutil.rmtree(laid_out, ignore_errors=True)


def _put_signature(store: ObjectStore, key: BundleKey, body: bytes, signature: bytes) -> None:
    where = signature_key(key, body)
    try:
        store.put_bytes(where, signature)
    except ObjectExists:
        # Only a signature of these very manifest bytes lives here (a retry's, or a planted one): ours replaces it.
        store.delete(where)
        store.put_bytes(where, signature)


def _published_already(store: ObjectStore, key: BundleKey) -> BundleConflict:
    existing, _ = store.get_bytes(key.key(MANIFEST_FILE))
    return BundleConflict(
        f"{key.prefix} is already published in {store.url} (manifest sha256 {sha256_bytes(existing)}); "
        "publish a new version instead: nothing was overwritten"
    )


def _upload_files(store: ObjectStore, bundle_dir: Path, manifest: Manifest) -> None:
    for entry in manifest.files:
        try:
            result = store.put_file(manifest.key.key(entry.path), bundle_dir / entry.path, sha256=entry.sha256)
        except ObjectExists as exc:
            # A retried publish finds its own object; anything else is another publisher's.
            if exc.existing_sha256 == entry.sha256:
                continue
            raise BundleConflict(
                f"{exc.key} already exists with other content (sha256 {exc.existing_sha256}) and no manifest: "
                "another publisher is writing this version, or an earlier publish died; "
                "run `prefect-executorch gc` to clear orphans, or publish a new version"
            ) from None
        if result.sha256 != entry.sha256 or result.size != entry.size:
            raise IntegrityError(
                f"{entry.path} changed while it was published (sha256 {result.sha256}, manifest says {entry.sha256})"
            )


def verify_pairing(manifest: Manifest) -> None:
    """The manifest must bind its program and data files by sha256."""
    names = {entry.path for entry in manifest.files}
    missing = [f for f in [manifest.program, *manifest.data_files] if f not in names]
    if missing:
        raise IntegrityError(f"manifest of {manifest.key.prefix} lists no checksum for {missing}")


def pull(store: ObjectStore, key: BundleKey, dest: Path, *, manifest_sha256: str | None = None,
         signing: SigningSettings | None = None, check: Callable[[Path, Manifest], Any] | None = None) -> Manifest:
    """Download a bundle into ``dest`` (which must not exist), verifying every file; all or nothing.

    ``manifest_sha256`` (an alias records it) pins the manifest itself; with a public key in
    ``signing`` (default: from the environment) the bundle's ``model.sig`` must verify every file.
    ``check`` runs on the complete download before it is moved into place; if it raises, nothing is.
    """
    public_key = _signing(signing).checked_public_key()
    manifest, raw = read_manifest(store, key)
    if manifest_sha256 is not None and sha256_bytes(raw) != manifest_sha256:
        raise IntegrityError(
            f"{key.key(MANIFEST_FILE)}: sha256 {sha256_bytes(raw)} is not the {manifest_sha256} the alias recorded; "
            "manifests are never rewritten, so the store was tampered with: refusing to pull"
        )
    verify_pairing(manifest)
    if dest.exists():
        raise DestinationExists(f"destination {dest} already exists; choose a new directory (pull never writes into one)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.with_name(f".{dest.name}.partial-{uuid.uuid4().hex[:8]}")
    staging.mkdir()
    try:
        for entry in manifest.files:
            sha = store.download_file(key.key(entry.path), staging / entry.path)
            size = (staging / entry.path).stat().st_size
            if sha != entry.sha256 or size != entry.size:
                raise IntegrityError(
                    f"{key.key(entry.path)}: sha256 {sha} ({size} bytes) does not match the manifest's "
                    f"{entry.sha256} ({entry.size} bytes); the stored object is corrupt or was swapped"
                )
        (staging / MANIFEST_FILE).write_bytes(raw)
        try:
            store.download_file(signature_key(key, raw), staging / SIGNATURE_FILE)
        except BundleNotFound:
            pass  # unsigned: refused below when a public key is set
        if public_key is not None:
            verify_directory(staging, public_key, key.prefix)
        if check is not None:
            check(staging, manifest)
        os.rename(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def _model_kind_files(spec: BuildSpec, bundle_dir: Path) -> tuple[str, list[str]] | None:
    """What a Hugging Face model's bundle carries beside its program, and their role: a decoder LM's runner needs its
    tokenizer (and its configuration: BOS and EOS), its prompts are its own test cases; a speech model's consumer
    needs its tokenizer and the front end's settings, its clips (the spec's .wav files) are its own test cases."""
    if spec.llm is not None:
        return "generation", [TOKENIZER_FILE, *(name for name in TOKENIZER_CONFIG_FILES if (bundle_dir / name).is_file()),
                              GENERATION_CASES_FILE]
    if spec.asr is not None:
        clips = sorted(path.name for path in bundle_dir.glob("clip-*.wav"))
        shipped = [*SPEECH_MODEL_FILES, PREPROCESSOR_PROGRAM]
        return "speech", [*(name for name in shipped if (bundle_dir / name).is_file()), *clips,
                          TRANSCRIPTION_CASES_FILE]
    return None


def _runtime_hints(target: Target, spec: BuildSpec, toolchain: Toolchain, export: ExportedProgramDir) -> dict[str, Any]:
    hints = target.runtime_hints(spec, toolchain)
    if spec.llm is not None:
        # What a caller needs before it runs a prompt: the cache's positions and how the program takes the prompt.
        hints["llm"] = {"max_seq_len": spec.llm.max_seq_len,
                        "prefill": "token_by_token" if target.token_per_call(spec) else "one_call"}
    libraries = target.cpp_libraries(list(export.methods.values()))
    return hints if libraries is None else {**hints, "cpp_libraries": libraries}


def prepare_bundle(
    spec: BuildSpec, toolchain: Toolchain, export: ExportedProgramDir, report: ValidationReport,
    build_inputs: BuildFingerprint | None = None, lineage: Lineage | None = None, compat: str | None = None,
) -> Manifest:
    """Write ``validation.json`` into the export directory and build the bundle's manifest.

    ``compat``: the key the build already computed (a build computes it once); None computes it here.
    """
    target = get_target(spec.target_name)
    bundle_dir = export.path
    (bundle_dir / VALIDATION_FILE).write_text(report.model_dump_json(indent=2))
    bundled = bundled_facts(bundle_dir, export.program, spec, report)
    return Manifest(
        name=spec.name,
        version=spec.version,
        target=spec.target_name,
        compat=compat if compat is not None else target.compat(spec, toolchain),
        files=file_entries(bundle_dir, export.program, export.data_files, [VALIDATION_FILE],
                           [BUNDLED_FILE] if bundled.file else [],
                           _model_kind_files(spec, bundle_dir)),
        program=export.program,
        data_files=export.data_files,
        methods=method_entries({name: m.inputs for name, m in spec.methods.items()}, export.methods, export.delegation),
        toolchain=toolchain.versions(),
        platform=platform_facts(toolchain),
        runtime_hints=_runtime_hints(target, spec, toolchain, export),
        notes=export.warnings,
        spec_sha256=spec.sha256(),
        weights_sha256=export.weights_sha256,
        quantization=export.quantization,
        fingerprint=build_inputs.key() if build_inputs else None,
        build_inputs=build_inputs,
        validation=report.summary(),
        bundled=bundled,
        lineage=lineage,
        card=spec.card,
    )


def verify_bundle_dir(bundle_dir: Path) -> Manifest:
    """Check every file of a local bundle against its manifest.json."""
    path = bundle_dir / MANIFEST_FILE
    if not bundle_dir.is_dir():
        raise NotABundle(f"{bundle_dir} {'is a file, not a bundle folder' if bundle_dir.exists() else 'does not exist'}; "
                         "give the folder `pull --to` made")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise NotABundle(f"{bundle_dir} has no {MANIFEST_FILE}, so it is no bundle; give the folder `pull --to` made, "
                         "or pull a bundle first") from None
    manifest = parse_manifest(data, str(path))
    public_key = _signing(None).checked_public_key()
    if public_key is not None:
        if not (bundle_dir / SIGNATURE_FILE).exists() and any(bundle_dir.glob(f"{SIGNATURE_FILE}.*")):
            # A local store keeps each manifest's signature beside it by the manifest's sha256; the signature covers
            # the bundle as a pull lays it out, so this folder cannot be checked in place.
            raise IntegrityError(
                f"{bundle_dir} is a bundle's folder inside the store, not a pulled bundle: its signature is kept as "
                f"{SIGNATURE_FILE}.<manifest sha256> and verifies only where a pull lays the bundle out; run "
                f"`prefect-executorch pull {manifest.name} --version {manifest.version} --to DIR` and give DIR")
        verify_directory(bundle_dir, public_key, str(bundle_dir))
    verify_pairing(manifest)
    for entry in manifest.files:
        file = bundle_dir / entry.path
        if not file.is_file():
            raise IntegrityError(f"{file} is missing")
        sha = sha256_file(file)
        if sha != entry.sha256:
            raise IntegrityError(f"{file}: sha256 {sha} does not match the manifest's {entry.sha256}")
    return manifest


def local_bundle(bundle_dir: Path) -> tuple[Manifest | None, list[str], dict[str, DelegationFacts]]:
    """A local bundle's verified manifest (None for a bare export), .ptd files and delegation counts."""
    if (bundle_dir / MANIFEST_FILE).exists():
        manifest = verify_bundle_dir(bundle_dir)
        return manifest, manifest.data_files, manifest.delegation()
    return None, sorted(p.name for p in bundle_dir.glob("*.ptd")), {}
