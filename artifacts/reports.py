"""Prefect artifacts for validation reports (keys slugified to ``^[a-z0-9-]*$``)."""

from __future__ import annotations

import re

from prefect_executorch.report import ValidationReport


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key from free text: lowercase letters, digits and dashes only."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower())).strip("-")[:100]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def validation_markdown(title: str, report: ValidationReport) -> str:
    """A markdown table per method x shape: worst error, cosine, pass/fail."""
    lines = [f"# Validation: {title}", "", f"**{'PASSED' if report.passed else 'FAILED'}**, "
             f"{len(report.cases)} cases, program loaded in {report.load_seconds:.2f} s", ""]
    for method, delegates in report.delegates.items():
        lines.append(f"- `{method}` delegates: {delegates or 'none (portable kernels)'}")
    lines += ["", "| method | shape | inputs | sample | output | max abs | max rel | cosine | result |",
              "|---|---|---|---|---|---|---|---|---|"]
    for case in report.cases:
        if case.error:
            lines.append(f"| {case.method} | {case.shape_label} | {case.input_shapes} | {case.sample} | - | - | - | - "
                         f"| FAIL: {case.error.splitlines()[0]} |")
        for out in case.outputs:
            verdict = "pass" if out.passed else f"FAIL: {out.reason}"
            lines.append(f"| {case.method} | {case.shape_label} | {case.input_shapes} | {case.sample} | `{out.path}` "
                         f"| {_fmt(out.max_abs)} | {_fmt(out.max_rel)} | {_fmt(out.cosine)} | {verdict} |")
    worst = report.describe_worst()
    if worst:
        lines += ["", f"Worst: {worst}"]
    return "\n".join(lines)


def publish_validation_artifact(title: str, report: ValidationReport) -> None:
    """Attach the validation table to the current Prefect run."""
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(
        key=artifact_key("validation", title),
        markdown=validation_markdown(title, report),
        description=f"Validation of {title} against eager PyTorch",
    )
