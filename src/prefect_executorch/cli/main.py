"""``prefect-executorch``: build, validate, inspect and probe ExecuTorch bundles."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from prefect_executorch.cli.signals import NOTHING_PUBLISHED, Stop, stopped
from prefect_executorch.errors import Interrupted, NotABundle, PrefectExecutorchError

if TYPE_CHECKING:
    from prefect_executorch.cli.embedded import ApiStart

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__.replace("``", ""), pretty_exceptions_enable=False,
                  # Plain help, wrapped at the terminal, never cut; wide when piped (to a pager, grep or a file).
                  rich_markup_mode=None,
                  context_settings={"max_content_width": 160, "terminal_width": None if sys.stdout.isatty() else 160})
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])
STORE_ENV = "PREFECT_EXECUTORCH_STORE"
DEFAULT_STORE = "./bundles"
DEBUG_ENV = "PREFECT_EXECUTORCH_DEBUG"
_STORE_HELP = f"Directory or s3://bucket/prefix (default: ${STORE_ENV}, else {DEFAULT_STORE})."
_ENDPOINT_HELP = "S3 API endpoint (default: boto3's chain: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, config)."


def _quiet_defaults(prefect_console: bool = False) -> None:
    # Defaults written for Prefect and its children, not our settings: each stays the user's to override.
    # No telemetry from a build tool, and no surprise network calls in an offline build.
    os.environ.setdefault("DO_NOT_TRACK", "1")
    # A fresh ephemeral database takes longer than Prefect's 20 s default on a small machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    if not prefect_console:
        # Prefect's engine logs every failed task's and flow's exception with its traceback (four times over
        # for one failed export), and the ephemeral server logs its own retries; the CLI reports the one error
        # itself, and under --debug its traceback and the child's output, once each. The runs' logs still
        # reach the API. (Prefect reads PREFECT_LOGGING_<path>_<key> overrides of logging.yml.)
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")
        os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "CRITICAL")
    # Library notes (torch's _pytree deprecation, torchao's optional kernels) are no user's business, with
    # --debug too (it is for our tracebacks and the children's output); a worker's terminal is Prefect's own
    # (what it submits, refuses and sees crash), but not theirs either.
    warnings.filterwarnings("ignore")
    logging.getLogger("torchao").setLevel(logging.CRITICAL)
    # Prefect's event and log workers say "Still processing items: 1 items remaining..." while they send their last
    # items as the command exits (loggers named after their classes, printed by Python's last-resort handler).
    for service in ("EventsWorker", "APILogWorker"):
        logging.getLogger(service).addFilter(lambda record: not record.getMessage().startswith("Still processing"))


def _one_message(exc: PrefectExecutorchError) -> str:
    return str(exc) + ("\n(rerun with --debug for the child process's output)" if exc.child_output else "")


def _debug() -> bool:
    from prefect_executorch.errors import InvalidSetting
    from prefect_executorch.settings import get_settings

    try:
        return get_settings().debug
    except InvalidSetting:
        # Asked while reporting an error, possibly this one: report it without a traceback.
        return False


def _store(option: str | None) -> str:
    """``--store``, else the ``store`` setting (``$PREFECT_EXECUTORCH_STORE``, a profile…), else ``./bundles``."""
    if option:
        return option  # without reading the settings, which imports Prefect (~1 s) before the children's start
    from prefect_executorch.settings import get_settings

    return get_settings().store or DEFAULT_STORE


def _start_children() -> None:
    """Start the child-process server now (its imports overlap with ours), its own output kept off the terminal.

    Its imports' notes (cpuinfo, torchao's optional kernels) are quiet with --debug too: each child logs to a
    file of its own, which a failure carries.
    """
    from prefect_executorch.isolation import warm_up

    warm_up(quiet=True)


def _debug_flag(ctx: typer.Context) -> bool:
    """``--debug`` as given: what start-up decides on before the settings (and Prefect with them) are imported."""
    return bool(ctx.find_root().params.get("debug", False))


def handle_errors(function: F) -> F:
    """Print our typed errors without a traceback and exit 2 (bad input) or 1 (failure); 130/143 when stopped."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            try:
                return function(*args, **kwargs)
            except KeyboardInterrupt:
                raise Interrupted(Stop.note()) from None
            except BaseException as exc:
                # A flow run replaces the SIGTERM handler with Prefect's, which raises TerminationSignal instead.
                termination = getattr(sys.modules.get("prefect.exceptions"), "TerminationSignal", None)
                if termination is not None and isinstance(exc, termination):
                    Stop.arm(exc.signal)
                # Whatever fails after a stop fails because of it (a child that died of the same Ctrl-C, a pipe
                # closed under a reader: an EOFError click would print as "Aborted!"): the stop is the one line.
                if Stop.signum is None or isinstance(exc, SystemExit):
                    raise
                raise Interrupted(Stop.note()) from None
        except Interrupted as exc:
            from prefect_executorch.isolation import stop_forkserver

            stop_forkserver()
            err_console.print(f"interrupted: {escape(str(exc))}", highlight=False)
            Stop.said = True
            raise typer.Exit(Stop.exit_code()) from None
        except PrefectExecutorchError as exc:
            if _debug():
                if exc.child_output:
                    err_console.print(f"--- child stderr (tail) ---\n{exc.child_output}", markup=False, highlight=False)
                # The traceback, and the same exit code as without --debug (a script's `if` must not change).
                traceback.print_exception(exc)
                raise typer.Exit(exc.exit_code) from None
            err_console.print(f"[bold red]{type(exc).__name__}:[/] {escape(_one_message(exc))}", markup=True,
                              highlight=False)
            raise typer.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


