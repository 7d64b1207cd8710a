"""``promote``: move an alias (staging, prod) to a validated bundle, compare-and-swap."""

from __future__ import annotations

from prefect.blocks.core import Block

from prefect_executorch.artifacts.aliases import AliasRecord
from prefect_executorch.artifacts.promotion import PromotionRequest
from prefect_executorch.defaults import MAX_LATENCY_REGRESSION
from prefect_executorch.fleet.server import api_checked_flow
from prefect_executorch.spec.validation import ValidationSpec
from prefect_executorch.tasks.promote import promote_alias


@api_checked_flow(name="promote-bundle", flow_run_name="promote-{name}-{version}-to-{alias}")
def promote(
    name: str,
    version: str,
    alias: str,
    store: str | Block,
    target: str | None = None,
    compat: str | None = None,
    force: bool = False,
    max_latency_regression: float = MAX_LATENCY_REGRESSION,
    allow_output_change: bool = False,
    validation: ValidationSpec | None = None,
    expect_version: str | None = None,
) -> AliasRecord:
    """Point ``alias`` of ``name`` at ``version`` (one bundle, narrowed by ``target``/``compat``) in ``store``.

    A bundle that disagrees with, or is more than ``max_latency_regression`` slower than, the alias's
    bundle (compared at ``validation``'s tolerances) is refused unless ``force``; ``allow_output_change``
    (new weights) gates latency only. With ``expect_version``, the alias moves only if it points at that version now.
    """
    request = PromotionRequest(
        name=name, version=version, alias=alias, target=target, compat=compat, force=force,
        max_latency_regression=max_latency_regression, allow_output_change=allow_output_change,
        validation=validation or ValidationSpec(), expect_version=expect_version)
    return promote_alias(store, request)
