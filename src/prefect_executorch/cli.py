"""``prefect-executorch``: build, validate, inspect and probe ExecuTorch bundles."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from prefect_executorch.errors import PrefectExecutorchError

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__, pretty_exceptions_enable=False)
console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])
STORE_ENV = "PREFECT_EXECUTORCH_STORE"
DEFAULT_STORE = "./bundles"


def _quiet_defaults() -> None:
    # No telemetry from a build tool, and no surprise network calls in an offline build.
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # A fresh ephemeral database takes longer than Prefect's 20 s default on a small machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def handle_errors(function: F) -> F:
    """Print our typed errors without a traceback and exit 2 (bad input) or 1 (failure)."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except PrefectExecutorchError as exc:
            if os.environ.get("PREFECT_EXECUTORCH_DEBUG"):
                raise
            err_console.print(f"[bold red]{type(exc).__name__}:[/] {exc}", markup=True, highlight=False)
            raise typer.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


@app.callback()
def main(debug: bool = typer.Option(False, "--debug", help="Show tracebacks.")) -> None:
    """Export PyTorch models to ExecuTorch, validate them against eager PyTorch, publish bundles."""
    _quiet_defaults()
    if debug:
        os.environ["PREFECT_EXECUTORCH_DEBUG"] = "1"


@app.command()
@handle_errors
def build(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="Build spec (YAML or JSON)."),
    store: str = typer.Option(DEFAULT_STORE, "--store", envvar=STORE_ENV, help="Directory or s3://bucket/prefix."),
    output: Optional[Path] = typer.Option(None, "--output", help="Keep export directories here (default: temporary)."),
) -> None:
    """Export, validate and publish one bundle (ephemeral Prefect unless a server is configured)."""
    from prefect_executorch.spec import load_spec

    spec = load_spec(spec_path)
    spec.check_model_reference()
    from prefect_executorch.flows.build import build_bundle

    ref = build_bundle(spec, store=store, output=str(output) if output else None)
    from prefect_executorch.artifacts.registry import read_manifest
    from prefect_executorch.artifacts.store import open_store

    manifest, _ = read_manifest(open_store(store), ref.key)
    console.print(f"[bold green]published[/] {ref.key.prefix} to {ref.store}")
    console.print(f"manifest sha256 {ref.manifest_sha256}")
    for method, delegates in manifest.delegates().items():
        console.print(f"  {method}: delegates {delegates or '[] (portable kernels)'}")
    console.print(f"validation: {manifest.validation.cases} cases passed; worst: {manifest.validation.worst}")


def _rows_table(title: str, rows: list[Any]) -> Table:
    from rich.text import Text

    from prefect_executorch.artifacts.reports import cell

    table = Table(title=title)
    columns = list(type(rows[0]).model_fields) if rows else []
    for column in columns:
        table.add_column(column.replace("_", " "))
    for row in rows:
        values = [cell(getattr(row, column), column) for column in columns]
        table.add_row(*(Text(v, style="red" if v.startswith("FAIL") else "green" if v == "pass" else "") for v in values))
    return table


def print_report(report: Any) -> None:
    """The validation report as rich tables: methods, method x shape, gates and the worst output."""
    console.print(_rows_table("program vs eager PyTorch, per method", report.method_rows()))
    console.print(_rows_table("per method x shape (worst over samples and outputs)", report.shape_rows()))
    for gate in report.gates:
        console.print(f"[{'green]pass' if gate.passed else 'red]FAIL'}[/] {escape(gate.describe())}")
    console.print(f"worst: {escape(report.describe_worst() or '-')}")


def _revalidation_notes(spec: Any, manifest: Any) -> None:
    if manifest.spec_sha256 != spec.sha256():
        console.print(f"note: the spec differs from the one that built {manifest.key.prefix}")
    if spec.weights and manifest.weights_sha256:
        from prefect_executorch.hashing import sha256_file

        if sha256_file(spec.weights) != manifest.weights_sha256:
            console.print(f"note: the weights differ from those {manifest.key.prefix} was built from")


