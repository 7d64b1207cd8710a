"""Remove what failed publishes left behind: objects of bundles without a manifest, unfinished uploads, claims.

A bundle without a manifest does not exist for readers, so its objects are garbage once nobody can
still be writing them; the grace period (default 24 h) must exceed the longest publish. Dry run
unless ``apply``.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel

from prefect_executorch.artifacts.manifest import ALIASES_DIR, CLAIM_FILE, MANIFEST_FILE
from prefect_executorch.artifacts.store import IncompleteUpload, ObjectInfo, ObjectStore
from prefect_executorch.defaults import GC_GRACE_HOURS
from prefect_executorch.spec.fields import check_name

DEFAULT_GRACE = timedelta(hours=GC_GRACE_HOURS)


class GcReport(BaseModel):
    """What gc found (and removed, if applied)."""

    store: str
    grace_hours: float
    applied: bool
    orphans: list[ObjectInfo]
    uploads: list[IncompleteUpload]
    kept_recent: int


def gc(store: ObjectStore, name: str | None = None, *, grace: timedelta = DEFAULT_GRACE, apply: bool = False,
       now: datetime | None = None) -> GcReport:
    """Find (and with ``apply`` remove) orphaned bundle objects and unfinished uploads older than ``grace``."""
    prefix = f"{check_name(name, 'name')}/" if name else ""
    cutoff = (now or datetime.now(UTC)) - grace
    groups: dict[str, list[ObjectInfo]] = defaultdict(list)
    for info in store.list(prefix):
        parts = info.key.split("/")
        if len(parts) == 5 and parts[1] != ALIASES_DIR:
            groups["/".join(parts[:4])].append(info)
    orphaned: dict[str, list[ObjectInfo]] = {}
    recent = 0
    for bundle, objects in sorted(groups.items()):
        if any(o.key.endswith(f"/{MANIFEST_FILE}") for o in objects):
            # Published: only a claim its publisher could not remove is left over.
            stale = [o for o in objects if o.key.endswith(f"/{CLAIM_FILE}") and o.last_modified < cutoff]
            if stale:
                orphaned[bundle] = stale
            continue
        # Remove a bundle's objects only when all are old: a recent one means a publish may be running.
        if all(o.last_modified < cutoff for o in objects):
            orphaned[bundle] = objects
        else:
            recent += len(objects)
    uploads = [u for u in store.incomplete_uploads(prefix) if u.started < cutoff]
    if apply:
        for bundle, objects in orphaned.items():
            if store.exists(f"{bundle}/{MANIFEST_FILE}"):  # a slow publisher finished meanwhile
                objects = [o for o in objects if o.key.endswith(f"/{CLAIM_FILE}")]
            for info in objects:
                store.delete(info.key)
        for upload in uploads:
            store.abort_upload(upload)
    return GcReport(store=store.url, grace_hours=grace.total_seconds() / 3600, applied=apply,
                    orphans=[o for objects in orphaned.values() for o in objects], uploads=uploads, kept_recent=recent)
