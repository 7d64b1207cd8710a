"""Where a bundle came from: the model's source files by digest, their git commit, the weights, the training run.

A bundle in ``prod`` must be traceable to the code and weights that made it, without trusting
paths (which differ per worker): sources are recorded by sha256, relative to their git work tree
when there is one, with its commit and whether the tree had uncommitted changes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from pydantic import BaseModel, Field

from prefect_executorch.hashing import sha256_file
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.modelref import ModelRef, model_dir_files, source_file

GIT_TIMEOUT_S = 10


class SourceDigest(BaseModel):
    """One source file of the model."""

    path: str = Field(description="Relative to the git work tree if the file is in one, else the file name.")
    sha256: str


class GitState(BaseModel):
    """The git work tree the model's source lives in."""

    commit: str
    dirty: bool = Field(description="Whether tracked files had uncommitted changes when the bundle was built.")


class Lineage(BaseModel):
    """What a bundle was built from."""

    model: str = Field(description="The factory's name (``'file.py:factory'`` without the path).")
    sources: list[SourceDigest]
    git: GitState | None = Field(default=None, description="None when the source is not in a git work tree.")
    weights_uri: str | None = Field(default=None, description="Where the weights were fetched from (a retrain's URI).")
    weights_sha256: str | None = None
    training_run: str | None = Field(default=None, description="The training run id the retrain event carried.")


def _git(directory: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None  # no git here: the lineage records the digests without a commit
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(path: Path) -> tuple[GitState | None, Path | None]:
    """The commit and dirty flag of the work tree holding ``path``, and the tree's root; (None, None) outside one."""
    root = _git(path.parent, "rev-parse", "--show-toplevel")
    commit = _git(path.parent, "rev-parse", "HEAD") if root else None
    if not root or not commit:
        return None, None
    status = _git(path.parent, "status", "--porcelain", "--untracked-files=no")
    return GitState(commit=commit, dirty=bool(status)), Path(root)


def collect_lineage(spec: BuildSpec, weights_uri: str | None = None, training_run: str | None = None) -> Lineage:
    """The lineage of a build of ``spec`` on this machine."""
    directory = model_dir_files(spec)
    if directory is not None:  # a model directory: its files are the sources
        sources, model = [path.resolve() for path in directory], Path(spec.model).name
    else:
        sources, model = [source_file(spec.model).resolve()], ModelRef.split(spec.model).function
    git, root = git_state(sources[0])
    return Lineage(
        model=model,
        sources=[SourceDigest(path=str(source.relative_to(root.resolve())) if root and source.is_relative_to(root.resolve())
                              else source.name, sha256=sha256_file(source)) for source in sources],
        git=git,
        weights_uri=weights_uri or spec.weights,
        weights_sha256=sha256_file(spec.weights) if spec.weights else None,
        training_run=training_run,
    )
