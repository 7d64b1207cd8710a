"""A build's fingerprint: everything that decides its bundle, hashed by content, never by path.

Two builds with the same fingerprint produce the same bundle, so the second may return the first's
published bundle. The fingerprint covers the weights' bytes, the model factory's source file, the
spec with paths and time limits normalized away, the toolchain versions, the compat key and the
store (a bundle in one store is no answer for another).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

from pydantic import BaseModel

from prefect_executorch.errors import SpecError
from prefect_executorch.hashing import sha256_file
from prefect_executorch.quantization import torchao_version
from prefect_executorch.spec import BuildSpec
from prefect_executorch.toolchain import Toolchain


class BuildFingerprint(BaseModel):
    """The inputs of a build that decide its output."""

    weights_sha256: str | None
    model_source_sha256: str
    spec: dict[str, object]
    toolchain: dict[str, str | None]
    compat: str
    store: str

    def key(self) -> str:
        """sha256 of the canonical JSON: the cache key."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def model_source_file(model: str) -> Path:
    """The file that defines the factory of ``'path.py:factory'`` or ``'package.module:factory'``."""
    module = model.rpartition(":")[0]
    if module.endswith(".py"):
        path = Path(module)
    else:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError) as exc:
            raise SpecError(f"model: cannot import {module!r}: {exc}") from None
        if found is None or not found.origin or not Path(found.origin).is_file():
            raise SpecError(f"model: no source file for module {module!r}; install the package that provides it")
        path = Path(found.origin)
    if not path.is_file():
        raise SpecError(f"model: file {module!r} does not exist (resolved relative to the spec file)")
    return path


def normalized_spec(spec: BuildSpec) -> dict[str, object]:
    """The spec without what does not change the bundle: file paths (hashed instead) and time limits."""
    data = spec.model_dump(mode="json", exclude={"weights", "export_timeout_s"})
    data["model"] = spec.model.rpartition(":")[2]
    data["validation"].pop("timeout_s", None)  # type: ignore[union-attr]
    if data["quantization"] is None:
        del data["quantization"]  # float builds keep the cache key they had before quantization existed
    return data


def build_fingerprint(spec: BuildSpec, toolchain: Toolchain, compat: str, store: str) -> BuildFingerprint:
    """Hash the weights and the model source and collect the rest of what decides the bundle."""
    return BuildFingerprint(
        weights_sha256=sha256_file(spec.weights) if spec.weights else None,
        model_source_sha256=sha256_file(model_source_file(spec.model)),
        spec=normalized_spec(spec),
        toolchain={**toolchain.versions(), "os": toolchain.os, "arch": toolchain.arch,
                   # torchao rounds the weights of a quantized build, so its version decides that bundle too.
                   **({"torchao": torchao_version()} if spec.quantization else {})},
        compat=compat,
        store=store,
    )