@app.callback()
def main(ctx: typer.Context, debug: bool = typer.Option(False, "--debug", help="Show tracebacks.")) -> None:
    """Export PyTorch models to ExecuTorch, validate them against eager PyTorch, publish bundles."""
    _quiet_defaults(prefect_console=ctx.invoked_subcommand == "worker")
    if debug:
        # Written, not only kept: the error handler, the flows and child processes read the debug setting.
        os.environ[DEBUG_ENV] = "1"


@app.command()
@handle_errors
def build(
    ctx: typer.Context,
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="Build spec (YAML or JSON)."),
    store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
    output: Path | None = typer.Option(None, "--output", help="Keep export directories here (default: temporary)."),
    endpoint_url: str | None = typer.Option(None, "--endpoint-url", help=_ENDPOINT_HELP),
) -> None:
    """Export, validate and publish one bundle (ephemeral Prefect unless a server is configured)."""
    from prefect_executorch.artifacts.registry import list_bundles
    from prefect_executorch.artifacts.urls import open_store
    from prefect_executorch.machine.probecache import cached_toolchain, probe_cached
    from prefect_executorch.progress import listening, stage
    from prefect_executorch.spec.buildspec import load_spec

    store = _store(store)
    if endpoint_url:
        from prefect_executorch.settings import S3Settings, env_name

        # The flow opens the store itself (in this process): the setting carries the endpoint there.
        os.environ[env_name(S3Settings, "endpoint_url")] = endpoint_url
    spec = load_spec(spec_path)
    spec.check_model_reference()
    view = LiveView(debug=_debug_flag(ctx))
    with view, listening(view.on_stage):
        # An unchanged rebuild with a cached probe answers without the children's and Prefect's start;
        # anything else starts both at once, so that their imports overlap ours and each other.
        with stage("probe"):
            toolchain = cached_toolchain()
        if toolchain is None:
            _start_children()  # the probe runs in one; before an S3 store's settings import Prefect
        opened = open_store(store)
        opened.require(writable=True)  # before anything is exported
        fresh = not list_bundles(opened, spec.name, spec.version)  # so it cannot be a cache hit
        prefect_start = None
        if fresh:
            Stop.note = lambda: _left_by(opened, spec.name, spec.version)
            _start_children()
            prefect_start = _start_prefect()
        try:
            if toolchain is None:
                with stage("probe"):
                    toolchain = probe_cached()
            ref = _published_build(spec, opened, toolchain)
            if ref is not None and _server_configured():
                from prefect_executorch.tasks.events import emit_reused

                emit_reused(ref, "cli")
            if ref is None:
                from prefect_executorch.cli.embedded import embedded_settings
                from prefect_executorch.flows.build import build_bundle

                if prefect_start is None:
                    _start_children()
                    prefect_start = _start_prefect()
                with stage("start"):  # Prefect's API and the build's child processes; the probe alone is quick
                    api = prefect_start.result()
                with embedded_settings(api):
                    ref = build_bundle(spec, store=store, output=str(output) if output else None)
        except BaseException:
            if prefect_start is not None:
                prefect_start.abandon()
            raise
    print_build_summary(ref, view.seconds)


def _left_by(store: Any, name: str, version: str) -> str:
    """What an interrupted fresh build left: publishing is all or nothing (the manifest goes last)."""
    from prefect_executorch.artifacts.registry import list_bundles

    published = list_bundles(store, name, version)
    return f"published {published[0].prefix} before it stopped" if published else NOTHING_PUBLISHED


def _start_prefect() -> ApiStart:
    """Start Prefect's ephemeral API in the background: the largest part of a CLI build's overhead then overlaps
    the probe and the children's imports."""
    # Prefect is imported here, not in the thread: its import runs plugin hooks and loads collections (ours
    # among them) while this thread imports our modules, and two threads importing both at once can meet in
    # Python's import locks ("Failed to initialize plugins: deadlock detected by _ModuleLock(...)"). The
    # children's server is already importing torch, which every later step waits for, so this costs nothing.
    import prefect.settings  # noqa: F401

    from prefect_executorch.cli.embedded import ApiStart

    return ApiStart()


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


def _server_configured() -> bool:
    """Whether ``PREFECT_API_URL`` names a Prefect server: where a command Prefect does not run still emits its event.

    The environment only (what workers and CI set): reading Prefect's profiles would import Prefect into
    the cache-hit path, which answers without it.
    """
    return bool(os.environ.get("PREFECT_API_URL"))


