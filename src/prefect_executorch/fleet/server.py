"""The Prefect server a command or flow talks to: reached, and a Prefect API, before any work starts.

Prefect reports a configured API that does not answer as a 140-line traceback ending ``RuntimeError:
Failed to reach API`` (after its own retries); a server still starting refuses connections for seconds.
Here a configured ``PREFECT_API_URL`` is asked for Prefect's ``/health`` until it answers ``true`` or
``PREFECT_EXECUTORCH_API_WAIT_S`` pass, and anything else is one ``PrefectApiUnreachable`` line saying what
to do. With no URL configured, flows run on the embedded (ephemeral) API and nothing is asked.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from prefect import Flow

from prefect_executorch.errors import PrefectApiUnreachable
from prefect_executorch.settings import ExecutorchSettings, env_name, get_settings

#: How long one health request may take, and the pause between requests while the server starts (s).
REQUEST_TIMEOUT_S, RETRY_PAUSE_S = 2.0, 0.5
_WAIT = env_name(ExecutorchSettings, "api_wait_s")
P = ParamSpec("P")
R = TypeVar("R")
_FIXES = (f"start it (`prefect server start`) or wait for it (set {_WAIT} to wait longer), or unset PREFECT_API_URL "
          "to run on the embedded API")


def configured_api_url() -> str | None:
    """``PREFECT_API_URL`` as Prefect's settings read it (environment, profile, prefect.toml), or None."""
    from prefect.settings import get_current_settings

    return get_current_settings().api.url or None


def require_prefect_api(wait_s: float | None = None) -> str | None:
    """The configured API's URL once its ``/health`` answers ``true`` (None: none configured, the embedded API serves).

    Connection errors and 5xx answers are retried for ``wait_s`` (default: the setting); an answer that is not
    Prefect's is refused at once. Raises ``PrefectApiUnreachable``.
    """
    import httpx

    url = configured_api_url()
    if url is None:
        return None
    wait = get_settings().api_wait_s if wait_s is None else wait_s
    deadline = time.monotonic() + wait
    health = f"{url.rstrip('/')}/health"
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        while True:
            try:
                answer = client.get(health)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if answer.status_code == 200 and answer.text.strip() == "true":
                    return url
                if answer.status_code < 500:
                    raise PrefectApiUnreachable(
                        f"PREFECT_API_URL={url} answers but is no Prefect API (GET /health: HTTP {answer.status_code}, "
                        f"{' '.join(answer.text.split())[:60]!r}; a Prefect server answers true): set it to the server's API URL, "
                        "which ends in /api, or unset it to run on the embedded API")
                last = f"HTTP {answer.status_code}"
            if time.monotonic() + RETRY_PAUSE_S > deadline:
                raise PrefectApiUnreachable(
                    f"PREFECT_API_URL={url}: no Prefect server answered within {wait:g} s ({last}); {_FIXES}")
            time.sleep(RETRY_PAUSE_S)


class ApiCheckedFlow(Flow[P, R]):
    """A flow that, called from Python outside any flow run, first checks the configured API answers
    (``require_prefect_api``): a user's script gets one ``PrefectApiUnreachable`` instead of Prefect's traceback.

    A worker runs deployments through Prefect's engine, not this call, and a subflow's parent has reached the API.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from prefect.context import FlowRunContext

        if FlowRunContext.get() is None:
            require_prefect_api()
        return super().__call__(*args, **kwargs)


def api_checked_flow(**options: Any) -> Callable[[Callable[P, R]], ApiCheckedFlow[P, R]]:
    """``@flow(**options)`` whose call checks the Prefect API first (``ApiCheckedFlow``)."""

    def decorate(function: Callable[P, R]) -> ApiCheckedFlow[P, R]:
        return ApiCheckedFlow(function, **options)

    return decorate
