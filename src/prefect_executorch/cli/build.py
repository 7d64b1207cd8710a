"""Commands that make and check programs: ``build``, ``validate``, ``probe``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.table import Table

from prefect_executorch.cli.app import (
    EndpointOption,
    JsonOption,
    StoreOption,
    app,
    console,
    debug_flag,
    err_console,
    handle_errors,
    server_configured,
    start_children,
    store_location,
)
from prefect_executorch.cli.render import LiveView, print_build_summary, print_report
from prefect_executorch.cli.signals import NOTHING_PUBLISHED, Stop

if TYPE_CHECKING:
    from prefect_executorch.cli.embedded import ApiStart


@app.command()
@handle_errors
def build(
    ctx: typer.Context,
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="Build spec (YAML or JSON)."),
    store: StoreOption = None,
    output: Path | None = typer.Option(None, "--output", help="Keep export directories here (default: temporary)."),
    endpoint_url: EndpointOption = None,
) -> None:
    """Export, validate and publish one bundle (ephemeral Prefect unless a server is configured)."""
    from prefect_executorch.artifacts.publishing import list_bundles, sign_unsigned
    from prefect_executorch.artifacts.urls import open_store
    from prefect_executorch.machine.probecache import cached_toolchain, probe_cached
    from prefect_executorch.progress import listening, stage
    from prefect_executorch.spec.buildspec import load_spec

    store = store_location(store)
    if endpoint_url:
        from prefect_executorch.settings import S3Settings, env_name

        # The flow opens the store itself (in this process): the setting carries the endpoint there.
        os.environ[env_name(S3Settings, "endpoint_url")] = endpoint_url
    spec = load_spec(spec_path)
    spec.check_model_reference()
    view = LiveView(debug=debug_flag(ctx))
    with view, listening(view.on_stage):
        # An unchanged rebuild with a cached probe answers without the children's and Prefect's start;
        # anything else starts both at once, so that their imports overlap ours and each other.
        with stage("probe"):
            toolchain = cached_toolchain()
        if toolchain is None:
            start_children(exports=True)  # the probe runs in one; before an S3 store's settings import Prefect
        else:
            _check_here(spec, toolchain)  # a build this worker refuses starts neither (~20 s of CPU, 0.1 s to check)
        opened = open_store(store)
        opened.require(writable=True)  # before anything is exported
        fresh = not list_bundles(opened, spec.name, spec.version)  # so it cannot be a cache hit
        prefect_start = None
        if fresh:
            Stop.note = lambda: _left_by(opened, spec.name, spec.version)
            start_children(exports=True)
            prefect_start = _start_prefect()
        try:
            if toolchain is None:
                with stage("probe"):
                    toolchain = probe_cached()
                _check_here(spec, toolchain)
            ref = _published_build(spec, opened, toolchain)
            if ref is not None and sign_unsigned(opened, ref):  # an unchanged rebuild with a key signs what is unsigned
                err_console.print(f"signed {ref.key.prefix}: it was published unsigned; its model.sig is stored now",
                                  highlight=False)
            if ref is not None and server_configured():
                from prefect_executorch.tasks.events import emit_reused

                emit_reused(ref, "cli")
            if ref is None:
                from prefect_executorch.cli.embedded import embedded_settings
                from prefect_executorch.flows.build import build_bundle

                if prefect_start is None:
                    start_children(exports=True)
                    prefect_start = _start_prefect()
                with stage("start"):  # Prefect's API and the build's child processes; the probe alone is quick
                    api = prefect_start.result()
                with embedded_settings(api):
                    ref = build_bundle(spec, store=store, output=str(output) if output else None)
        except BaseException:
            if prefect_start is not None:
                prefect_start.abandon()
            raise
    print_build_summary(ref, view.seconds)


def _left_by(store: Any, name: str, version: str) -> str:
    """What an interrupted fresh build left: publishing is all or nothing (the manifest goes last)."""
    from prefect_executorch.artifacts.publishing import list_bundles

    published = list_bundles(store, name, version)
    return f"published {published[0].prefix} before it stopped" if published else NOTHING_PUBLISHED


def _start_prefect() -> ApiStart:
    """Start Prefect's ephemeral API in the background: the largest part of a CLI build's overhead then overlaps
    the probe and the children's imports."""
    # Prefect is imported here, not in the thread: its import runs plugin hooks and loads collections (ours
    # among them) while this thread imports our modules, and two threads importing both at once can meet in
    # Python's import locks ("Failed to initialize plugins: deadlock detected by _ModuleLock(...)"). The
    # children's server is already importing torch, which every later step waits for, so this costs nothing.
    import prefect.settings  # noqa: F401

    from prefect_executorch.cli.embedded import ApiStart

    return ApiStart()


