"""``revalidate``: pull a published bundle and re-run it against the current eager model (drift check)."""

from __future__ import annotations

from pathlib import Path

from prefect_executorch.fleet.server import api_checked_flow
from prefect_executorch.scratch import scratch_dir
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.tasks.probe import check_buildable, probe_toolchain
from prefect_executorch.tasks.pull import pull_published
from prefect_executorch.tasks.validate import validate_pulled
from prefect_executorch.validate.report import ValidationReport


@api_checked_flow(name="revalidate-bundle", flow_run_name="revalidate-{name}-{alias_or_version}")
def revalidate(
    name: str, alias_or_version: str, store: str, spec: BuildSpec, output: str | None = None
) -> ValidationReport:
    """Validate the bundle ``name`` at a version or alias in ``store`` against ``spec``'s current eager model.

    A published version wins over an alias of the same name; of its bundles, the one of the spec's
    target that best fits this worker is pulled (and verified, pinned by the alias if any) under
    ``output``, or a temporary directory removed when the flow ends. A failed case or gate fails the run.
    """
    with scratch_dir("revalidate", Path(output) if output else None) as output_root:
        toolchain = probe_toolchain()
        check_buildable(spec, toolchain)
        manifest, bundle_dir = pull_published(store, name, alias_or_version, spec.target_name, toolchain, output_root)
        return validate_pulled(spec, manifest, bundle_dir, output_root)
