"""Prefect artifacts for validation reports (keys slugified to ``^[a-z0-9-]*$``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from prefect_executorch.spec.buildspec import ModelCard
from prefect_executorch.validate.report import ValidationReport
from prefect_executorch.validate.triage import TriageReport

if TYPE_CHECKING:
    from prefect_executorch.artifacts.aliases import AliasRecord


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


def publish_validation_artifacts(title: str, report: ValidationReport, card: ModelCard | None = None) -> None:
    """Attach the markdown report (with the model card) and a table (one row per method x shape) to the current run."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    create_markdown_artifact(
        key=artifact_key("validation", title),
        markdown=validation_markdown(title, report, card),
        description=f"Validation of {title} against eager PyTorch",
    )
    create_table_artifact(
        key=artifact_key("validation-table", title),
        table=[row.model_dump() for row in report.shape_rows()],
        description=f"Validation of {title}: worst error per method x shape",
    )


def publish_triage_artifact(title: str, triage: TriageReport) -> None:
    """Attach the triage of a failed validation: a table of its first and worst operators, or why it was skipped."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    key = artifact_key("triage", title)
    if triage.rows():
        create_table_artifact(key=key, table=[row.model_dump() for row in triage.rows()], description=triage.describe())
    else:
        create_markdown_artifact(key=key, markdown=f"# Triage: {title}\n\n{triage.describe()}",
                                 description=f"Triage of {title}: none")


def publish_promotion_artifact(title: str, record: AliasRecord) -> None:
    """Attach the side-by-side comparison of a promotion (one row per method) to the current Prefect run."""
    from prefect.artifacts import create_table_artifact

    if record.comparison is None:
        return
    previous = record.previous
    was = f"{previous.version} {previous.target}/{previous.compat}" if previous else "nothing"
    forced = f"; FORCED by {record.moved_by} over: {'; '.join(record.overridden)}" if record.forced else ""
    create_table_artifact(
        key=artifact_key("promotion", title),
        table=[row.model_dump() for row in record.comparison.rows()],
        description=f"{record.alias}: {record.version} {record.target}/{record.compat} beside {was}{forced}",
    )
