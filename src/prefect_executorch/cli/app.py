"""What every command shares: the Typer app, the consoles, the options declared once, error handling.

Each command group lives in a module of its own (``build``, ``bundles``, ``fleet``), registered on ``app``
when ``cli.main`` imports them; ``render`` prints what they report.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from prefect_executorch.cli.signals import Stop, stopped
from prefect_executorch.defaults import DEFAULT_STORE
from prefect_executorch.errors import PrefectExecutorchError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="prefect-executorch: build, validate, inspect and probe ExecuTorch bundles.",
                  # Plain help, wrapped at the terminal, never cut; wide when piped (to a pager, grep or a file).
                  rich_markup_mode=None,
                  context_settings={"max_content_width": 160, "terminal_width": None if sys.stdout.isatty() else 160})
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])
STORE_ENV = "PREFECT_EXECUTORCH_STORE"
DEBUG_ENV = "PREFECT_EXECUTORCH_DEBUG"
#: Options several commands take, declared once.
StoreOption = Annotated[str | None, typer.Option(
    "--store", help=f"Directory or s3://bucket/prefix (default: ${STORE_ENV}, else {DEFAULT_STORE}).")]
EndpointOption = Annotated[str | None, typer.Option(
    "--endpoint-url", help="S3 API endpoint (default: boto3's chain: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, config).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
#: A model's version or alias where BUNDLE may be a model name (``generate``, ``transcribe``).
VersionOption = Annotated[str | None, typer.Option(
    "--version", help="Version to use (with a model name; default: the newest that runs on this machine).")]
AliasOption = Annotated[str | None, typer.Option("--alias", help="Alias to use (with a model name): prod, staging...")]


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


def store_location(option: str | None) -> str:
    """``--store``, else the ``store`` setting (``$PREFECT_EXECUTORCH_STORE``, a profile…), else ``./bundles``."""
    if option:
        return option  # without reading the settings, which imports Prefect (~1 s) before the children's start
    from prefect_executorch.settings import get_settings

    return get_settings().store or DEFAULT_STORE


def start_children(exports: bool = False) -> None:
    """Start the child-process server now (its imports overlap with ours; ``exports``: warm for export children),
    its own output kept off the terminal.

    Its imports' notes (cpuinfo, torchao's optional kernels) are quiet with --debug too: each child logs to a
    file of its own, which a failure carries.
    """
    from prefect_executorch.isolation import warm_up

    warm_up(quiet=True, exports=exports)


def debug_flag(ctx: typer.Context) -> bool:
    """``--debug`` as given: what start-up decides on before the settings (and Prefect with them) are imported."""
    return bool(ctx.find_root().params.get("debug", False))


def server_configured() -> bool:
    """Whether ``PREFECT_API_URL`` names a Prefect server: where a command Prefect does not run still emits its event.

    The environment only (what workers and CI set): reading Prefect's profiles would import Prefect into
    the cache-hit path, which answers without it.
    """
    return bool(os.environ.get("PREFECT_API_URL"))


def open_for_reading(store: str | None, endpoint_url: str | None) -> Any:
    """The store of a command that reads it (pull, promote, ls, gc): a missing one is named, not shown empty."""
    from prefect_executorch.artifacts.urls import open_store

    opened = open_store(store_location(store), endpoint_url=endpoint_url)
    opened.require(writable=False)
    return opened


def handle_errors(function: F) -> F:
    """Print our typed errors without a traceback and exit 2 (bad input) or 1 (failure); 130/143 when stopped."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except PrefectExecutorchError as exc:
            if Stop.signum is not None:
                _stop_now()  # a child that died of the same Ctrl-C: the stop is the one line
            if _debug():
                if exc.child_output:
                    err_console.print(f"--- child stderr (tail) ---\n{exc.child_output}", markup=False, highlight=False)
                # The traceback, and the same exit code as without --debug (a script's `if` must not change).
                traceback.print_exception(exc)
                raise typer.Exit(exc.exit_code) from None
            err_console.print(f"[bold red]{type(exc).__name__}:[/] {escape(_one_message(exc))}", markup=True,
                              highlight=False)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            _stop_now()
        except BaseException as exc:
            # A flow run replaces the SIGTERM handler with Prefect's, which raises TerminationSignal instead.
            termination = getattr(sys.modules.get("prefect.exceptions"), "TerminationSignal", None)
            if termination is not None and isinstance(exc, termination):
                Stop.arm(exc.signal)
            # Whatever fails after a stop fails because of it (a child that died of the same Ctrl-C, a pipe
            # closed under a reader: an EOFError click would print as "Aborted!"): the stop is the one line.
            if Stop.signum is None or isinstance(exc, SystemExit):
                raise
            _stop_now()

    return wrapper  # type: ignore[return-value]


def _stop_now() -> NoReturn:
    """Kill the forkserver (its export child stops computing at once, before the exit hooks run), then ``stopped``."""
    from prefect_executorch.isolation import stop_forkserver

    stop_forkserver()
    stopped()


@app.callback()
def main(ctx: typer.Context, debug: bool = typer.Option(False, "--debug", help="Show tracebacks.")) -> None:
    """Export PyTorch models to ExecuTorch, validate them against eager PyTorch, publish bundles."""
    _quiet_defaults(prefect_console=ctx.invoked_subcommand == "worker")
    if debug:
        # Written, not only kept: the error handler, the flows and child processes read the debug setting.
        os.environ[DEBUG_ENV] = "1"
