"""The bundle manifest and the key scheme of the store."""

from __future__ import annotations

import getpass
import socket
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field, ValidationError, field_validator

from prefect_executorch import __version__
from prefect_executorch.errors import SpecError
from prefect_executorch.export.fingerprint import BuildFingerprint
from prefect_executorch.export.lineage import Lineage
from prefect_executorch.export.quantize import QuantizationFacts
from prefect_executorch.machine.toolchain import Toolchain
from prefect_executorch.program import MethodFacts
from prefect_executorch.runtime.bundled_cases import BundledFacts
from prefect_executorch.spec.buildspec import ModelCard
from prefect_executorch.spec.fields import check_name
from prefect_executorch.spec.methods import InputSpec
from prefect_executorch.targets.delegation import DelegationFacts
from prefect_executorch.validate.report import ValidationSummary

MANIFEST_FILE = "manifest.json"
#: ``<name>/aliases/`` holds the aliases, so no version may have that name.
ALIASES_DIR = "aliases"
VALIDATION_FILE = "validation.json"
#: Created first by a publish, removed after its manifest: one publisher per bundle key.
CLAIM_FILE = ".publishing"
#: 2: manifests are sealed with a digest of their canonical JSON (artifacts/signing.py).
SCHEMA_VERSION = 2


def key_segment(value: str, field: str) -> str:
    """Return ``value`` if it can be segment ``field`` of a bundle key, else raise ``SpecError``."""
    check_name(value, field)
    if field == "version" and value == ALIASES_DIR:
        raise SpecError(f"version: {value!r} is reserved for the aliases of a model; choose another version")
    return value


class BundleKey(BaseModel):
    """Where a bundle lives: ``<name>/<version>/<target>/<compat>`` under the store's prefix."""

    name: str
    version: str
    target: str
    compat: str

    @field_validator("name", "version", "target", "compat")
    @classmethod
    def _segment(cls, value: str, info: Any) -> str:
        return key_segment(value, info.field_name)

    @classmethod
    def of(cls, name: str, version: str, target: str, compat: str) -> BundleKey:
        """A key from user input; ``SpecError`` (not pydantic's error) names a bad segment."""
        try:
            return cls(name=name, version=version, target=target, compat=compat)
        except ValidationError as exc:
            raise SpecError(str(exc.errors()[0]["msg"]).removeprefix("Value error, ")) from None

    @property
    def prefix(self) -> str:
        """The bundle's key prefix, relative to the store root."""
        return f"{self.name}/{self.version}/{self.target}/{self.compat}"

    def key(self, filename: str) -> str:
        """Key of one file of the bundle."""
        return f"{self.prefix}/{filename}"


class FileEntry(BaseModel):
    """One file of a bundle."""

    path: str = Field(description="File name inside the bundle directory.")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    role: str = Field(description="'program', 'data' (.ptd), 'bundled' (.bpte), 'generation' (an LLM's tokenizer and "
                      "its prompts with eager's tokens), 'speech' (a speech model's tokenizer and front-end settings) "
                      "or 'report'.")

    @field_validator("path")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if "/" in value or "\\" in value or value in ("", ".", "..") or "\x00" in value:
            raise ValueError(f"file path {value!r} must be a plain file name inside the bundle")
        return value


class MethodEntry(BaseModel):
    """A method's inputs and what it runs on."""

    inputs: list[InputSpec]
    delegates: list[str]
    kernel_calls: int
    operators: list[str] = Field(default_factory=list)
    delegation: DelegationFacts | None = Field(None, description="Operators delegated, counted at export.")


class Manifest(BaseModel):
    """What a bundle is; a bundle without a manifest does not exist."""

    schema_version: int = SCHEMA_VERSION
    name: str
    version: str
    target: str
    compat: str
    files: list[FileEntry]
    program: str = Field(description="The .pte file.")
    data_files: list[str] = Field(default_factory=list, description="The .ptd files the program must load with.")
    methods: dict[str, MethodEntry]
    toolchain: dict[str, str | None] = Field(description="Library versions that built the bundle.")
    platform: dict[str, str | None] = Field(description="OS, arch, CUDA channel and SM of the builder.")
    runtime_hints: dict[str, Any] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list, description="What the export chose for this model that a user "
                             "should know (e.g. a method compiled without the CUDA backend's Triton kernels).")
    spec_sha256: str
    weights_sha256: str | None = None
    quantization: QuantizationFacts | None = Field(None, description="Scheme, group size, calibration, torchao or ModelOpt version.")
    fingerprint: str | None = Field(None, description="Build fingerprint (export/fingerprint.py): an unchanged rebuild has the same.")
    build_inputs: BuildFingerprint | None = Field(
        None, description="The fingerprint's parts (content hashes, the spec without paths, the toolchain): a changed "
        "rebuild is told which of them changed.")
    validation: ValidationSummary
    bundled: BundledFacts | None = Field(None, description="The .bpte of the validation cases, or why there is none.")
    lineage: Lineage | None = Field(default=None, description="Sources, git commit, weights and training run.")
    card: ModelCard | None = Field(default=None, description="The spec's model card.")
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    builder: str = Field(default_factory=lambda: f"prefect-executorch {__version__} on {user_at_host()}")

    @field_validator("name", "version", "target", "compat")
    @classmethod
    def _segment(cls, value: str, info: Any) -> str:
        # A manifest names its own key: a segment no key may have is a corrupt manifest, refused on read.
        return key_segment(value, info.field_name)

    @property
    def key(self) -> BundleKey:
        """The bundle's key."""
        return BundleKey.of(self.name, self.version, self.target, self.compat)

    def file(self, path: str) -> FileEntry:
        """The entry for ``path``."""
        for entry in self.files:
            if entry.path == path:
                return entry
        raise KeyError(path)

    def delegates(self) -> dict[str, list[str]]:
        """Delegate list per method."""
        return {name: method.delegates for name, method in self.methods.items()}

    def delegation(self) -> dict[str, DelegationFacts]:
        """Operators delegated per method, for the methods whose counts were recorded."""
        return {name: method.delegation for name, method in self.methods.items() if method.delegation is not None}


def user_at_host() -> str:
    """``user@host`` of this process, for the records of who built or moved what."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def method_entries(
    inputs: dict[str, list[InputSpec]],
    facts: dict[str, MethodFacts],
    delegation: dict[str, DelegationFacts] | None = None,
) -> dict[str, MethodEntry]:
    """Manifest entries for the methods of a program."""
    return {
        name: MethodEntry(
            inputs=inputs.get(name, []),
            delegates=fact.delegates,
            kernel_calls=fact.kernel_calls,
            operators=sorted(set(fact.operators)),
            delegation=(delegation or {}).get(name),
        )
        for name, fact in facts.items()
    }


def platform_facts(toolchain: Toolchain) -> dict[str, str | None]:
    """The builder's platform as the manifest records it."""
    return {"os": toolchain.os, "arch": toolchain.arch, "cuda_channel": toolchain.cuda_channel, "sm": toolchain.sm}
