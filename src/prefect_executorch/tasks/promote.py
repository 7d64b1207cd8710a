"""Move an alias to a validated bundle that agrees with, and is no slower than, what the alias serves now."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect import get_run_logger, task

from prefect_executorch.artifacts.aliases import AliasRecord
from prefect_executorch.artifacts.promotion import PromotionRequest, promote_checked
from prefect_executorch.artifacts.urls import open_store
from prefect_executorch.errors import PromotionRefused
from prefect_executorch.scratch import scratch_dir
from prefect_executorch.tasks.assets import record_alias
from prefect_executorch.tasks.events import emit_promoted
from prefect_executorch.tasks.prefect_artifacts import publish_promotion_artifact, publish_refusal_artifact

if TYPE_CHECKING:
    from prefect.blocks.core import Block


@task(name="promote-alias", task_run_name="promote-{request.name}-{request.version}-to-{request.alias}")
def promote_alias(store: str | Block, request: PromotionRequest) -> AliasRecord:
    """Move the alias; a lost race, an unvalidated bundle or a failed side-by-side (unless forced) fails the task."""
    opened = open_store(store)
    name, version, alias = request.name, request.version, request.alias
    with scratch_dir("promote") as scratch:
        try:
            promotion = promote_checked(opened, request, scratch_dir=scratch)
        except PromotionRefused as refused:
            publish_refusal_artifact(name, alias, refused)
            raise
    logger, record = get_run_logger(), promotion.record
    if not promotion.moved:
        # Already there (an automation and a retrain may both ask): nothing moved, so no event says it did.
        logger.info("%s already: nothing moved", record.describe())
        return record
    logger.info("%s%s", record.describe(), f" (was {record.previous.version})" if record.previous else "")
    publish_promotion_artifact(record)
    emit_promoted(record, opened.url)
    if record.forced:
        logger.warning("alias %s was forced onto %s %s over: %s", alias, name, version, "; ".join(record.overridden))
    record_alias(opened.url, alias, record.bundle_key())
    return record
