"""How a typed failure reads in Prefect: one ERROR line with its cause, the child process's output as an artifact."""

from __future__ import annotations

import logging
import re

from prefect.artifacts import create_markdown_artifact

from prefect_executorch import errors
from prefect_executorch.errors import PrefectExecutorchError
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.tasks.prefect_artifacts import artifact_key

#: Prefect's loggers of task and flow runs, which log a failed run's exception with its traceback.
RUN_LOGGERS = ("prefect.task_runs", "prefect.flow_runs")
#: Markdown fence of the child's output: tildes, as the output may hold backticks of its own.
FENCE = "~~~~"


#: A task's final-state line for an exception (Prefect logs it at ERROR), naming the exception's type.
_FAILED_STATE = re.compile(r"Finished in state Failed\(.*encountered an exception:? (\w+):")


def _ours(type_name: str) -> bool:
    found = getattr(errors, type_name, None)
    return isinstance(found, type) and issubclass(found, PrefectExecutorchError)


class OneLineFailures(logging.Filter):
    """A typed error is logged once at ERROR, as its cause, without a traceback; other exceptions are left alone.

    Prefect logs a failed run's exception with its traceback for the task that raised it and again for
    every task and flow it passes through, then each task's final state at ERROR. Our errors' messages
    say what was expected, what was found and what to do; their tracebacks are frames of ours and
    Prefect's that tell a reader nothing more. So: the first record of the error becomes one line, the
    later records of the same error are dropped, and the task state lines naming one of our errors are INFO.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, PrefectExecutorchError):
            if getattr(exc, "_logged_once", False):
                return False
            exc._logged_once = True  # type: ignore[attr-defined]
            record.msg, record.args = f"{type(exc).__name__}: {exc}", ()
            record.exc_info, record.exc_text = None, None
        elif record.levelno >= logging.ERROR and not record.exc_info:
            state = _FAILED_STATE.match(record.getMessage())
            if state and _ours(state.group(1)):
                record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def log_failures_in_one_line() -> None:
    """Add ``OneLineFailures`` to Prefect's run loggers (once)."""
    for name in RUN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, OneLineFailures) for f in logger.filters):
            logger.addFilter(OneLineFailures())


def keep_child_output(spec: BuildSpec, exc: PrefectExecutorchError) -> str | None:
    """The output of the child process behind ``exc``, as a markdown artifact of the run; its key (None without one).

    Keyed per model and target, so the artifact's history is that build's failures.
    """
    if not exc.child_output:
        return None
    key = artifact_key("child-output", spec.name, spec.target_name)
    create_markdown_artifact(
        f"**{type(exc).__name__}**: {exc}\n\nThe child process's stderr (its last lines):\n\n"
        f"{FENCE}text\n{exc.child_output}\n{FENCE}\n",
        key=key,
        description=f"stderr of the child process behind the failed build of {spec.name} {spec.version}",
    )
    return key
