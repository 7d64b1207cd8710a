"""What a store holds for a model, and which bundle to pull: ``ls`` and ``resolve``."""

from __future__ import annotations

from collections import defaultdict
from typing import Literal

from pydantic import BaseModel, Field

from prefect_executorch.artifacts.aliases import AliasRecord, list_aliases, read_alias
from prefect_executorch.artifacts.manifest import ALIASES_DIR, MANIFEST_FILE, BundleKey
from prefect_executorch.artifacts.publishing import list_bundles
from prefect_executorch.artifacts.store import ObjectStore
from prefect_executorch.errors import BundleConflict, BundleNotFound, SpecError, ToolchainMismatch
from prefect_executorch.machine.compat import fit, parse_compat
from prefect_executorch.machine.toolchain import Toolchain
from prefect_executorch.spec.fields import check_name

AUTO = "auto"


class Listing(BaseModel):
    """A model's bundles, aliases and unfinished publishes in one store."""

    name: str
    store: str
    bundles: list[BundleKey]
    aliases: dict[str, AliasRecord]
    incomplete: list[str] = Field(default_factory=list, description="Bundle prefixes with objects but no manifest.")


class Resolved(BaseModel):
    """The bundle a pull will fetch, and how it was chosen."""

    key: BundleKey
    manifest_sha256: str | None = Field(default=None, description="Pinned by the alias, if resolved through one.")
    alias: AliasRecord | None = None
    reason: str


def ls(store: ObjectStore, name: str) -> Listing:
    """Versions, targets, compats and aliases of ``name``."""
    check_name(name, "name")
    groups: dict[str, set[str]] = defaultdict(set)
    for info in store.list(f"{name}/"):
        parts = info.key.split("/")
        if len(parts) == 5 and parts[1] != ALIASES_DIR:
            groups["/".join(parts[:4])].add(parts[4])
    bundles = list_bundles(store, name)
    incomplete = sorted(prefix for prefix, files in groups.items() if MANIFEST_FILE not in files)
    return Listing(name=name, store=store.url, bundles=sorted(bundles, key=lambda k: k.prefix),
                   aliases=list_aliases(store, name), incomplete=incomplete)


def models(store: ObjectStore) -> list[str]:
    """Names of the models with at least one published bundle."""
    return sorted({info.key.split("/")[0] for info in store.list("")
                   if info.key.endswith(f"/{MANIFEST_FILE}") and info.key.count("/") == 4
                   and info.key.split("/")[1] != ALIASES_DIR})


def require_model(store: ObjectStore, name: str) -> None:
    """Raise ``BundleNotFound`` naming the store's models when ``name`` has no object there."""
    if not store.list(f"{check_name(name, 'name')}/"):
        raise BundleNotFound(f"no model {name} in {store.url}; models there: {', '.join(models(store)) or 'none'}")


def _describe(keys: list[BundleKey]) -> str:
    return ", ".join(f"{k.version} {k.target}/{k.compat}" for k in keys) or "none"


def _machine(toolchain: Toolchain) -> str:
    if not toolchain.sm:
        return f"{toolchain.arch}, no GPU"
    return f"{toolchain.arch}, {toolchain.sm}, {toolchain.cuda_channel}, TensorRT {toolchain.tensorrt or 'none'}"


