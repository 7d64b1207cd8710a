"""``retrain``: new weights -> build matrix -> promote every bundle to an alias once all validated."""

from __future__ import annotations

from pathlib import Path

from prefect_executorch.artifacts.aliases import AliasRecord
from prefect_executorch.artifacts.promotion import PromotionRequest
from prefect_executorch.defaults import MAX_LATENCY_REGRESSION
from prefect_executorch.fleet.placement import MatrixCell
from prefect_executorch.fleet.retrain_event import parse_request, promotion_aliases
from prefect_executorch.fleet.server import api_checked_flow
from prefect_executorch.flows.matrix import build_matrix
from prefect_executorch.scratch import scratch_dir
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.tasks.dispatch import QUEUE_WAIT_S, MissingPoolPolicy
from prefect_executorch.tasks.promote import promote_alias
from prefect_executorch.tasks.weights import fetch_weights


@api_checked_flow(name="retrain", flow_run_name="retrain-{name}")
def retrain(
    name: str,
    weights_uri: str,
    spec: BuildSpec,
    targets: list[MatrixCell],
    store: str,
    version: str | None = None,
    weights_sha256: str | None = None,
    alias: str = "staging",
    output: str | None = None,
    training_run: str | None = None,
    on_missing_pool: MissingPoolPolicy = "wait",
    queue_wait_s: float = QUEUE_WAIT_S,
    max_latency_regression: float = MAX_LATENCY_REGRESSION,
) -> list[AliasRecord]:
    """Fetch ``weights_uri``, build ``spec`` with it for every target, then move ``alias`` to the new bundles.

    The parameters are the ``model.retrain.requested`` payload (see ``prefect_executorch.fleet.retrain_event``)
    plus the deployment's spec, targets and store. The version defaults to
    ``<spec version>-<sha256[:12]>`` of the weights, so a repeated request rebuilds nothing.
    Nothing is promoted unless every build validated and published; each bundle moves
    ``<alias>-<compat>`` (an alias points at one bundle). ``on_missing_pool`` and
    ``queue_wait_s`` go to the matrix: with ``skip``, the cells no live worker can take are left out
    (recorded with the reason) and the bundles built are promoted. ``max_latency_regression`` gates each move as
    ``promote``'s does (new weights change the outputs by design: only latency is gated).
    """
    request = parse_request({"name": name, "weights_uri": weights_uri, "version": version, "weights_sha256": weights_sha256,
                             "training_run": training_run})
    request.check_spec(spec)
    with scratch_dir("retrain", Path(output) if output else None) as work_dir:
        # Fetched here first: a bad URI or checksum fails before any worker is busy, and the
        # weights' hash fixes the version every build publishes under.
        fetched = fetch_weights(request.weights_uri, work_dir, request.weights_sha256)
        versioned = fetched.apply(spec, request.version or fetched.default_version(spec))
        refs = build_matrix(versioned, targets, store, weights_uri=request.weights_uri,
                            weights_sha256=fetched.sha256, output=output, training_run=request.training_run,
                            on_missing_pool=on_missing_pool, queue_wait_s=queue_wait_s)
    return [
        promote_alias(store, PromotionRequest(name=key.name, version=key.version, alias=name_of_alias, target=key.target,
                                              compat=key.compat, allow_output_change=True, validation=spec.validation,
                                              max_latency_regression=max_latency_regression))
        for name_of_alias, key in promotion_aliases(alias, [ref.key for ref in refs])
    ]