def _published_build(spec: Any, store: Any, toolchain: Any) -> Any:
    """An unchanged rebuild's published bundle, found without starting Prefect; a changed one is refused here."""
    from prefect_executorch.artifacts.rebuild import check_rebuild
    from prefect_executorch.targets import get_target

    target = get_target(spec.target_name)
    for warning in target.check(spec, toolchain):
        err_console.print(f"[yellow]warning:[/] {escape(warning)}")
    return check_rebuild(spec, toolchain, target.compat(spec, toolchain), store).ref


def count_names(names: list[str]) -> str:
    """``XnnpackBackend × 22, VulkanBackend × 1`` in first-seen order; ``none`` for an empty list."""
    from collections import Counter

    return ", ".join(f"{name} × {count}" for name, count in Counter(names).items()) or "none"


def _worst_per_method(store: Any, key: Any) -> dict[str, float]:
    """Largest absolute error of each method over its cases, from the bundle's validation.json."""
    from prefect_executorch.artifacts.manifest import VALIDATION_FILE
    from prefect_executorch.validate.report import ValidationReport

    data, _ = store.get_bytes(key.key(VALIDATION_FILE))
    worst: dict[str, float] = {}
    for case in ValidationReport.model_validate_json(data).cases:
        for output in case.outputs:
            worst[case.method] = max(worst.get(case.method, 0.0), output.max_abs)
    return worst


def print_build_summary(ref: Any, seconds: dict[str, float]) -> None:
    """Where the bundle is, what it runs on and how it validated; fresh build or cache hit; each stage's time."""
    from prefect_executorch.artifacts.registry import read_manifest
    from prefect_executorch.artifacts.urls import open_store
    from prefect_executorch.spec.llm import RUNNER_METADATA

    store = open_store(ref.store)
    manifest, _ = read_manifest(store, ref.key)
    worst = _worst_per_method(store, ref.key)
    how = "[bold cyan]cache hit[/] (unchanged rebuild, nothing exported)" if ref.cache_hit else "[bold green]fresh build[/]"
    console.print(f"{how}: {ref.key.prefix} in {ref.store}")
    console.print(f"compat {manifest.compat}; manifest sha256 {ref.manifest_sha256}")
    fractions = manifest.validation.delegated_fraction
    for method, delegates in manifest.delegates().items():
        if method in RUNNER_METADATA:
            continue
        fraction = fractions.get(method)
        share = f", {fraction:.0%} of operators delegated" if fraction is not None else ""
        error = f"; worst max abs error {worst[method]:.3g}" if method in worst else ""
        console.print(f"  {method}: delegates {count_names(delegates)}{share}{error}")
    if manifest.validation.generation_agreement is not None:
        console.print(f"validation through {_generated_by(manifest)}: {escape(manifest.validation.worst or '-')}")
    else:
        console.print(f"validation: {manifest.validation.cases} cases passed; worst: "
                      f"{escape(manifest.validation.worst or '-')}")
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


def _rows_table(title: str, rows: list[Any]) -> Table:
    """``rows`` as a narrow table; each row's long field follows it as a line of its own."""
    from rich import box
    from rich.text import Text

    from prefect_executorch.artifacts.reports import cell

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


def _same_model(spec: Any, name: str, version: str, where: str) -> None:
    """Refuse to validate a bundle against another model's spec (its inputs and tolerances would not be its own)."""
    from prefect_executorch.errors import SpecError

    if (spec.name, spec.version) != (name, version):
        raise SpecError(f"validate: the spec is {spec.name} {spec.version} but {where} holds {name} {version}; "
                        "validate a bundle with the spec it was built from (a copy with only tolerances changed is fine)")


