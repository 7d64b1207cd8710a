"""Promotion with a side-by-side gate: the candidate must agree with, and be no slower than, what the alias serves.

Both bundles are pulled (every byte verified) into a scratch directory and run in one child
process (``sidebyside``); a latency regression beyond the limit or disagreeing outputs refuse the
move unless forced, and a forced move records what it overrode in the alias and its history.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

from prefect_executorch import scratch
from prefect_executorch.artifacts.aliases import AliasRecord, move_alias, read_alias, select_bundle
from prefect_executorch.artifacts.manifest import BundleKey, Manifest
from prefect_executorch.artifacts.publishing import pull
from prefect_executorch.artifacts.store import ObjectStore
from prefect_executorch.defaults import MAX_LATENCY_REGRESSION
from prefect_executorch.errors import BundleConflict, PromotionRefused
from prefect_executorch.isolation import run_isolated
from prefect_executorch.spec.fields import check_name
from prefect_executorch.spec.methods import MethodSpec
from prefect_executorch.spec.validation import ValidationSpec
from prefect_executorch.targets import get_target
from prefect_executorch.validate.sidebyside import ProgramFiles, SideBySide, SideBySideRequest, merge_apart

#: Default of ``--max-latency-regression``: the candidate's p50 may be at most 10% above the current one's.


def _pulled(store: ObjectStore, key: BundleKey, dest: Path, manifest_sha256: str | None) -> tuple[Manifest, ProgramFiles]:
    manifest = pull(store, key, dest, manifest_sha256=manifest_sha256)
    return manifest, ProgramFiles(dir=str(dest), program=manifest.program, data_files=manifest.data_files,
                                  runtime_hints=manifest.runtime_hints)


def compare_bundles(
    store: ObjectStore, current: AliasRecord, candidate: BundleKey, *, validation: ValidationSpec, scratch_dir: Path
) -> SideBySide:
    """Pull the alias's bundle and the candidate, and run them side by side in one child (two, where the target says so)."""
    scratch_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".side-by-side-", dir=scratch_dir))
    try:
        _, now = _pulled(store, current.bundle_key(), work / "current", current.manifest_sha256)
        manifest, new = _pulled(store, candidate, work / "candidate", None)
        methods = {name: MethodSpec(inputs=entry.inputs) for name, entry in manifest.methods.items() if entry.inputs}
        target = get_target(candidate.target)
        request = SideBySideRequest(current=now, candidate=new, methods=methods, validation=validation,
                                    target=manifest.target,
                                    generation=any(entry.role == "generation" for entry in manifest.files),
                                    speech=any(entry.role == "speech" for entry in manifest.files),
                                    input_device=str(manifest.runtime_hints.get("input_device", "cpu")))

        def run(request: SideBySideRequest) -> SideBySide:
            return run_isolated("side_by_side", request, SideBySide, timeout_s=validation.timeout_s, scratch_dir=work,
                                memory_limit=target.memory_limit("validate", validation.memory_limit_mib),
                                what=f"side-by-side of {candidate.prefix} and {current.describe()}")

        if not target.one_program_per_process:
            return run(request)
        apart = {"reference": str(work / "current-outputs.pt")}
        return merge_apart(run(request.model_copy(update={**apart, "alone": "current"})),
                           run(request.model_copy(update={**apart, "alone": "candidate"})))
    finally:
        shutil.rmtree(work, ignore_errors=True)


class Promotion(BaseModel):
    """What a checked promotion did: the alias record, and whether this call moved it."""

    record: AliasRecord
    moved: bool = Field(description="False when the alias already pointed at the bundle: nothing moved, no event.")


class PromotionRequest(BaseModel):
    """One move of an alias and the gates it must pass."""

    name: str
    version: str
    alias: str
    target: str | None = Field(default=None, description="The bundle's target, if the version has several.")
    compat: str | None = Field(default=None, description="The bundle's compat key, if the version has several.")
    force: bool = Field(default=False, description="Move over a failed validation or side-by-side gate (recorded).")
    expect_version: str | None = Field(default=None, description="Only move the alias if it points at this version.")
    max_latency_regression: float = Field(
        default=MAX_LATENCY_REGRESSION, ge=0, description="Largest allowed candidate p50 / current p50 - 1.")
    allow_output_change: bool = Field(
        default=False, description="New weights: outputs differ by design, so only latency is gated.")
    validation: ValidationSpec = Field(
        default_factory=ValidationSpec, description="Tolerances and latency settings of the side-by-side.")


def promote_checked(
    store: ObjectStore, request: PromotionRequest, *, scratch_dir: Path | None = None, moved_by: str | None = None
) -> Promotion:
    """Move the alias to the version if it agrees with and is no slower than the alias's bundle (or ``force``).

    ``allow_output_change`` is for new weights, whose outputs differ by design: only latency is gated
    then, and the comparison is recorded all the same.
    """
    name, version, alias, expect_version = request.name, request.version, request.alias, request.expect_version
    # Every name is a key segment: an unsafe one is a usage error before the store is read.
    for value, field in ((name, "name"), (version, "version"), (alias, "alias")):
        check_name(value, field)
    key = select_bundle(store, name, version, request.target, request.compat)
    found = read_alias(store, name, alias)
    if found is not None and found[0].bundle_key() == key and expect_version in (None, key.version):
        # Already there: an automation and a retrain may both move it to the same bundle.
        return Promotion(record=found[0], moved=False)
    comparison, overridden = None, []
    if found is not None:
        current = found[0]
        with scratch.scratch_dir("promote", scratch_dir) as work:
            comparison = compare_bundles(store, current, key, validation=request.validation, scratch_dir=work)
        disagreements = [] if request.allow_output_change else comparison.disagreements()
        regressions = comparison.regressions(request.max_latency_regression)
        problems = ([f"outputs disagree with {alias}: {line}" for line in disagreements]
                    + [f"latency regression over {alias}: {line}" for line in regressions])
        if problems and not request.force:
            fixes = (["pass --allow-output-change if its outputs differ by design (new weights, a quantized build; "
                      "latency is still gated)"] if disagreements else [])
            fixes += [f"raise --max-latency-regression (now {request.max_latency_regression:g})"] if regressions else []
            raise PromotionRefused(
                f"{key.prefix} cannot take {alias} from {current.version} {current.target}/{current.compat}: "
                + "; ".join(problems) + f"; fix the candidate, {', '.join(fixes)}, or pass --force "
                "(the alias records what was overridden)",
                comparison=[row.model_dump() for row in comparison.rows()])
        overridden = problems
    # The comparison was made against the alias's bundle of now: move only if nobody moved it meanwhile.
    expect = expect_version or (found[0].version if found is not None else None)
    try:
        record = move_alias(store, name, version, alias, target=key.target, compat=key.compat, force=request.force,
                         expect_version=expect, moved_by=moved_by, comparison=comparison, overridden=overridden)
    except BundleConflict:
        now = read_alias(store, name, alias)
        if now is not None and now[0].bundle_key() == key:
            return Promotion(record=now[0], moved=False)  # a concurrent promotion moved it where we wanted it
        raise
    return Promotion(record=record, moved=True)