def resolve(
    store: ObjectStore,
    name: str,
    *,
    version: str | None = None,
    alias: str | None = None,
    target: str | None = None,
    compat: str | Literal["auto"] = AUTO,
    toolchain: Toolchain | None = None,
    command: str = "pull",
) -> Resolved:
    """Pick the bundle to pull: by version or alias, narrowed by target, and by compat key or fit to this machine.

    ``command`` names the command that asked, in its messages.
    """
    check_name(name, "name")
    if (version is None) == (alias is None):
        raise SpecError(f"{command}: give exactly one of --version and --alias")
    if target is not None:
        check_name(target, "target")
    if compat != AUTO:
        parse_compat(compat)
    if compat == AUTO and toolchain is None:
        from prefect_executorch.machine.toolchain import probe

        toolchain = probe()
    if alias is not None:
        check_name(alias, "alias")
    else:
        check_name(version or "", "version")
    require_model(store, name)  # every name is checked first: a bad one sends no request
    if alias is not None:
        return _resolve_alias(store, name, alias, target, compat, toolchain)
    assert version is not None
    published = list_bundles(store, name, check_name(version, "version"))
    if not published:
        versions = sorted({k.version for k in list_bundles(store, name)})
        raise BundleNotFound(
            f"{name} has no version {version} in {store.url}; versions there: {', '.join(versions) or 'none'}")
    candidates = [k for k in published if target is None or k.target == target]
    if compat != AUTO:
        chosen = [k for k in candidates if k.compat == compat]
        if not chosen:
            raise BundleNotFound(f"no bundle of {name} {version} has compat {compat} (target {target or 'any'}); "
                                 f"published: {_describe(published)}")
        if len({k.target for k in chosen}) > 1:
            raise BundleConflict(f"{name} {version} has compat {compat} for several targets "
                                 f"({_describe(chosen)}); choose one with --target")
        return Resolved(key=chosen[0], reason=f"compat {compat} as asked")
    assert toolchain is not None
    fits = [(fit(k.compat, toolchain), k) for k in candidates]
    fitting = sorted(((f.rank, k) for f, k in fits if f.ok), key=lambda pair: -pair[0])
    if not fitting:
        why = "; ".join(f"{k.target}/{k.compat}: {f.reason}" for f, k in fits) or f"no bundle of target {target}"
        raise ToolchainMismatch(
            f"no bundle of {name} {version} fits this machine ({_machine(toolchain)}): {why}; published: "
            f"{_describe(published)}; pass --compat KEY to pull one anyway")
    best = [k for rank, k in fitting if rank == fitting[0][0]]
    if len(best) > 1:
        raise BundleConflict(f"several bundles of {name} {version} fit this machine equally ({_describe(best)}); "
                             "choose one with --target or --compat")
    return Resolved(key=best[0], reason=f"best fit for this machine ({_machine(toolchain)})")


def _resolve_alias(store: ObjectStore, name: str, alias: str, target: str | None, compat: str,
                   toolchain: Toolchain | None) -> Resolved:
    current = read_alias(store, name, alias)
    if current is None:
        known = ", ".join(sorted(list_aliases(store, name))) or "none"
        raise BundleNotFound(f"alias {alias} of {name} is not set in {store.url}; aliases there: {known}")
    record = current[0]
    if target is not None and record.target != target:
        raise BundleNotFound(f"alias {record.describe()} is target {record.target}, not {target}")
    if compat != AUTO and record.compat != compat:
        raise BundleNotFound(f"alias {record.describe()} has compat {record.compat}, not {compat}")
    if compat == AUTO:
        assert toolchain is not None
        verdict = fit(record.compat, toolchain)
        if not verdict.ok:
            others = _describe(list_bundles(store, name, record.version))
            raise ToolchainMismatch(
                f"alias {record.describe()} does not fit this machine ({_machine(toolchain)}): {verdict.reason}; "
                f"bundles of version {record.version}: {others}; pull one by --version with --compat, or "
                "promote a fitting bundle")
    return Resolved(key=record.bundle_key(), manifest_sha256=record.manifest_sha256, alias=record,
                    reason=f"alias {alias}")


def newest_fitting_version(store: ObjectStore, name: str, toolchain: Toolchain) -> str:
    """The newest version of ``name`` (PEP 440 order; versions it cannot read order as text, before the rest) with a
    bundle that fits this machine."""
    from packaging.version import InvalidVersion, Version

    def order(version: str) -> tuple[int, Version | str]:
        try:
            return 1, Version(version)
        except InvalidVersion:
            return 0, version

    require_model(store, name)
    published = list_bundles(store, name)
    fitting = {k.version for k in published if fit(k.compat, toolchain).ok}
    if not fitting:
        raise ToolchainMismatch(f"no bundle of {name} fits this machine ({_machine(toolchain)}); published: "
                                f"{_describe(published)}")
    return max(fitting, key=order)
