"""Aliases (``prod``, ``staging``): a named pointer to one bundle, moved by compare-and-swap.

``<name>/aliases/<alias>.json`` holds an ``AliasRecord``. It is created with ``If-None-Match: *``
and replaced with ``If-Match: <etag read>``, so of two concurrent promotions exactly one lands
and the other is told what the alias points at now. Every move is also written, create-only, to
``<name>/aliases/<alias>.history/<time>-<uuid>.json``: an append-only log that works on any store
(S3 versioning, where enabled, keeps the old alias objects too).
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator

from prefect_executorch.artifacts.manifest import ALIASES_DIR, BundleKey, user_at_host
from prefect_executorch.artifacts.publishing import list_bundles, read_manifest
from prefect_executorch.artifacts.store import ObjectStore
from prefect_executorch.errors import (
    BundleConflict,
    BundleNotFound,
    IntegrityError,
    ObjectExists,
    PreconditionFailed,
    StoreError,
    ValidationFailed,
)
from prefect_executorch.hashing import sha256_bytes
from prefect_executorch.spec.fields import check_name
from prefect_executorch.validate.sidebyside import SideBySide

logger = logging.getLogger(__name__)


class AliasTarget(BaseModel):
    """The bundle an alias points at."""

    version: str
    target: str
    compat: str
    manifest_sha256: str = Field(pattern=r"^[0-9a-f]{64}$",
                                 description="sha256 of the bundle's manifest.json; pins the whole bundle.")

    @field_validator("version", "target", "compat", "name", "alias", check_fields=False)
    @classmethod
    def _segment(cls, value: str, info: ValidationInfo) -> str:
        # These become store keys when the alias is followed: the same rule as a bundle key's segments.
        return check_name(value, str(info.field_name))


class AliasRecord(AliasTarget):
    """One position of an alias, as stored in ``<name>/aliases/<alias>.json`` and its history."""

    name: str
    alias: str
    moved_at: datetime
    moved_by: str
    forced: bool = Field(default=False, description="Promoted with --force over a failed validation or side-by-side gate.")
    validation_passed: bool
    previous: AliasTarget | None = Field(default=None, description="Where the alias pointed before this move.")
    overridden: list[str] = Field(default_factory=list, description="What --force overrode, one line per refusal.")
    comparison: SideBySide | None = Field(
        default=None, description="The candidate run beside the previous bundle (None: the alias was empty or the same).")

    def bundle_key(self) -> BundleKey:
        """The key of the bundle this alias points at."""
        return BundleKey.of(self.name, self.version, self.target, self.compat)

    def describe(self) -> str:
        """One line for messages."""
        return (f"{self.alias} -> {self.name} {self.version} {self.target}/{self.compat} "
                f"(manifest sha256 {self.manifest_sha256[:12]}…, moved {self.moved_at:%Y-%m-%d %H:%M:%S}Z "
                f"by {self.moved_by}{', forced' if self.forced else ''})")


def alias_key(name: str, alias: str) -> str:
    """Store key of an alias."""
    return f"{check_name(name, 'name')}/{ALIASES_DIR}/{check_name(alias, 'alias')}.json"


def history_prefix(name: str, alias: str) -> str:
    """Store prefix of an alias's history log."""
    return f"{check_name(name, 'name')}/{ALIASES_DIR}/{check_name(alias, 'alias')}.history/"


def parse_alias(data: bytes, where: str) -> AliasRecord:
    """An alias record from its stored bytes; ``IntegrityError`` if they are not one."""
    try:
        return AliasRecord.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        location = ".".join(str(part) for part in first["loc"]) or "record"
        raise IntegrityError(
            f"{where} is not a valid alias record ({location}: {first['msg'].removeprefix('Value error, ')}); "
            "the object is corrupt or was edited by hand: promote again to rewrite it") from None


def read_alias(store: ObjectStore, name: str, alias: str) -> tuple[AliasRecord, str] | None:
    """The alias and its etag, or None if it was never set."""
    key = alias_key(name, alias)
    try:
        data, etag = store.get_bytes(key)
    except BundleNotFound:
        return None
    return parse_alias(data, key), etag


def alias_history(store: ObjectStore, name: str, alias: str) -> list[AliasRecord]:
    """Every move of the alias, oldest first."""
    records = [parse_alias(store.get_bytes(info.key)[0], info.key)
               for info in store.list(history_prefix(name, alias))]
    return sorted(records, key=lambda record: record.moved_at)


