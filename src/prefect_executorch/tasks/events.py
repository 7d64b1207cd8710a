"""Prefect events about bundles: published, reused (a cache hit), promoted, pulled, and exports and validations that failed.

The bundle is the event's resource, with a ``prefect.resource.id`` that is the same for every
event about one bundle of one store (``prefect-executorch.bundle.<store url>/<name>/<version>/<target>/<compat>``),
so an automation or the event feed can follow one bundle, and its facts as resource labels that
triggers can match (``prefect-executorch.name``, ``.version``, ``.target``, ``.compat``, ``.store``,
``.manifest-sha256``).
"""

from __future__ import annotations

from typing import Any

from prefect.events import emit_event

from prefect_executorch.artifacts.aliases import AliasRecord
from prefect_executorch.artifacts.manifest import BundleKey
from prefect_executorch.artifacts.publishing import BundleRef

PREFIX = "prefect-executorch"
PUBLISHED = f"{PREFIX}.bundle.published"
PROMOTED = f"{PREFIX}.bundle.promoted"
REUSED = f"{PREFIX}.bundle.reused"
PULLED = f"{PREFIX}.bundle.pulled"
VALIDATION_FAILED = f"{PREFIX}.validation.failed"
EXPORT_FAILED = f"{PREFIX}.export.failed"
RESOURCE_PREFIX = f"{PREFIX}.bundle."


def bundle_resource(
    key: BundleKey, store_url: str, manifest_sha256: str | None = None, labels: dict[str, str] | None = None
) -> dict[str, str]:
    """The bundle as a Prefect event resource: a stable id and its facts (and ``labels``) as labels."""
    resource = {
        "prefect.resource.id": f"{RESOURCE_PREFIX}{store_url}/{key.prefix}",
        "prefect.resource.name": f"{key.name} {key.version} {key.target}/{key.compat}",
        f"{PREFIX}.name": key.name,
        f"{PREFIX}.version": key.version,
        f"{PREFIX}.target": key.target,
        f"{PREFIX}.compat": key.compat,
        f"{PREFIX}.store": store_url,
    }
    if manifest_sha256:
        resource[f"{PREFIX}.manifest-sha256"] = manifest_sha256
    resource.update({f"{PREFIX}.{name}": value for name, value in (labels or {}).items()})
    return resource


def emit_bundle_event(
    event: str, key: BundleKey, store_url: str, manifest_sha256: str | None = None, *,
    payload: dict[str, Any] | None = None, related: list[dict[str, str]] | None = None,
    labels: dict[str, str] | None = None,
) -> None:
    """Emit ``event`` about one bundle (a no-op where Prefect emits no events)."""
    emit_event(event, resource=bundle_resource(key, store_url, manifest_sha256, labels), payload=payload or {},
               related=related)


def emit_reused(ref: BundleRef, how: str) -> None:
    """A build that published nothing because an identical build's bundle is in the store (``how``: where it ran)."""
    emit_bundle_event(REUSED, ref.key, ref.store, ref.manifest_sha256,
                      payload={"manifest_key": ref.manifest_key, "how": how})


def emit_promoted(record: AliasRecord, store_url: str) -> None:
    """An alias moved (a promote that found the alias already there moved nothing and emits nothing)."""
    name, alias = record.bundle_key().name, record.alias
    emit_bundle_event(
        PROMOTED, record.bundle_key(), store_url, record.manifest_sha256,
        payload={"alias": alias, "moved_by": record.moved_by, "forced": record.forced, "overridden": record.overridden,
                 "previous": record.previous.model_dump() if record.previous else None},
        related=[{"prefect.resource.id": f"prefect-executorch.alias.{store_url}/{name}/{alias}",
                  "prefect.resource.role": "alias", "prefect.resource.name": alias}],
    )
