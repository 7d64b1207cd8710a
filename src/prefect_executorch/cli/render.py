"""How the commands print what they report: the live stage view, the build summary, narrow tables."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from prefect_executorch.cli.app import console, err_console
from prefect_executorch.spec.asr import SPEECH_METADATA, WAVEFORM_STEP_METHOD
from prefect_executorch.spec.llm import RUNNER_METADATA

#: Constant methods of LLM and speech programs: what their consumers read, no computation to list.
METADATA_METHODS = frozenset(RUNNER_METADATA) | frozenset(SPEECH_METADATA) | {WAVEFORM_STEP_METHOD}


class LiveView:
    """probe -> start -> export -> validate -> publish with elapsed times, live on a terminal (``screen``, stderr by
    default); the times are kept for the summary."""

    def __init__(self, debug: bool, screen: Console = err_console) -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.seconds: dict[str, float] = {}
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                  console=screen, disable=not screen.is_terminal or debug)
        self._rows: dict[str, Any] = {}

    def __enter__(self) -> LiveView:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def on_stage(self, name: str, event: str, seconds: float) -> None:
        """Start a row for a stage, or end it as done, failed or stopped; each stage shows once, in order."""
        if event == "start":
            if name not in self._rows:  # the flow probes again after the CLI did: its row stays as it is
                self._rows[name] = self._progress.add_task(name, total=1)
            return
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        mark = {"done": "[green]done[/]", "stopped": "[yellow]stopped[/]"}.get(event, "[red]failed[/]")
        self._progress.update(self._rows[name], completed=1, description=f"{name} {mark}")


def count_names(names: list[str]) -> str:
    """``XnnpackBackend × 22, VulkanBackend × 1`` in first-seen order; ``none`` for an empty list."""
    from collections import Counter

    return ", ".join(f"{name} × {count}" for name, count in Counter(names).items()) or "none"


def worst_per_method(store: Any, key: Any) -> dict[str, float]:
    """Largest absolute error of each method over its cases, from the bundle's validation.json."""
    from prefect_executorch.artifacts.manifest import VALIDATION_FILE
    from prefect_executorch.validate.report import ValidationReport

    data, _ = store.get_bytes(key.key(VALIDATION_FILE))
    worst: dict[str, float] = {}
    for case in ValidationReport.model_validate_json(data).cases:
        for output in case.outputs:
            worst[case.method] = max(worst.get(case.method, 0.0), output.max_abs)
    return worst


def generated_by(manifest: Any) -> str:
    """What ran a decoder-LM bundle's program at validation (bundles made before it was recorded: the LLM runner)."""
    return manifest.validation.generated_by or "ExecuTorch's LLM runner"


#: Whether a bundle carries a signature, as the build summary and ``inspect`` say it.
SIGNED = "signed: model.sig (pulls verify it where PREFECT_EXECUTORCH_SIGNING_PUBLIC_KEY is set)"
UNSIGNED = "unsigned: no model.sig (set PREFECT_EXECUTORCH_SIGNING_KEY and build it again to sign it)"


def print_build_summary(ref: Any, seconds: dict[str, float]) -> None:
    """Where the bundle is, what it runs on and how it validated; fresh build or cache hit; each stage's time."""
    from prefect_executorch.artifacts.publishing import is_signed, read_manifest
    from prefect_executorch.artifacts.urls import open_store
    store = open_store(ref.store)
    manifest, _ = read_manifest(store, ref.key)
    worst = worst_per_method(store, ref.key)
    how = "[bold cyan]cache hit[/] (unchanged rebuild, nothing exported)" if ref.cache_hit else "[bold green]fresh build[/]"
    console.print(f"{how}: {ref.key.prefix} in {ref.store}")
    console.print(f"compat {manifest.compat}; manifest sha256 {ref.manifest_sha256}")
    fractions = manifest.validation.delegated_fraction
    for method, delegates in manifest.delegates().items():
        if method in METADATA_METHODS:
            continue
        fraction = fractions.get(method)
        share = f", {fraction:.0%} of operators delegated" if fraction is not None else ""
        error = f"; worst max abs error {worst[method]:.3g}" if method in worst else ""
        console.print(f"  {method}: delegates {count_names(delegates)}{share}{error}")
    if manifest.validation.generation_agreement is not None:
        console.print(f"validation through {generated_by(manifest)}: {escape(manifest.validation.worst or '-')}")
    else:
        console.print(f"validation: {manifest.validation.cases} cases passed; worst: "
                      f"{escape(manifest.validation.worst or '-')}")
    console.print(SIGNED if is_signed(store, ref) else UNSIGNED)
    console.print("stages: " + ", ".join(f"{name} {value:.1f} s" for name, value in seconds.items()))


#: The columns a terminal table shows per row type (field, header), narrow enough for 80 columns; the rest of
#: each row goes under the table (``_BELOW``) or, whole, to ``--json``.
_COLUMNS: dict[str, list[tuple[str, str]]] = {
    "MethodRow": [("method", "method"), ("delegated", "delegated"), ("eager_median_ms", "eager p50 ms"),
                  ("program_median_ms", "program p50 ms"), ("latency_ratio", "ratio"), ("first_call_ms", "1st call ms")],
    "ShapeRow": [("method", "method"), ("shape", "shape"), ("result", "result"), ("cases", "cases"),
                 ("failed", "failed"), ("max_abs", "max abs err"), ("min_cosine", "min cosine")],
    "ComparisonRow": [("method", "method"), ("inputs", "inputs"), ("disagreeing", "differ"),
                      ("current_p50_ms", "now ms"), ("candidate_p50_ms", "new ms"), ("regression", "p50"),
                      ("stable", "stable")],
}


_BELOW: dict[str, tuple[str, str]] = {"MethodRow": ("delegates", "delegates"), "ShapeRow": ("input_shapes", "inputs"),
                                      "ComparisonRow": ("worst", "worst")}


def rows_table(title: str, rows: list[Any]) -> Table:
    """``rows`` as a narrow table; each row's long field follows it as a line of its own."""
    from rich import box
    from rich.text import Text

    from prefect_executorch.tasks.prefect_artifacts import cell

    kind = type(rows[0]).__name__ if rows else ""
    columns = _COLUMNS.get(kind) or [(name, name.replace("_", " ")) for name in (type(rows[0]).model_fields if rows else [])]
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 2, 0, 0),
                  caption_justify="left")
    for _, header in columns:
        table.add_column(header, no_wrap=True)
    below = []
    for row in rows:
        values = [cell(getattr(row, field), field) for field, _ in columns]
        table.add_row(*(Text(v, style="red" if v.startswith("FAIL") else "green" if v == "pass" else "") for v in values))
        if kind in _BELOW:
            field, label = _BELOW[kind]
            below.append(f"{' '.join(values[:2]) if kind == 'ShapeRow' else values[0]} {label}: {getattr(row, field)}")
    table.caption = "\n".join(below) or None
    return table


def print_report(report: Any) -> None:
    """The validation report as narrow tables: methods, method x shape, gates and the worst output."""
    console.print(rows_table("program vs eager PyTorch, per method", report.method_rows()))
    console.print(rows_table("per method x shape (worst over samples and outputs)", report.shape_rows()))
    for gate in report.gates:
        console.print(f"[{'green]pass' if gate.passed else 'red]FAIL'}[/] {escape(gate.describe())}")
    console.print(f"worst: {escape(report.describe_worst() or '-')}")
