"""The build cache: a Prefect cache policy keyed on the build's content fingerprint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from prefect.cache_policies import CachePolicy
from prefect.context import TaskRunContext
from prefect.filesystems import WritableFileSystem

from prefect_executorch.artifacts.store import open_store
from prefect_executorch.fingerprint import build_fingerprint
from prefect_executorch.settings import get_settings


@dataclass
class BuildCachePolicy(CachePolicy):
    """Key a build on the sha256 of its weights and model source, its normalized spec, toolchain, compat and store."""

    def compute_key(
        self,
        task_ctx: TaskRunContext,
        inputs: dict[str, Any],
        flow_parameters: dict[str, Any],
        **kwargs: Any,
    ) -> str | None:
        store = open_store(inputs["store"]).url
        return "build-" + build_fingerprint(inputs["spec"], inputs["toolchain"], inputs["compat"], store).key()


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
