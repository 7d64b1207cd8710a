"""``promote``: move an alias (staging, prod) to a validated bundle, compare-and-swap."""

from __future__ import annotations

from prefect import flow
from prefect.blocks.core import Block

from prefect_executorch.artifacts.aliases import AliasRecord
from prefect_executorch.tasks.promote import promote_alias


@flow(name="promote-bundle", flow_run_name="promote-{name}-{version}-to-{alias}")
def promote(
    name: str,
    version: str,
    alias: str,
    store: str | Block,
    target: str | None = None,
    compat: str | None = None,
    force: bool = False,
) -> AliasRecord:
    """Point ``alias`` of ``name`` at ``version`` (one bundle, narrowed by ``target``/``compat``) in ``store``."""
    return promote_alias(store, name, version, alias, target=target, compat=compat, force=force)
