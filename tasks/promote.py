"""Move an alias to a validated bundle with compare-and-swap."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefect import get_run_logger, task

from prefect_executorch.artifacts.aliases import AliasRecord, promote
from prefect_executorch.artifacts.store import open_store

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
) -> AliasRecord:
    """Point ``alias`` at ``name`` ``version``; a lost race or an unvalidated bundle fails the task."""
    record = promote(open_store(store), name, version, alias, target=target, compat=compat, force=force,
                     expect_version=expect_version)
    logger = get_run_logger()
    logger.info("%s%s", record.describe(), f" (was {record.previous.version})" if record.previous else "")
    if record.forced:
        logger.warning("alias %s was forced onto %s %s although its validation did not pass", alias, name, version)
    return record