@app.command()
@handle_errors
def validate(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="Build spec (YAML or JSON)."),
    bundle_dir: Path | None = typer.Argument(None, metavar="BUNDLE_DIR", help="Directory with model.pte (a pulled bundle or an export)."),
    bundle: str | None = typer.Option(
        None, "--bundle", help="A published bundle: <store-url-or-dir>/<name>/<version>/<target>/<compat>/manifest.json; "
        "pulled, verified, then re-validated against the current eager model.",
    ),
    output: Path | None = typer.Option(None, "--output", help="Pull --bundle under this directory (default: temporary)."),
    report_path: Path | None = typer.Option(None, "--report", help="Also write the report as JSON to this file."),
    as_json: bool = typer.Option(False, "--json", help="Print the whole report as JSON instead of the tables."),
) -> None:
    """Run a program and the eager model on the same inputs; exit 1 on a mismatch or a failed gate."""
    from prefect_executorch.errors import SpecError
    from prefect_executorch.scratch import scratch_dir
    from prefect_executorch.spec.buildspec import load_spec
    from prefect_executorch.validate.triage import triage_failure
    from prefect_executorch.validate.validator import require_passed, validate_program

    if (bundle_dir is None) == (bundle is None):
        raise SpecError("validate: give either BUNDLE_DIR or --bundle <.../manifest.json>, not both or neither")
    spec = load_spec(spec_path)
    spec.check_model_reference()
    _start_children()
    with scratch_dir("validate", output) as root:
        if bundle is not None:
            from prefect_executorch.artifacts.locate import parse_manifest_url, pull_fresh
            from prefect_executorch.artifacts.urls import open_store

            store, key = parse_manifest_url(bundle)
            _same_model(spec, key.name, key.version, bundle)
            manifest, bundle_dir = pull_fresh(open_store(store), key, root)
            console.print(f"pulled and verified {key.prefix} ({len(manifest.files)} files) into {bundle_dir}")
            _revalidation_notes(spec, manifest)
            data_files, delegation = manifest.data_files, manifest.delegation()
        else:
            from prefect_executorch.artifacts.registry import local_bundle

            assert bundle_dir is not None
            local, data_files, delegation = local_bundle(bundle_dir)
            if local is not None:
                _same_model(spec, local.name, local.version, str(bundle_dir))
        report = validate_program(spec, bundle_dir, data_files, scratch_dir=root, delegation=delegation)
        if report_path is not None:
            report_path.write_text(report.model_dump_json(indent=2))
        if as_json:
            sys.stdout.write(report.model_dump_json(indent=2) + "\n")
        else:
            print_report(report)
        require_passed(report, triage_failure(spec, report, bundle_dir, data_files, scratch_dir=root))
    if not as_json:
        console.print("[bold green]validation passed[/]")


