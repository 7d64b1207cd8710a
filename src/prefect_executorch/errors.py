"""Typed errors: each message says what was expected, what was found, and what to do."""

from __future__ import annotations


class PrefectExecutorchError(Exception):
    """Base class of every error this package raises on purpose."""

    #: CLI exit code: 2 for bad input (usage), 1 for a failure while doing the work.
    exit_code = 1

    def __init__(self, message: str = "", *, child_output: str = "") -> None:
        super().__init__(message)
        #: The tail of the stderr of the child process behind the error: shown by ``--debug`` and kept as the
        #: run's artifact, never part of the message (a flow run's state message is the one-line cause).
        self.child_output = child_output


class SpecError(PrefectExecutorchError, ValueError):
    """The build spec (or another user input) is invalid; the message names the field."""

    exit_code = 2


class InvalidSetting(SpecError):
    """A ``PREFECT_EXECUTORCH_*`` setting (environment, .env, prefect.toml or profile) has a value it cannot take."""


class PrefectApiUnreachable(PrefectExecutorchError):
    """The Prefect server ``PREFECT_API_URL`` names does not answer, or is no Prefect API: a configuration to fix."""

    exit_code = 2


class ToolchainMismatch(PrefectExecutorchError):
    """This machine's toolchain cannot build or run what was asked for."""

    exit_code = 2


class MissingMainGuard(PrefectExecutorchError):
    """A script starts child processes at import time: each child would run the script again."""

    exit_code = 2


class ExportFailed(PrefectExecutorchError):
    """Exporting the model to an ExecuTorch program failed."""


class ChildProcessFailed(PrefectExecutorchError):
    """An isolated child process crashed, was killed or timed out."""

    def __init__(self, message: str, *, returncode: int | None = None, child_output: str = "") -> None:
        super().__init__(message, child_output=child_output)
        self.returncode = returncode


class ValidationFailed(PrefectExecutorchError):
    """The exported program does not match eager PyTorch within the spec's tolerances."""


class GenerationFailed(PrefectExecutorchError):
    """A decoder-LM bundle's program failed while generating (``generate``) on this machine."""


class PromotionRefused(PrefectExecutorchError):
    """The candidate disagrees with, or is slower than, the bundle its alias serves now."""

    def __init__(self, message: str, *, comparison: list[dict[str, object]] | None = None) -> None:
        super().__init__(message)
        #: The side-by-side's rows (``ComparisonRow`` as dicts) behind the refusal: the run records them as it
        #: records a promotion that passed.
        self.comparison = comparison or []


class BundleConflict(PrefectExecutorchError):
    """A bundle (or alias) already exists where a new one was to be written."""


class DestinationExists(BundleConflict):
    """A directory to create (``pull --to``) is already there: a usage error, nothing was written."""

    exit_code = 2


class BundleNotFound(PrefectExecutorchError):
    """No bundle or alias matches what was asked for."""


class NotABundle(BundleNotFound):
    """A directory given as a bundle has no manifest.json: a wrong path, so bad input."""

    exit_code = 2


class IntegrityError(PrefectExecutorchError):
    """A stored object does not match its manifest (size, sha256, pairing or location)."""


class StoreError(PrefectExecutorchError):
    """The object store refused or failed a request (credentials, bucket, network)."""


class ObjectExists(BundleConflict):
    """A conditional create found the object already there; nothing was overwritten."""

    def __init__(self, message: str, *, key: str, existing_sha256: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.existing_sha256 = existing_sha256


class PreconditionFailed(BundleConflict):
    """A compare-and-swap found another value than expected; nothing was written."""

    def __init__(self, message: str, *, key: str, current_etag: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.current_etag = current_etag


class BuildFailed(PrefectExecutorchError):
    """One or more builds of a matrix failed or never ran; the message lists each."""


class DeployFailed(PrefectExecutorchError):
    """Creating work pools or deployments on the Prefect server failed."""


class InvalidProgram(PrefectExecutorchError):
    """A file is not a readable ExecuTorch program (wrong format, truncated)."""
