"""Prefect artifacts for validation reports (keys slugified to ``^[a-z0-9-]*$``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from prefect_executorch.errors import PromotionRefused
from prefect_executorch.spec.buildspec import ModelCard
from prefect_executorch.validate.report import ValidationReport
from prefect_executorch.validate.triage import TriageReport

if TYPE_CHECKING:
    from prefect_executorch.artifacts.aliases import AliasRecord
    from prefect_executorch.artifacts.manifest import BundleKey
    from prefect_executorch.artifacts.publishing import BundleRef


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key from free text: lowercase letters, digits and dashes only."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower())).strip("-")[:100]


def cell(value: Any, column: str = "") -> str:
    """A table cell: floats to three significant digits (cosines to six decimals), None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if column == "regression":
            return f"{value:+.0%}"
        return f"{value:.6f}" if column.endswith("cosine") else f"{value:.3g}"
    return str(value)


def format_row(values: dict[str, Any]) -> dict[str, str]:
    """A table row's cells formatted, the verdict column (``result``) first: visible without scrolling.

    An empty cell stays empty: Prefect's UI renders a cell of "-" as a list bullet.
    """
    cells = {column.replace("_", " "): "" if value is None else cell(value, column) for column, value in values.items()}
    verdict = cells.pop("result", None)
    return {"result": verdict, **cells} if verdict is not None else cells


def table_rows(rows: Sequence[BaseModel]) -> list[dict[str, str]]:
    """Rows for a Prefect table artifact, each ``format_row``'d."""
    return [format_row({column: getattr(row, column) for column in type(row).model_fields}) for row in rows]