@app.command()
@handle_errors
def inspect(
    bundle_dir: Path = typer.Argument(..., metavar="BUNDLE_DIR", help="A bundle directory (with manifest.json), e.g. from `pull --to`."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> None:
    """Verify a bundle's files against its manifest and summarize it: key, compat, delegates, validation."""
    from prefect_executorch.artifacts.registry import verify_bundle_dir
    from prefect_executorch.program import read_program
    from prefect_executorch.spec.llm import RUNNER_METADATA

    manifest = verify_bundle_dir(bundle_dir)
    if as_json:
        sys.stdout.write(manifest.model_dump_json(indent=2) + "\n")
        return
    facts = read_program(bundle_dir / manifest.program)
    console.print(f"{manifest.key.prefix}: all {len(manifest.files)} files match the manifest")
    console.print(f"compat {manifest.compat}; built {manifest.created_at:%Y-%m-%d %H:%M}Z by {manifest.builder}")
    fractions = manifest.validation.delegated_fraction
    for name, method in facts.items():
        if name in RUNNER_METADATA:
            continue  # an LLM's metadata for its runner: constants, no computation
        fraction = fractions.get(name)
        share = f", {fraction:.0%} of operators delegated" if fraction is not None else ""
        console.print(f"  {name}: delegates {count_names(method.delegates)}{share}; "
                      f"{method.kernel_calls} portable kernel calls")
    verdict = "passed" if manifest.validation.passed else "[red]FAILED[/]"
    cases = f"prompts through {_generated_by(manifest)}" if manifest.validation.generation_agreement is not None else "cases"
    console.print(f"validation {verdict}: {manifest.validation.cases} {cases}; worst: "
                  f"{escape(manifest.validation.worst or '-')}")


@app.command()
@handle_errors
def verify(
    bundle_dir: Path = typer.Argument(..., metavar="BUNDLE_DIR", help="A bundle directory (with manifest.json and its test cases)."),
    cpp: bool = typer.Option(False, "--cpp", help="Run the cases through ExecuTorch's C++ runtime (a consumer built "
                             "against the installed wheel with CMake, as a C++ service links it) instead of Python's."),
) -> None:
    """Check every file against the manifest, then run the bundle's own test cases on this machine."""
    from prefect_executorch.artifacts.registry import verify_bundle_dir

    manifest = verify_bundle_dir(bundle_dir)
    if not cpp:
        console.print(f"[bold green]{_run_own_cases(bundle_dir, manifest)}[/]")
        return
    from prefect_executorch.validate.cpp_consumer import run_cpp_consumer

    if any(entry.role == "generation" for entry in manifest.files):
        raise NotABundle(f"{bundle_dir} is a decoder-LM bundle: its C++ check needs ExecuTorch's LLM runner library, "
                         "which the ExecuTorch wheel does not ship; verify it without --cpp (the runner's Python "
                         "binding runs the same C++ runner)")
    check = run_cpp_consumer(bundle_dir, manifest)
    for line in check.lines[:-1]:
        console.print(escape(line), highlight=False)
    console.print(f"[bold green]all {check.cases} bundled cases pass through ExecuTorch's C++ runtime[/]")


def _generated_by(manifest: Any) -> str:
    """What ran a decoder-LM bundle's program at validation (bundles made before it was recorded: the LLM runner)."""
    return manifest.validation.generated_by or "ExecuTorch's LLM runner"


def _run_own_cases(bundle_dir: Path, manifest: Any, scratch_dir: Path | None = None, shown_as: Path | None = None) -> str:
    """Run a bundle's own test cases here: a decoder LM's prompts through the LLM runner, else its ``.bpte``.

    One child, so spawned: the forkserver's export imports cost ~4 s more than the runtime's own.
    """
    if any(entry.role == "generation" for entry in manifest.files):
        from prefect_executorch.validate.llm_runner import run_generation_cases

        report = run_generation_cases(bundle_dir, manifest.target, manifest.data_files, scratch_dir=scratch_dir,
                                      shown_as=shown_as, start="spawn")
        return f"all {len(report.cases)} prompts generate eager's tokens through {report.generated_by} on this machine"
    from prefect_executorch.validate.bundled import run_bundled_cases

    check = run_bundled_cases(bundle_dir, manifest.target, manifest.data_files, manifest.bundled,
                              scratch_dir=scratch_dir, shown_as=shown_as, start="spawn")
    return f"all {len(check.results)} bundled cases pass on this machine ({', '.join(sorted({r.method for r in check.results}))})"


@app.command()
@handle_errors
def probe(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show what this machine can build: versions, CUDA channel, GPUs, OS and arch."""
    from prefect_executorch.machine.toolchain import probe_isolated

    _start_children()
    toolchain = probe_isolated()  # in a child: torch's import-time notes stay in its log
    if as_json:
        sys.stdout.write(toolchain.model_dump_json(indent=2) + "\n")
        return
    table = Table(title="toolchain", show_header=False)
    for key, value in toolchain.model_dump().items():
        table.add_row(key, str(value))
    console.print(table)


# --- registry: pull, promote, ls, gc ------------------------------------------------------------



def _open(store: str | None, endpoint_url: str | None) -> Any:
    """The store of a command that reads it (pull, promote, ls, gc): a missing one is named, not shown empty."""
    from prefect_executorch.artifacts.urls import open_store

    opened = open_store(_store(store), endpoint_url=endpoint_url)
    opened.require(writable=False)
    return opened


@app.command()
@handle_errors
def pull(
    name: str = typer.Argument(..., metavar="NAME", help="Model name."),
    to: Path = typer.Option(..., "--to", help="New directory to create with the verified bundle."),
    version: str | None = typer.Option(None, "--version", help="Version to pull."),
    alias: str | None = typer.Option(None, "--alias", help="Alias to pull (prod, staging...)."),
    target: str | None = typer.Option(None, "--target", help="Only bundles of this target."),
    compat: str = typer.Option("auto", "--compat", help="'auto' (fits this machine) or a compat key."),
    store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
    endpoint_url: str | None = typer.Option(None, "--endpoint-url", help=_ENDPOINT_HELP),
    run_cases: bool = typer.Option(False, "--verify", help="Also run the bundle's test cases (model.bpte, an LLM's prompts) here first."),
) -> None:
    """Download a bundle, verify every sha256 and the .pte/.ptd pairing, then move it into place."""
    from prefect_executorch.artifacts import registry
    from prefect_executorch.artifacts.catalog import resolve

    opened = _open(store, endpoint_url)
    resolved = resolve(opened, name, version=version, alias=alias, target=target, compat=compat)
    ran: list[str] = []
    manifest = registry.pull(opened, resolved.key, to, manifest_sha256=resolved.manifest_sha256, check=(
        (lambda staged, got: ran.append(_run_own_cases(staged, got, scratch_dir=to.parent, shown_as=to)))
        if run_cases else None))
    console.print(f"[bold green]pulled[/] {resolved.key.prefix} ({resolved.reason}) into {to}")
    console.print(f"{len(manifest.files)} files verified; program {manifest.program}"
                  + (f" with {', '.join(manifest.data_files)}" if manifest.data_files else "")
                  + "".join(f"; {line}" for line in ran))


@app.command()
@handle_errors
def promote(
    name: str = typer.Argument(..., metavar="NAME", help="Model name."),
    version: str = typer.Argument(..., metavar="VERSION", help="Version to promote."),
    alias: str = typer.Option(..., "--alias", help="Alias to move (prod, staging...)."),
    target: str | None = typer.Option(None, "--target", help="Bundle target, if the version has several."),
    compat: str | None = typer.Option(None, "--compat", help="Bundle compat key, if the version has several."),
    force: bool = typer.Option(
        False, "--force", help="Promote over a failed validation or side-by-side gate (recorded in the alias)."),
    expect_version: str | None = typer.Option(
        None, "--expect-version", help="Only move the alias if it points at this version now."),
    max_latency_regression: float = typer.Option(
        0.10, "--max-latency-regression", min=0.0, help="Refuse a candidate whose p50 is this much slower than the alias's (0.1: 10%)."),
    allow_output_change: bool = typer.Option(
        False, "--allow-output-change", help="New weights: gate latency only (the output comparison is still recorded)."),
    spec_file: Path | None = typer.Option(
        None, "--spec", help="Spec whose validation tolerances and latency settings the side-by-side uses."),
    store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
    endpoint_url: str | None = typer.Option(None, "--endpoint-url", help=_ENDPOINT_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the alias record (with the whole comparison) as JSON."),
) -> None:
    """Point an alias at a validated bundle that agrees with and is no slower than the alias's (compare-and-swap)."""
    from prefect_executorch.artifacts.promotion import PromotionRequest, promote_checked
    from prefect_executorch.spec.buildspec import ValidationSpec, load_spec

    request = PromotionRequest(
        name=name, version=version, alias=alias, target=target, compat=compat, force=force,
        expect_version=expect_version, max_latency_regression=max_latency_regression,
        allow_output_change=allow_output_change, validation=load_spec(spec_file).validation if spec_file else ValidationSpec())
    from prefect_executorch.artifacts.aliases import read_alias

    opened = _open(store, endpoint_url)
    before = read_alias(opened, name, alias)
    record = promote_checked(opened, request)
    if as_json:
        sys.stdout.write(record.model_dump_json(indent=2) + "\n")
        return
    if record.comparison is not None:
        console.print(_rows_table(f"{alias}: {version} beside the bundle it held", record.comparison.rows()))
    if before is not None and before[0] == record:
        console.print(f"already: {record.describe()}; nothing moved")
        return
    previous = record.previous
    was = f" (was {previous.version} {previous.target}/{previous.compat})" if previous else ""
    console.print(f"[bold green]promoted[/] {record.describe()}{was}")
    if _server_configured():
        from prefect_executorch.tasks.events import emit_promoted

        emit_promoted(record, opened.url)
    for line in record.overridden:
        console.print(f"[yellow]forced over:[/] {escape(line)}")


@app.command()
@handle_errors
def generate(
    bundle: str = typer.Argument(..., metavar="BUNDLE", help="A decoder-LM bundle: its folder, or its model name in the store."),
    prompt: str = typer.Argument(..., metavar="PROMPT", help="Text to continue."),
    new_tokens: int = typer.Option(32, "--new-tokens", min=1, help="Tokens to generate at most (greedy)."),
    version: str | None = typer.Option(None, "--version", help="Version to use (with a model name)."),
    alias: str | None = typer.Option(None, "--alias", help="Alias to use (with a model name): prod, staging..."),
    store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
    endpoint_url: str | None = typer.Option(None, "--endpoint-url", help=_ENDPOINT_HELP),
) -> None:
    """Continue PROMPT with a decoder-LM bundle through ExecuTorch's LLM runner; print the text and the runner's speed."""
    from prefect_executorch.artifacts import registry
    from prefect_executorch.artifacts.manifest import MANIFEST_FILE
    from prefect_executorch.scratch import scratch_dir
    from prefect_executorch.validate.llm_runner import generate as run_generate

    with scratch_dir("generate") as scratch:
        # A model name is one path segment; a folder is a path, or the folder of a bundle here.
        if "/" in bundle or (Path(bundle) / MANIFEST_FILE).is_file():
            folder, manifest = Path(bundle), registry.verify_bundle_dir(Path(bundle))
        else:
            from prefect_executorch.artifacts.catalog import resolve

            opened = _open(store, endpoint_url)
            resolved = resolve(opened, bundle, version=version, alias=alias, compat="auto")
            folder = scratch / "bundle"
            manifest = registry.pull(opened, resolved.key, folder, manifest_sha256=resolved.manifest_sha256)
        if not any(entry.role == "generation" for entry in manifest.files):
            raise NotABundle(f"{manifest.key.prefix} is no decoder-LM bundle (it has no tokenizer.json); `generate` "
                             "runs bundles built from an `llm:` spec")
        console.print(escape(prompt), end="", highlight=False)

        def show(text: str) -> None:
            console.print(escape(text), end="", highlight=False)
            console.file.flush()

        generated = run_generate(folder, manifest.target, manifest.data_files, prompt, new_tokens, on_text=show,
                                 start="spawn")
    console.print()
    stats = generated.stats
    speeds = [f"{label} {value:,.0f}{unit}" for label, value, unit in (
        ("prefill", stats.prefill_tokens_per_s, " tokens/s"), ("decode", stats.decode_tokens_per_s, " tokens/s"),
        ("first token", stats.time_to_first_token_ms, " ms")) if value is not None]
    err_console.print(f"{len(generated.pieces)} tokens by {generated.generated_by}; " + ", ".join(speeds), highlight=False)


@app.command("ls")
@handle_errors
def ls_command(
    name: str | None = typer.Argument(None, metavar="NAME", help="Model name (default: list the store's models)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
    endpoint_url: str | None = typer.Option(None, "--endpoint-url", help=_ENDPOINT_HELP),
) -> None:
    """List a model's versions, targets, compat keys and aliases; without NAME, the store's models."""
    from prefect_executorch.artifacts.catalog import ls, models, require_model

    opened = _open(store, endpoint_url)
    if name is None:
        names = models(opened)
        if as_json:
            sys.stdout.write(json.dumps({"store": opened.url, "models": names}, indent=2) + "\n")
            return
        console.print("\n".join(names) if names else f"no published models in {opened.url}")
        return
    require_model(opened, name)
    listing = ls(opened, name)
    if as_json:
        sys.stdout.write(listing.model_dump_json(indent=2) + "\n")
        return
    table = Table(title=f"{name} in {listing.store}")
    for column in ("version", "target", "compat", "aliases"):
        table.add_column(column)
    for key in listing.bundles:
        pointing = [a for a, r in listing.aliases.items() if r.bundle_key() == key]
        table.add_row(key.version, key.target, key.compat, ", ".join(sorted(pointing)))
    console.print(table)
    for record in listing.aliases.values():
        console.print(f"alias {record.describe()}")
    for prefix in listing.incomplete:
        console.print(f"[yellow]incomplete (no manifest):[/] {prefix}")


@app.command("gc")
@handle_errors
def gc_command(
    name: str | None = typer.Argument(None, metavar="NAME", help="Only this model (default: the whole store)."),
    apply: bool = typer.Option(False, "--apply", help="Remove what was found (default: dry run)."),
    grace_hours: float = typer.Option(24.0, "--grace-hours", min=0, help="Leave anything younger than this."),
    store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
    endpoint_url: str | None = typer.Option(None, "--endpoint-url", help=_ENDPOINT_HELP),
) -> None:
    """Find objects of bundles that never got a manifest, and unfinished uploads, older than the grace period."""
    import math
    from datetime import timedelta

    from prefect_executorch.artifacts.gc import gc
    from prefect_executorch.errors import SpecError

    # click's min=0 lets nan through (no comparison with nan is true), and timedelta overflows past ~10^10 h.
    if not math.isfinite(grace_hours) or grace_hours > 24 * 366 * 100:
        raise SpecError(f"--grace-hours: expected a number of hours in [0, {24 * 366 * 100}], got {grace_hours}")
    opened = _open(store, endpoint_url)
    if name is not None:
        from prefect_executorch.artifacts.catalog import require_model

        require_model(opened, name)
    report = gc(opened, name, grace=timedelta(hours=grace_hours), apply=apply)
    verb = "removed" if apply else "would remove"
    for info in report.orphans:
        console.print(f"{verb} {info.key} ({info.size} bytes, {info.last_modified:%Y-%m-%d %H:%M}Z)")
    for upload in report.uploads:
        console.print(f"{verb} unfinished upload of {upload.key} (started {upload.started:%Y-%m-%d %H:%M}Z)")
    console.print(f"{len(report.orphans)} orphaned objects, {len(report.uploads)} unfinished uploads; "
                  f"{report.kept_recent} younger than {grace_hours:g} h kept"
                  + ("" if apply else "; dry run: pass --apply to remove them"))


@app.command()
@handle_errors
def deploy(
    prefect_file: Path = typer.Option(Path("deployments/prefect.yaml"), "--prefect-file", help="The prefect.yaml to deploy."),
    store: str | None = typer.Option(None, "--store",
                                        help="Bundle store the deployments publish to ({{ $PREFECT_EXECUTORCH_STORE }})."),
    name: list[str] = typer.Option([], "--name", help="Deploy only these 'flow/deployment' names (default: all)."),
    project_dir: Path = typer.Option(Path("."), "--project-dir", help="Where runs start (relative model paths resolve here)."),
    automations: Path | None = typer.Option(
        Path("deployments/automations.yaml"), "--automations", help="Automations to apply after the deployments."),
) -> None:
    """Create the work pools and queues the deployments need, `prefect deploy` them, then apply the automations."""
    from prefect_executorch.errors import SpecError
    from prefect_executorch.fleet.deploy import plan_pools, prepare_pools, run_prefect_deploy
    from prefect_executorch.settings import get_settings

    store = store or get_settings().store
    if not store:
        raise SpecError(f"--store: not set; pass --store s3://bucket/prefix (or set {STORE_ENV})")
    # Not a setting read: prefect.yaml's {{ $PREFECT_EXECUTORCH_STORE }} takes the chosen store from `prefect deploy`'s env.
    os.environ[STORE_ENV] = store
    plans = plan_pools(prefect_file)
    for line in prepare_pools(plans):
        console.print(f"created {line}")
    run_prefect_deploy(prefect_file, project_dir, name)
    if automations is not None and automations.exists():
        from prefect_executorch.fleet.automations import apply_automations_file

        for line in apply_automations_file(automations):
            console.print(line)
    elif automations is not None:
        console.print(f"no automations file at {automations}: none applied")
    console.print(f"[bold green]deployed[/] {', '.join(name) if name else 'all deployments of ' + str(prefect_file)}"
                  f" to pools {', '.join(p.name for p in plans)}")


@app.command()
@handle_errors
def worker(
    pool: str = typer.Option(..., "--pool", help="Work pool: gpu-cu130, gpu-cu132, gpu-cu134 or cpu."),
    queue: list[str] = typer.Option([], "--queue", help="Queues to poll (default: all of the pool), e.g. sm90."),
    gpu: int | None = typer.Option(None, "--gpu", help="Pin to this GPU index (one worker per GPU)."),
    name: str | None = typer.Option(None, "--name", help="Worker name (default: host-channel-sm-trt[-gpuN])."),
    limit: int | None = typer.Option(None, "--limit", help="Most concurrent flow runs."),
    run_once: bool = typer.Option(False, "--run-once", help="Poll once, wait for the runs, exit."),
    healthcheck: bool = typer.Option(False, "--with-healthcheck", help="Serve /health on 127.0.0.1."),
) -> None:
    """Probe this machine and start an `executorch` worker that refuses runs for another channel or GPU arch."""
    from prefect.settings import temporary_settings

    from prefect_executorch.errors import ToolchainMismatch
    from prefect_executorch.fleet.deploy import plan_pool, prepare_pools
    from prefect_executorch.fleet.placement import channel_of_pool, describe_worker
    from prefect_executorch.fleet.worker import (
        WORKER_GPU_ENV,
        ExecutorchWorker,
        default_worker_name,
        serve,
        worker_toolchain,
    )

    toolchain = worker_toolchain()  # in a child: the worker itself never imports torch nor holds a CUDA context
    if gpu is not None and gpu not in [g.index for g in toolchain.gpus]:
        raise ToolchainMismatch(f"--gpu: no GPU {gpu} here; this machine has {describe_worker(toolchain)}")
    channel = channel_of_pool(pool)
    if channel and channel != toolchain.cuda_channel:
        err_console.print(f"[yellow]warning:[/] pool {pool} builds for {channel} but this machine is "
                          f"{describe_worker(toolchain, gpu)}: every run will be refused")
    prepare_pools([plan_pool(pool, tuple(queue))])
    worker_name = name or default_worker_name(toolchain, gpu, os.getpid())
    # This process's environment, not a setting read: the flow runs it starts inherit the pin.
    if gpu is not None:
        os.environ[WORKER_GPU_ENV] = str(gpu)
    worker_process = ExecutorchWorker(name=worker_name, work_pool_name=pool, work_queues=queue or None, limit=limit)
    worker_process.toolchain = toolchain
    console.print(f"starting worker {worker_name} on pool {pool}: {describe_worker(toolchain, gpu)}")
    # Prefect's default is 0.0.0.0; an operator's own PREFECT_WORKER_WEBSERVER_HOST still wins.
    host = {} if "PREFECT_WORKER_WEBSERVER_HOST" in os.environ else {"worker.webserver.host": "127.0.0.1"}
    with temporary_settings(updates=host):
        serve(worker_process, run_once=run_once, with_healthcheck=healthcheck,
              printer=lambda line: console.print(line, markup=False, highlight=False))


@app.command()
@handle_errors
def retrain(
    name: str = typer.Argument(..., metavar="NAME", help="Model name (the spec's name in its retrain deployment)."),
    weights: str = typer.Option(..., "--weights", help="New state dict: s3://bucket/key or a path the workers can read."),
    sha256: str | None = typer.Option(None, "--sha256", help="Expected sha256 of the weights (default: computed from a local file)."),
    version: str | None = typer.Option(None, "--version", help="Version to publish (default: <spec version>-<sha256[:12]>)."),
    reason: str = typer.Option("", "--reason", help="Free text: why the model was retrained."),
    training_run: str | None = typer.Option(None, "--training-run", help="Id of the training run (the bundle's lineage)."),
) -> None:
    """Emit `model.retrain.requested` for NAME: the hook a training pipeline calls when new weights are ready."""
    from prefect.settings import PREFECT_API_URL

    from prefect_executorch.errors import SpecError
    from prefect_executorch.fleet.retrain import EVENT, emit_retrain, parse_request
    from prefect_executorch.hashing import sha256_file

    if not PREFECT_API_URL.value():
        raise SpecError("PREFECT_API_URL: not set; point it at the server that runs the retrain deployment")
    if sha256 is None and "://" not in weights and Path(weights).is_file():
        sha256 = sha256_file(weights)
    request = parse_request({"name": name, "weights_uri": weights, "weights_sha256": sha256, "version": version,
                             "reason": reason, "training_run": training_run})
    event_id = emit_retrain(request)
    console.print(f"emitted {EVENT} for {request.resource_id} (event {event_id})")


def run() -> None:
    """``app`` with ``--debug`` accepted after the command too (``build spec.yaml --debug``)."""
    args = sys.argv[1:]
    # A global option, but every error says "rerun with --debug": take it wherever it is written, before `--`.
    end = args.index("--") if "--" in args else len(args)
    if "--debug" in args[:end]:
        args = ["--debug", *(a for i, a in enumerate(args) if a != "--debug" or i >= end)]
    try:
        app(args)
    except SystemExit:
        if Stop.signum is None or Stop.said:
            raise
        stopped()  # before a command ran (click still reading the line, the callback): typer exits 130 unsaid
