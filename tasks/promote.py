"""Move an alias to a validated bundle that agrees with, and is no slower than, what the alias serves now."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from prefect import get_run_logger, task

from prefect_executorch.artifacts.aliases import AliasRecord
from prefect_executorch.artifacts.promotion import MAX_LATENCY_REGRESSION, promote_checked
from prefect_executorch.artifacts.reports import publish_promotion_artifact
from prefect_executorch.artifacts.store import open_store
from prefect_executorch.spec import ValidationSpec
from prefect_executorch.tasks.events import PROMOTED, emit_bundle_event

if TYPE_CHECKING:
    from prefect.blocks.core import Block


@task(name="promote-alias")
def promote_alias(
    store: str | Block,
    name: str,
    version: str,
    alias: str,
    target: str | None = None,
    compat: str | None = None,
    force: bool = False,
    expect_version: str | None = None,
    max_latency_regression: float = MAX_LATENCY_REGRESSION,
    allow_output_change: bool = False,
    validation: ValidationSpec | None = None,
) -> AliasRecord:
    """Point ``alias`` at ``name`` ``version``; a lost race, an unvalidated bundle or a failed side-by-side fails it."""
    opened = open_store(store)
    with tempfile.TemporaryDirectory(prefix="prefect-executorch-promote-") as scratch:
        record = promote_checked(opened, name, version, alias, target=target, compat=compat, force=force,
                                 max_latency_regression=max_latency_regression,
                                 allow_output_change=allow_output_change, validation=validation,
                                 scratch_dir=Path(scratch), expect_version=expect_version)
    logger = get_run_logger()
    logger.info("%s%s", record.describe(), f" (was {record.previous.version})" if record.previous else "")
    publish_promotion_artifact(f"{name}-{version}-to-{alias}", record)
    emit_bundle_event(
        PROMOTED, record.bundle_key(), opened.url, record.manifest_sha256,
        payload={"alias": alias, "moved_by": record.moved_by, "forced": record.forced, "overridden": record.overridden,
                 "previous": record.previous.model_dump() if record.previous else None},
        related=[{"prefect.resource.id": f"prefect-executorch.alias.{opened.url}/{name}/{alias}",
                  "prefect.resource.role": "alias", "prefect.resource.name": alias}],
    )
    if record.forced:
        logger.warning("alias %s was forced onto %s %s over: %s", alias, name, version, "; ".join(record.overridden))
    return record