def list_aliases(store: ObjectStore, name: str) -> dict[str, AliasRecord]:
    """The aliases of ``name`` by alias."""
    found = {}
    for info in store.list(f"{check_name(name, 'name')}/{ALIASES_DIR}/"):
        rest = info.key.split("/")[2:]
        if len(rest) == 1 and rest[0].endswith(".json"):
            alias = rest[0].removesuffix(".json")
            current = read_alias(store, name, alias)
            if current is not None:
                found[alias] = current[0]
    return found


def select_bundle(store: ObjectStore, name: str, version: str, target: str | None, compat: str | None) -> BundleKey:
    """The one published bundle of ``name`` ``version`` matching ``target``/``compat``."""
    candidates = [key for key in list_bundles(store, name, version)
                  if (target is None or key.target == target) and (compat is None or key.compat == compat)]
    if len(candidates) == 1:
        return candidates[0]
    published = list_bundles(store, name, version)
    existing = ", ".join(f"{key.target}/{key.compat}" for key in published)
    if not published:
        versions = ", ".join(sorted({key.version for key in list_bundles(store, name)})) or "none"
        raise BundleNotFound(f"no bundle of {name} version {version} in {store.url}; versions of {name} there: {versions}")
    if not candidates:
        raise BundleNotFound(
            f"no bundle of {name} version {version} matches target={target or 'any'} compat={compat or 'any'} "
            f"in {store.url}; its bundles: {existing}")
    raise BundleConflict(
        f"{name} version {version} has {len(candidates)} bundles ({existing}); choose one by its target and compat "
        "(`promote --target/--compat`; the promote-bundle flow's `target` and `compat` parameters)")


def move_alias(
    store: ObjectStore,
    name: str,
    version: str,
    alias: str,
    *,
    target: str | None = None,
    compat: str | None = None,
    force: bool = False,
    expect_version: str | None = None,
    moved_by: str | None = None,
    comparison: SideBySide | None = None,
    overridden: list[str] | None = None,
) -> AliasRecord:
    """Point ``alias`` at a validated bundle with compare-and-swap; the loser of a race gets ``BundleConflict``.

    ``expect_version`` makes the move conditional on where the alias points now (none: any);
    ``comparison`` and ``overridden`` (what a forced side-by-side gate refused) are recorded as given.
    """
    key_name = alias_key(name, alias)
    key = select_bundle(store, name, check_name(version, "version"), target, compat)
    manifest, raw = read_manifest(store, key)
    if not manifest.validation.passed and not force:
        raise ValidationFailed(
            f"{key.prefix} failed its validation ({manifest.validation.failed_cases} of "
            f"{manifest.validation.cases} cases; worst: {manifest.validation.worst}); only validated bundles "
            "can be promoted; pass --force to promote it anyway (the alias records that it was forced)")
    current = read_alias(store, name, alias)
    if expect_version is not None and (current is None or current[0].version != expect_version):
        now_at = current[0].describe() if current else f"{alias} is not set"
        raise BundleConflict(f"alias {alias} of {name} was expected at version {expect_version}, but {now_at}; "
                             "nothing was changed")
    overrides = ([] if manifest.validation.passed else [f"failed validation: {manifest.validation.worst}"])
    overrides += overridden or []
    record = AliasRecord(
        name=name, alias=alias, version=key.version, target=key.target, compat=key.compat,
        manifest_sha256=sha256_bytes(raw), moved_at=datetime.now(UTC), moved_by=moved_by or user_at_host(),
        forced=force and bool(overrides), validation_passed=manifest.validation.passed,
        previous=AliasTarget.model_validate(current[0].model_dump()) if current else None,
        overridden=overrides if force else [], comparison=comparison,
    )
    body = record.model_dump_json(indent=2).encode()
    try:
        store.put_bytes(key_name, body, if_match=current[1] if current else None)
    except (ObjectExists, PreconditionFailed):
        now = read_alias(store, name, alias)
        if now is not None and now[0] == record:
            pass  # our own write landed and its answer was lost
        else:
            raise BundleConflict(
                f"alias {alias} of {name} was moved by someone else while promoting {version}; it now points at "
                f"{now[0].describe() if now else 'nothing'}; nothing was overwritten: re-run promote to move it "
                "again") from None
    stamp = record.moved_at.strftime("%Y%m%dT%H%M%S.%fZ")
    try:
        store.put_bytes(f"{history_prefix(name, alias)}{stamp}-{uuid.uuid4().hex[:12]}.json", body)
    except StoreError as exc:
        # The alias has moved (and records where it was); a missing log line must not hide that.
        logger.warning("alias %s of %s moved, but its history entry was not written: %s", alias, name, exc)
    return record
