"""A real exported bundle for the store tests (import as `realbundle`)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from prefect_executorch.artifacts.manifest import Manifest
from prefect_executorch.artifacts.publishing import file_entries
from prefect_executorch.artifacts.store import LocalStore, ObjectStore
from prefect_executorch.spec.buildspec import BuildSpec

#: Input shape of each model factory of tests/models.py that the reliability tests build.
SHAPES = {"convnet": [2, 3, 8, 8], "mlp": [2, 32], "two_outputs": [5, 16], "wide_24mb": [2, 1774],
          "wide_200mb": [2, 5120]}


def store_kind(store: ObjectStore) -> str:
    """'local' or 'S3', for the summary table."""
    return "local" if isinstance(store, LocalStore) else "S3"


@dataclass
class RealBundle:
    """A real XNNPACK export (weights in a .ptd), validated against eager, with its manifest."""

    spec: BuildSpec
    dir: Path
    manifest: Manifest

    def variant(self, root: Path, version: str | None = None, report_suffix: bytes = b"") -> tuple[Path, Manifest]:
        """The bundle as another publish would send it: a new manifest (and, with ``report_suffix``, other
        report bytes), hard links to the same program and data."""
        bundle = root / f"bundle-{uuid.uuid4().hex[:8]}"
        bundle.mkdir(parents=True)
        for entry in self.manifest.files:
            if entry.role == "report":
                (bundle / entry.path).write_bytes((self.dir / entry.path).read_bytes() + report_suffix)
            else:
                (bundle / entry.path).hardlink_to(self.dir / entry.path)
        reports = [e.path for e in self.manifest.files if e.role == "report"]
        manifest = self.manifest.model_copy(update={
            "version": version or self.manifest.version, "created_at": datetime.now(UTC),
            "files": file_entries(bundle, self.manifest.program, self.manifest.data_files, reports)})
        return bundle, manifest

    def under(self, other: RealBundle) -> RealBundle:
        """This bundle's files published under ``other``'s key: another build of the same name and version."""
        key = other.manifest.key
        manifest = self.manifest.model_copy(update={"name": key.name, "version": key.version, "target": key.target,
                                                    "compat": key.compat})
        return RealBundle(spec=other.spec, dir=self.dir, manifest=manifest)