def _check_here(spec: Any, toolchain: Any) -> None:
    """Refuse what this worker cannot build (``check_build``); print the target's warnings."""
    from prefect_executorch.targets import check_build

    for warning in check_build(spec, toolchain):
        err_console.print(f"[yellow]warning:[/] {escape(warning)}")


def _published_build(spec: Any, store: Any, toolchain: Any) -> Any:
    """An unchanged rebuild's published bundle, found without starting Prefect; a changed one is refused here."""
    from prefect_executorch.artifacts.rebuild import check_rebuild
    from prefect_executorch.targets import get_target

    target = get_target(spec.target_name)
    return check_rebuild(spec, toolchain, target.compat(spec, toolchain), store).ref


@app.command()
@handle_errors
def validate(
    spec_path: Path = typer.Argument(..., metavar="SPEC", help="Build spec (YAML or JSON)."),
    bundle_dir: Path | None = typer.Argument(None, metavar="BUNDLE_DIR", help="Directory with model.pte (a pulled bundle or an export)."),
    bundle: str | None = typer.Option(
        None, "--bundle", help="A published bundle: <store-url-or-dir>/<name>/<version>/<target>/<compat>/manifest.json; "
        "pulled, verified, then re-validated against the current eager model.",
    ),
    output: Path | None = typer.Option(None, "--output", help="Pull --bundle under this directory (default: temporary)."),
    report_path: Path | None = typer.Option(None, "--report", help="Also write the report as JSON to this file."),
    as_json: JsonOption = False,
) -> None:
    """Run a program and the eager model on the same inputs; exit 1 on a mismatch or a failed gate."""
    from prefect_executorch.errors import SpecError
    from prefect_executorch.scratch import scratch_dir
    from prefect_executorch.spec.buildspec import load_spec
    from prefect_executorch.validate.triage import triage_failure
    from prefect_executorch.validate.validator import require_passed, validate_program

    if (bundle_dir is None) == (bundle is None):
        raise SpecError("validate: give either BUNDLE_DIR or --bundle <.../manifest.json>, not both or neither")
    spec = load_spec(spec_path)
    spec.check_model_reference()
    start_children()
    with scratch_dir("validate", output) as root:
        if bundle is not None:
            from prefect_executorch.artifacts.locate import parse_manifest_url, pull_fresh
            from prefect_executorch.artifacts.urls import open_store

            store, key = parse_manifest_url(bundle)
            _same_model(spec, key.name, key.version, bundle)
            manifest, bundle_dir = pull_fresh(open_store(store), key, root)
            console.print(f"pulled and verified {key.prefix} ({len(manifest.files)} files) into {bundle_dir}")
            _revalidation_notes(spec, manifest)
            data_files, delegation = manifest.data_files, manifest.delegation()
        else:
            from prefect_executorch.artifacts.publishing import local_bundle

            assert bundle_dir is not None
            local, data_files, delegation = local_bundle(bundle_dir)
            if local is not None:
                _same_model(spec, local.name, local.version, str(bundle_dir))
        report = validate_program(spec, bundle_dir, data_files, scratch_dir=root, delegation=delegation)
        if report_path is not None:
            report_path.write_text(report.model_dump_json(indent=2))
        if as_json:
            sys.stdout.write(report.model_dump_json(indent=2) + "\n")
        else:
            print_report(report)
        require_passed(report, triage_failure(spec, report, bundle_dir, data_files, scratch_dir=root))
    if not as_json:
        console.print("[bold green]validation passed[/]")


def _revalidation_notes(spec: Any, manifest: Any) -> None:
    if manifest.spec_sha256 != spec.sha256():
        console.print(f"note: the spec differs from the one that built {manifest.key.prefix}")
    if spec.weights and manifest.weights_sha256:
        from prefect_executorch.hashing import sha256_file

        if sha256_file(spec.weights) != manifest.weights_sha256:
            console.print(f"note: the weights differ from those {manifest.key.prefix} was built from")


def _same_model(spec: Any, name: str, version: str, where: str) -> None:
    """Refuse to validate a bundle against another model's spec (its inputs and tolerances would not be its own)."""
    from prefect_executorch.errors import SpecError

    if (spec.name, spec.version) != (name, version):
        raise SpecError(f"validate: the spec is {spec.name} {spec.version} but {where} holds {name} {version}; "
                        "validate a bundle with the spec it was built from (a copy with only tolerances changed is fine)")


@app.command()
@handle_errors
def probe(as_json: JsonOption = False) -> None:
    """Show what this machine can build: versions, CUDA channel, GPUs, OS and arch."""
    from prefect_executorch.machine.toolchain import probe_isolated

    start_children()
    toolchain = probe_isolated()  # in a child: torch's import-time notes stay in its log
    if as_json:
        sys.stdout.write(toolchain.model_dump_json(indent=2) + "\n")
        return
    table = Table(title="toolchain", show_header=False)
    for key, value in toolchain.model_dump().items():
        table.add_row(key, str(value))
    console.print(table)
