"""The build cache: a Prefect cache policy keyed on the build's content fingerprint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from prefect.cache_policies import CachePolicy
from prefect.context import TaskRunContext
from prefect.filesystems import WritableFileSystem

from prefect_executorch.artifacts.rebuild import PublishedBuild
from prefect_executorch.settings import get_settings


@dataclass
class BuildCachePolicy(CachePolicy):
    """Key a build on its fingerprint (weights, model source, normalized spec, toolchain, compat, store).

    As prefect-dbt's node policy, the key is computed before the task runs, here by ``check_published``
    (``PublishedBuild.fingerprint``), so this opens no store and hashes no file. The build also
    publishes that fingerprint, so it comes in as the task's ``published`` input rather than baked
    into the policy: one value, one place.
    """

    def compute_key(
        self,
        task_ctx: TaskRunContext,
        inputs: dict[str, Any],
        flow_parameters: dict[str, Any],
        **kwargs: Any,
    ) -> str | None:
        """``build-<fingerprint>`` from the ``published`` input."""
        published: PublishedBuild = inputs["published"]
        return "build-" + published.fingerprint


def resolve_result_storage(value: str | None) -> Path | WritableFileSystem | None:
    """``block:<type>/<name>`` -> the loaded block; other text -> a directory; unset -> ``$PREFECT_EXECUTORCH_RESULT_STORAGE``, else Prefect's default.

    Prefect reads a plain string as a block slug, so directories are passed on as ``Path``.
    """
    value = value or get_settings().result_storage
    if not value:
        return None
    if value.startswith("block:"):
        return cast(WritableFileSystem, WritableFileSystem.load(value.removeprefix("block:")))
    return Path(value).expanduser().resolve()
