"""A build's fingerprint: everything that decides its bundle, hashed by content, never by path.

Two builds with the same fingerprint produce the same bundle, so the second may return the first's
published bundle. The fingerprint covers the weights' bytes, the model factory's source file, the
spec with paths and time limits normalized away (samples files and dataset sources by content), the toolchain versions, the compat key and the
store (a bundle in one store is no answer for another).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel

from prefect_executorch.export.quantize import quantizer_versions
from prefect_executorch.hashing import sha256_file
from prefect_executorch.machine.toolchain import Toolchain
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.modelref import ModelRef, model_dir_files, source_file


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


def normalized_spec(spec: BuildSpec) -> dict[str, object]:
    """The spec without what does not change the bundle: file paths (hashed instead) and time limits."""
    data = spec.model_dump(mode="json", exclude={"weights", "export_timeout_s"})
    if spec.llm is not None:
        data["model"] = "llm"  # the directory counts by its files' content (model_source_sha256), not its path
        data["llm"]["tokenizer"] = None  # type: ignore[index]
    elif spec.asr is not None:
        data["model"] = "asr"
        # Clips are data: each counts by its content, not where it lives.
        data["asr"]["clips"] = [sha256_file(clip) for clip in spec.asr.clips]  # type: ignore[index]
    else:
        data["model"] = ModelRef.split(spec.model).function
    for kind in ("llm", "asr"):
        if data[kind] is None:
            del data[kind]  # builds of other kinds keep the cache key they had before the section existed
    validation: dict[str, Any] = data["validation"]  # type: ignore[assignment]
    validation.pop("timeout_s", None)
    # Samples are data: a file edited in place must miss the cache, a moved one must not.
    for name, settings in validation["methods"].items():
        field = f"validation.methods.{name}"
        if settings.get("samples_file"):
            settings["samples_file"] = sha256_file(settings["samples_file"])
        if settings.get("dataset"):
            settings["dataset"] = _function_digest(settings["dataset"], f"{field}.dataset")
    if data["quantization"] is None:
        del data["quantization"]  # float builds keep the cache key they had before quantization existed
    elif (data["quantization"].get("calibration") or {}).get("dataset"):  # type: ignore[union-attr]
        calibration = data["quantization"]["calibration"]  # type: ignore[index]
        calibration["dataset"] = _function_digest(calibration["dataset"], "quantization.calibration.dataset")
    return data


def _function_digest(reference: str, field: str) -> str:
    """``<sha256 of the defining file>:<function>``: a dataset counts by its source, not where it lives."""
    return f"{sha256_file(source_file(reference, field))}:{ModelRef.split(reference).function}"


def model_source_digest(spec: BuildSpec) -> str:
    """sha256 of the model factory's source file; of an LLM's or speech model's files (names and contents) instead."""
    files = model_dir_files(spec)
    if files is None:
        return sha256_file(source_file(spec.model))
    return hashlib.sha256("".join(f"{path.name}:{sha256_file(path)};" for path in files).encode()).hexdigest()


def build_fingerprint(spec: BuildSpec, toolchain: Toolchain, compat: str, store: str) -> BuildFingerprint:
    """Hash the weights and the model source and collect the rest of what decides the bundle."""
    return BuildFingerprint(
        weights_sha256=sha256_file(spec.weights) if spec.weights else None,
        model_source_sha256=model_source_digest(spec),
        spec=normalized_spec(spec),
        toolchain={**toolchain.versions(), "os": toolchain.os, "arch": toolchain.arch,
                   # torchao (ModelOpt for TensorRT) rounds a quantized build's weights: its version decides that bundle too.
                   **quantizer_versions(spec.quantization)},
        compat=compat,
        store=store,
    )