@app.command()
@handle_errors
def validate(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="Build spec (YAML or JSON)."),
    bundle_dir: Optional[Path] = typer.Argument(None, help="Directory with model.pte (a pulled bundle or an export)."),
    bundle: Optional[str] = typer.Option(
        None, "--bundle", help="A published bundle: <store-url-or-dir>/<name>/<version>/<target>/<compat>/manifest.json; "
        "pulled, verified, then re-validated against the current eager model.",
    ),
    output: Optional[Path] = typer.Option(None, "--output", help="Pull --bundle under this directory (default: temporary)."),
    report_path: Optional[Path] = typer.Option(None, "--report", help="Also write the report as JSON to this file."),
) -> None:
    """Run a program and the eager model on the same inputs; exit 1 on a mismatch or a failed gate."""
    import shutil
    import tempfile
    import uuid

    from prefect_executorch.errors import SpecError
    from prefect_executorch.spec import load_spec
    from prefect_executorch.validator import require_passed, validate_program

    if (bundle_dir is None) == (bundle is None):
        raise SpecError("validate: give either BUNDLE_DIR or --bundle <.../manifest.json>, not both or neither")
    spec = load_spec(spec_path)
    spec.check_model_reference()
    root = output or Path(tempfile.mkdtemp(prefix="prefect-executorch-validate-"))
    try:
        if bundle is not None:
            from prefect_executorch.artifacts.locate import parse_manifest_url
            from prefect_executorch.artifacts.registry import pull
            from prefect_executorch.artifacts.store import open_store

            store, key = parse_manifest_url(bundle)
            bundle_dir = root / f"{key.prefix.replace('/', '-')}-{uuid.uuid4().hex[:8]}"
            manifest = pull(open_store(store), key, bundle_dir)
            console.print(f"pulled and verified {key.prefix} ({len(manifest.files)} files) into {bundle_dir}")
            _revalidation_notes(spec, manifest)
            data_files, delegation = manifest.data_files, manifest.delegation()
        else:
            from prefect_executorch.artifacts.registry import local_bundle

            assert bundle_dir is not None
            data_files, delegation = local_bundle(bundle_dir)
        report = validate_program(spec, bundle_dir, data_files, scratch_dir=root, delegation=delegation)
        if report_path is not None:
            report_path.write_text(report.model_dump_json(indent=2))
        print_report(report)
        require_passed(report)
    finally:
        if output is None:
            shutil.rmtree(root, ignore_errors=True)
    console.print("[bold green]validation passed[/]")


@app.command()
@handle_errors
def inspect(bundle_dir: Path = typer.Argument(..., help="A bundle directory (with manifest.json) or an export.")) -> None:
    """Show a bundle's manifest, verify its files and list the delegates read from the program."""
    from prefect_executorch.artifacts.registry import verify_bundle_dir
    from prefect_executorch.program import read_program

    manifest = verify_bundle_dir(bundle_dir)
    facts = read_program(bundle_dir / manifest.program)
    console.print_json(manifest.model_dump_json())
    console.print(f"[bold green]all {len(manifest.files)} files match the manifest[/]")
    for name, method in facts.items():
        console.print(f"  {name}: delegates {method.delegates}, {method.kernel_calls} portable kernel calls")


@app.command()
@handle_errors
def probe(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show what this machine can build: versions, CUDA channel, GPUs, OS and arch."""
    from prefect_executorch.toolchain import probe as run_probe

    toolchain = run_probe()
    if as_json:
        sys.stdout.write(toolchain.model_dump_json(indent=2) + "\n")
        return
    table = Table(title="toolchain", show_header=False)
    for key, value in toolchain.model_dump().items():
        table.add_row(key, str(value))
    console.print(table)