def _markdown_table(rows: list[BaseModel]) -> list[str]:
    if not rows:
        return []
    columns = list(type(rows[0]).model_fields)
    lines = ["| " + " | ".join(c.replace("_", " ") for c in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(cell(getattr(row, c), c).replace("|", "\\|") for c in columns) + " |")
    return lines


def card_markdown(card: ModelCard) -> list[str]:
    """The model card as a markdown section."""
    fields = [("License", card.license), ("Intended use", card.intended_use), ("Limitations", card.limitations)]
    return ["## Model card", "", card.description, ""] + [f"- **{label}:** {value}" for label, value in fields if value]


def validation_markdown(title: str, report: ValidationReport, card: ModelCard | None = None) -> str:
    """The model card, the program facts per method, a table per method x shape, the gates and the worst output."""
    lines = [f"# Validation: {title}", "", f"**{'PASSED' if report.passed else 'FAILED'}**, "
             f"{len(report.cases)} cases, program loaded in {report.load_seconds:.2f} s, "
             f"{'with' if report.used_data_file else 'without'} a .ptd", ""]
    lines += card_markdown(card) + [""] if card else []
    lines += ["## Methods", ""]
    lines += _markdown_table(list(report.method_rows()))
    lines += ["", "## Method x shape", ""]
    lines += _markdown_table(list(report.shape_rows()))
    if report.gates:
        lines += ["", "## Gates", ""]
        lines += [f"- {'pass' if gate.passed else '**FAIL**'}: {gate.describe()}" for gate in report.gates]
    worst = report.describe_worst()
    if worst:
        lines += ["", f"Worst: {worst}"]
    return "\n".join(lines)


def publish_validation_artifacts(title: str, key: str, report: ValidationReport, card: ModelCard | None = None) -> None:
    """Attach the markdown report (with the model card) and a table (one row per method x shape) to the current run.

    ``key`` names the model and target, not the version: an artifact's history is then that model's builds.
    """
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    verdict = "PASSED" if report.passed else "FAILED"
    create_markdown_artifact(
        key=artifact_key("validation", key),
        markdown=validation_markdown(title, report, card),
        description=f"{verdict}: validation of {title} against eager PyTorch",
    )
    create_table_artifact(
        key=artifact_key("validation-table", key),
        table=table_rows(list(report.shape_rows())),
        description=f"{verdict}: validation of {title}, worst error per method x shape",
    )


def publish_triage_artifact(title: str, key: str, triage: TriageReport) -> None:
    """Attach the triage of a failed validation: a table of its first and worst operators, or why it was skipped."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    key = artifact_key("triage", key)
    if triage.rows():
        create_table_artifact(key=key, table=table_rows(list(triage.rows())), description=triage.describe())
    else:
        create_markdown_artifact(key=key, markdown=f"# Triage: {title}\n\n{triage.describe()}",
                                 description=f"Triage of {title}: none")


def promotion_key(name: str, alias: str) -> str:
    """Key of a model's promotions to one alias: the artifact's history is that alias's moves and refusals."""
    return artifact_key("promotion", name, alias)


def publish_promotion_artifact(record: AliasRecord) -> None:
    """Attach the side-by-side comparison of a promotion (one row per method) to the current Prefect run."""
    from prefect.artifacts import create_table_artifact

    if record.comparison is None:
        return
    previous = record.previous
    was = f"{previous.version} {previous.target}/{previous.compat}" if previous else "nothing"
    forced = f"; FORCED by {record.moved_by} over: {'; '.join(record.overridden)}" if record.forced else ""
    create_table_artifact(
        key=promotion_key(record.name, record.alias),
        table=table_rows(record.comparison.rows()),
        description=f"MOVED {record.alias}: {record.version} {record.target}/{record.compat} beside {was}{forced}",
    )


def publish_refusal_artifact(name: str, alias: str, refused: PromotionRefused) -> None:
    """A refused promotion, recorded under the same key as the moves: the comparison and why it was refused."""
    from prefect.artifacts import create_table_artifact

    create_table_artifact(
        key=promotion_key(name, alias),
        table=[format_row(row) for row in refused.comparison],
        description=f"REFUSED {alias}: {refused}",
    )


def bundle_markdown(ref: BundleRef, how: str) -> str:
    """Where a bundle is, as text to copy: a store's path or ``s3://`` URL opens in no browser, so no link."""
    key = ref.key
    return "\n".join([
        f"**{key.name} {key.version} {key.target}/{key.compat}**: {how}",
        "",
        f"- **manifest:** `{manifest_location(ref)}`",
        f"- **manifest sha256:** `{ref.manifest_sha256}`",
        f"- **pull:** `prefect-executorch pull {key.name} --version {key.version} --target {key.target} "
        f"--compat {key.compat} --store {ref.store} --to ./{key.name}-{key.version}`",
    ])


def manifest_location(ref: BundleRef) -> str:
    """The manifest's path or URL in its store."""
    return f"{ref.store.rstrip('/')}/{ref.manifest_key}"


def publish_bundle_link(ref: BundleRef, how: str) -> None:
    """Where the bundle is, on the current run, keyed per model and target: its history is their builds."""
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(
        key=artifact_key("bundle", ref.key.name, ref.key.target),
        markdown=bundle_markdown(ref, how),
        description=f"{how}; manifest sha256 {ref.manifest_sha256}",
    )


def build_summary_markdown(ref: BundleRef, report: ValidationReport, export_seconds: float) -> str:
    """One build on one page, the verdict first: the bundle, where it runs, its validation and what was delegated."""
    key = ref.key
    delegated = ", ".join(f"{method} {'unknown' if share is None else f'{share:.0%}'}"
                          for method, share in report.summary().delegated_fraction.items()) or "-"
    return "\n".join([
        f"# {key.name} {key.version} {key.target}: {'PUBLISHED' if report.passed else 'FAILED'}",
        "",
        f"- **bundle:** `{manifest_location(ref)}`",
        f"- **runs on:** `{key.compat}`",
        f"- **validation:** {'passed' if report.passed else 'FAILED'}, {len(report.cases)} cases; worst: "
        f"{report.describe_worst() or '-'}",
        f"- **delegated:** {delegated}",
        f"- **export:** {export_seconds:.1f} s; program loaded in {report.load_seconds:.2f} s",
        f"- **manifest sha256:** `{ref.manifest_sha256}`",
    ])


def publish_failure_summary(key: BundleKey, stage: str, exc: Exception, child_output: str | None) -> None:
    """A failed build's summary, under the key a published one's takes: what failed, why, where its child's output is."""
    from prefect.artifacts import create_markdown_artifact

    lines = [f"# {key.name} {key.version} {key.target}: FAILED at {stage}", "", "Nothing was published.", "",
             f"- **{type(exc).__name__}:** {exc}"]
    if child_output:
        lines.append(f"- **the child process's output:** artifact `{child_output}`")
    create_markdown_artifact(key=artifact_key("build", key.name, key.target), markdown="\n".join(lines),
                             description=f"FAILED at {stage}: {key.name} {key.version} {key.target}/{key.compat}")


def publish_build_summary(ref: BundleRef, report: ValidationReport, export_seconds: float) -> None:
    """The build's summary on its run, keyed per model and target (the artifact's history is their builds)."""
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(
        key=artifact_key("build", ref.key.name, ref.key.target),
        markdown=build_summary_markdown(ref, report, export_seconds),
        description=f"{'PUBLISHED' if report.passed else 'FAILED'}: {ref.key.name} {ref.key.version} "
                    f"{ref.key.target}/{ref.key.compat}",
    )
