"""Commands over published bundles: ``inspect``, ``verify``, ``pull``, ``promote``, ``generate``, ``transcribe``, ``ls``, ``gc``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape
from rich.table import Table

from prefect_executorch.cli.app import (
    AliasOption,
    EndpointOption,
    JsonOption,
    StoreOption,
    VersionOption,
    app,
    console,
    err_console,
    handle_errors,
    open_for_reading,
    server_configured,
)
from prefect_executorch.cli.render import METADATA_METHODS, SIGNED, UNSIGNED, count_names, generated_by, rows_table
from prefect_executorch.defaults import GC_GRACE_HOURS, MAX_LATENCY_REGRESSION
from prefect_executorch.errors import NotABundle, SpecError

if TYPE_CHECKING:
    from prefect_executorch.runtime.speech import SpeechBundle


@app.command()
@handle_errors
def inspect(
    bundle_dir: Path = typer.Argument(..., metavar="BUNDLE_DIR", help="A bundle directory (with manifest.json), e.g. from `pull --to`."),
    as_json: JsonOption = False,
) -> None:
    """Verify a bundle's files against its manifest and summarize it: key, compat, delegates, validation."""
    from prefect_executorch.artifacts.publishing import verify_bundle_dir
    from prefect_executorch.artifacts.signing import SIGNATURE_FILE
    from prefect_executorch.program import read_program
    manifest = verify_bundle_dir(bundle_dir)
    if as_json:
        sys.stdout.write(manifest.model_dump_json(indent=2) + "\n")
        return
    facts = read_program(bundle_dir / manifest.program)
    console.print(f"{manifest.key.prefix}: all {len(manifest.files)} files match the manifest")
    console.print(f"compat {manifest.compat}; built {manifest.created_at:%Y-%m-%d %H:%M}Z by {manifest.builder}")
    fractions = manifest.validation.delegated_fraction
    for name, method in facts.items():
        if name in METADATA_METHODS:
            continue  # an LLM's or a speech model's metadata for its consumer: constants, no computation
        fraction = fractions.get(name)
        share = f", {fraction:.0%} of operators delegated" if fraction is not None else ""
        console.print(f"  {name}: delegates {count_names(method.delegates)}{share}; "
                      f"{method.kernel_calls} portable kernel calls")
    verdict = "passed" if manifest.validation.passed else "[red]FAILED[/]"
    unit = "clips" if any(entry.role == "speech" for entry in manifest.files) else "prompts"
    cases = f"{unit} through {generated_by(manifest)}" if manifest.validation.generation_agreement is not None else "cases"
    console.print(f"validation {verdict}: {manifest.validation.cases} {cases}; worst: "
                  f"{escape(manifest.validation.worst or '-')}")
    console.print(SIGNED if (bundle_dir / SIGNATURE_FILE).is_file() else UNSIGNED)


@app.command()
@handle_errors
def verify(
    bundle_dir: Path = typer.Argument(..., metavar="BUNDLE_DIR", help="A bundle directory (with manifest.json and its test cases)."),
    cpp: bool = typer.Option(False, "--cpp", help="Run the cases through ExecuTorch's C++ runtime (a consumer built "
                             "against the installed wheel with CMake, as a C++ service links it) instead of Python's."),
) -> None:
    """Check every file against the manifest, then run the bundle's own test cases on this machine."""
    from prefect_executorch.artifacts.publishing import verify_bundle_dir

    manifest = verify_bundle_dir(bundle_dir)
    if not cpp:
        console.print(f"[bold green]{_run_own_cases(bundle_dir, manifest)}[/]")
        return
    from prefect_executorch.runtime.cpp_consumer import run_cpp_consumer

    if any(entry.role == "generation" for entry in manifest.files):
        raise NotABundle(f"{bundle_dir} is a decoder-LM bundle: its C++ check needs ExecuTorch's LLM runner library, "
                         "which the ExecuTorch wheel does not ship; verify it without --cpp (the runner's Python "
                         "binding runs the same C++ runner)")
    if any(entry.role == "speech" for entry in manifest.files):
        raise NotABundle(f"{bundle_dir} is a speech bundle: its C++ check needs ExecuTorch's seq2seq runner "
                         "(extension/asr/runner), which the ExecuTorch wheel does not ship (docs/asr.md); verify it "
                         "without --cpp")
    check = run_cpp_consumer(bundle_dir, manifest)
    for line in check.lines[:-1]:
        console.print(escape(line), highlight=False)
    console.print(f"[bold green]all {check.cases} bundled cases pass through ExecuTorch's C++ runtime[/]")


def speech_bundle(folder: Path, manifest: Any) -> SpeechBundle:
    """A speech bundle's folder and its manifest's program, data files, target and runtime hints, as a child runs it."""
    from prefect_executorch.runtime.speech import SpeechBundle

    return SpeechBundle(bundle_dir=str(folder), program=manifest.program, target=manifest.target,
                        data_files=manifest.data_files, runtime_hints=manifest.runtime_hints)


def _run_own_cases(bundle_dir: Path, manifest: Any, scratch_dir: Path | None = None, shown_as: Path | None = None) -> str:
    """Run a bundle's own test cases here: a decoder LM's prompts through the LLM runner, a speech model's clips
    through its program, else its ``.bpte``.

    One child, so spawned: the forkserver's export imports cost ~4 s more than the runtime's own.
    """
    if any(entry.role == "generation" for entry in manifest.files):
        from prefect_executorch.validate.generation import run_generation_cases

        report = run_generation_cases(bundle_dir, manifest.target, manifest.data_files, scratch_dir=scratch_dir,
                                      shown_as=shown_as, start="spawn", runtime_hints=manifest.runtime_hints)
        return f"all {len(report.cases)} prompts generate eager's tokens through {report.generated_by} on this machine"
    if any(entry.role == "speech" for entry in manifest.files):
        from prefect_executorch.validate.transcription import run_transcription_cases

        report = run_transcription_cases(speech_bundle(bundle_dir, manifest), scratch=scratch_dir, shown_as=shown_as,
                                         start="spawn")
        return f"all {len(report.cases)} clips transcribe as validated through {report.generated_by} on this machine"
    from prefect_executorch.runtime.bundled_cases import run_bundled_cases

    check = run_bundled_cases(bundle_dir, manifest.target, manifest.data_files, manifest.bundled,
                              scratch_dir=scratch_dir, shown_as=shown_as, start="spawn",
                              runtime_hints=manifest.runtime_hints)
    return f"all {len(check.results)} bundled cases pass on this machine ({', '.join(sorted({r.method for r in check.results}))})"


@app.command()
@handle_errors
def pull(
    name: str = typer.Argument(..., metavar="NAME", help="Model name."),
    to: Path = typer.Option(..., "--to", help="New directory to create with the verified bundle."),
    version: str | None = typer.Option(None, "--version", help="Version to pull."),
    alias: str | None = typer.Option(None, "--alias", help="Alias to pull (prod, staging...)."),
    target: str | None = typer.Option(None, "--target", help="Only bundles of this target."),
    compat: str = typer.Option("auto", "--compat", help="'auto' (fits this machine) or a compat key."),
    store: StoreOption = None,
    endpoint_url: EndpointOption = None,
    run_cases: bool = typer.Option(False, "--verify", help="Also run the bundle's test cases (model.bpte, an LLM's prompts) here first."),
) -> None:
    """Download a bundle, verify every sha256 and the .pte/.ptd pairing, then move it into place."""
    from prefect_executorch.artifacts import publishing
    from prefect_executorch.artifacts.catalog import resolve

    opened = open_for_reading(store, endpoint_url)
    resolved = resolve(opened, name, version=version, alias=alias, target=target, compat=compat)
    ran: list[str] = []
    manifest = publishing.pull(opened, resolved.key, to, manifest_sha256=resolved.manifest_sha256, check=(
        (lambda staged, got: ran.append(_run_own_cases(staged, got, scratch_dir=to.parent, shown_as=to)))
        if run_cases else None))
    console.print(f"[bold green]pulled[/] {resolved.key.prefix} ({resolved.reason}) into {to}")
    console.print(f"{len(manifest.files)} files verified; program {manifest.program}"
                  + (f" with {', '.join(manifest.data_files)}" if manifest.data_files else "")
                  + "".join(f"; {line}" for line in ran))


@app.command()
@handle_errors
def promote(
    name: str = typer.Argument(..., metavar="NAME", help="Model name."),
    version: str = typer.Argument(..., metavar="VERSION", help="Version to promote."),
    alias: str = typer.Option(..., "--alias", help="Alias to move (prod, staging...)."),
    target: str | None = typer.Option(None, "--target", help="Bundle target, if the version has several."),
    compat: str | None = typer.Option(None, "--compat", help="Bundle compat key, if the version has several."),
    force: bool = typer.Option(
        False, "--force", help="Promote over a failed validation or side-by-side gate (recorded in the alias)."),
    expect_version: str | None = typer.Option(
        None, "--expect-version", help="Only move the alias if it points at this version now."),
    max_latency_regression: float = typer.Option(
        MAX_LATENCY_REGRESSION, "--max-latency-regression", min=0.0, help="Refuse a candidate whose p50 is this much slower than the alias's (0.1: 10%)."),
    allow_output_change: bool = typer.Option(
        False, "--allow-output-change", help="New weights: gate latency only (the output comparison is still recorded)."),
    spec_file: Path | None = typer.Option(
        None, "--spec", help="Spec whose validation tolerances and latency settings the side-by-side uses."),
    store: StoreOption = None,
    endpoint_url: EndpointOption = None,
    as_json: JsonOption = False,
) -> None:
    """Point an alias at a validated bundle that agrees with and is no slower than the alias's (compare-and-swap)."""
    from prefect_executorch.artifacts.promotion import PromotionRequest, promote_checked
    from prefect_executorch.spec.buildspec import load_spec
    from prefect_executorch.spec.validation import ValidationSpec

    request = PromotionRequest(
        name=name, version=version, alias=alias, target=target, compat=compat, force=force,
        expect_version=expect_version, max_latency_regression=max_latency_regression,
        allow_output_change=allow_output_change, validation=load_spec(spec_file).validation if spec_file else ValidationSpec())
    opened = open_for_reading(store, endpoint_url)
    if server_configured():  # its events go there once the alias moved: the server must answer first
        from prefect_executorch.fleet.server import require_prefect_api

        require_prefect_api()
    promotion = promote_checked(opened, request)
    record = promotion.record
    if as_json:
        sys.stdout.write(record.model_dump_json(indent=2) + "\n")
        return
    if record.comparison is not None:
        console.print(rows_table(f"{alias}: {version} beside the bundle it held", record.comparison.rows()))
    if not promotion.moved:
        console.print(f"already: {record.describe()}; nothing moved")
        return
    previous = record.previous
    was = f" (was {previous.version} {previous.target}/{previous.compat})" if previous else ""
    console.print(f"[bold green]promoted[/] {record.describe()}{was}")
    if server_configured():
        from prefect_executorch.tasks.events import emit_promoted

        emit_promoted(record, opened.url)
    for line in record.overridden:
        console.print(f"[yellow]forced over:[/] {escape(line)}")


@app.command()
@handle_errors
def generate(
    bundle: str = typer.Argument(..., metavar="BUNDLE", help="A decoder-LM bundle: its folder, or its model name in the store."),
    prompt: str = typer.Argument(..., metavar="PROMPT", help="Text to continue."),
    new_tokens: int = typer.Option(32, "--new-tokens", min=1, help="Tokens to generate at most (greedy)."),
    version: VersionOption = None,
    alias: AliasOption = None,
    store: StoreOption = None,
    endpoint_url: EndpointOption = None,
) -> None:
    """Continue PROMPT with a decoder-LM bundle (ExecuTorch's LLM runner; a cuda bundle one token per call); print the text and its speed.

    A model name without --version or --alias runs its newest version that fits this machine, and says which."""
    from prefect_executorch.runtime.llm_runner import generate as run_generate
    from prefect_executorch.scratch import scratch_dir

    with scratch_dir("generate") as scratch:
        folder, manifest = _bundle_here(bundle, version, alias, store, endpoint_url, scratch, "generate")
        if not any(entry.role == "generation" for entry in manifest.files):
            raise NotABundle(f"{manifest.key.prefix} is no decoder-LM bundle (its files have no LLM role); `generate` "
                             "runs bundles built from an `llm:` spec")
        new_tokens = _room_for(folder, manifest.runtime_hints, prompt, new_tokens)
        console.print(escape(prompt), end="", highlight=False)

        def show(text: str) -> None:
            console.print(escape(text), end="", highlight=False)
            console.file.flush()

        try:
            generated = run_generate(folder, manifest.target, manifest.data_files, prompt, new_tokens, on_text=show,
                                     start="spawn", runtime_hints=manifest.runtime_hints)
        finally:
            console.print()  # the streamed text's line ends before any message
    stats = generated.stats
    speeds = [f"{label} {value:,.0f}{unit}" for label, value, unit in (
        ("prefill", stats.prefill_tokens_per_s, " tokens/s"), ("decode", stats.decode_tokens_per_s, " tokens/s"),
        ("first token", stats.time_to_first_token_ms, " ms")) if value is not None]
    err_console.print(f"{len(generated.pieces)} tokens by {generated.generated_by}; " + ", ".join(speeds), highlight=False)


def _bundle_here(bundle: str, version: str | None, alias: str | None, store: str | None, endpoint_url: str | None,
                 scratch: Path, command: str) -> tuple[Path, Any]:
    """BUNDLE's folder and verified manifest: the folder itself, or its model's version pulled into ``scratch`` (the
    newest that runs here when neither ``version`` nor ``alias`` is given, said)."""
    from prefect_executorch.artifacts import publishing
    from prefect_executorch.artifacts.manifest import MANIFEST_FILE

    # A model name is one path segment; a folder is a path, or the folder of a bundle here.
    if "/" in bundle or (Path(bundle) / MANIFEST_FILE).is_file():
        return Path(bundle), publishing.verify_bundle_dir(Path(bundle))
    from prefect_executorch.artifacts.catalog import newest_fitting_version, resolve
    from prefect_executorch.machine.toolchain import probe

    opened = open_for_reading(store, endpoint_url)
    toolchain = probe()
    if version is None and alias is None:
        version = newest_fitting_version(opened, bundle, toolchain)
        err_console.print(f"{bundle} {version}: the newest version that runs here (choose with --version or --alias)",
                          highlight=False)
    resolved = resolve(opened, bundle, version=version, alias=alias, compat="auto", toolchain=toolchain,
                       command=command)
    folder = scratch / "bundle"
    return folder, publishing.pull(opened, resolved.key, folder, manifest_sha256=resolved.manifest_sha256)


@app.command()
@handle_errors
def transcribe(
    bundle: str = typer.Argument(..., metavar="BUNDLE", help="A speech bundle: its folder, or its model name in the store."),
    audio: Path = typer.Argument(..., metavar="AUDIO", help="A 16-bit PCM WAV file at the model's sampling rate, no "
                                 "longer than its encoder's window (30 s for Whisper)."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", min=1, help="Tokens to transcribe at most "
                                              "(greedy; default: as many as the bundle's decoder cache holds)."),
    version: VersionOption = None,
    alias: AliasOption = None,
    store: StoreOption = None,
    endpoint_url: EndpointOption = None,
) -> None:
    """Transcribe AUDIO with a speech bundle (its encoder once, its decoder a token a call); print the text, then its
    real-time factor.

    A model name without --version or --alias runs its newest version that fits this machine, and says which."""
    from prefect_executorch.runtime.speech import transcribe as run_transcribe
    from prefect_executorch.scratch import scratch_dir

    if not audio.is_file():
        raise SpecError(f"AUDIO: {audio} is not a file; give a 16-bit PCM WAV file")
    with scratch_dir("transcribe") as scratch:
        folder, manifest = _bundle_here(bundle, version, alias, store, endpoint_url, scratch, "transcribe")
        if not any(entry.role == "speech" for entry in manifest.files):
            raise NotABundle(f"{manifest.key.prefix} is no speech bundle (its files have no speech role); `transcribe` "
                             "runs bundles built from an `asr:` spec")
        transcript = run_transcribe(speech_bundle(folder, manifest), audio, max_new_tokens, scratch, start="spawn")
    console.print(escape(transcript.text), highlight=False)
    if transcript.capped_at is not None:
        err_console.print(f"--max-new-tokens {max_new_tokens}: this bundle's decoder cache holds {transcript.capped_at} "
                          "new tokens; transcribed at most that many", highlight=False)
    decode = transcript.stats.decode_tokens_per_s
    err_console.print(
        f"real-time factor {transcript.real_time_factor:.3f}: {transcript.features_s + transcript.program_s:.2f} s for "
        f"{transcript.audio_s:.2f} s of audio (features {transcript.features_s * 1000:.0f} ms, encoder and start "
        f"tokens {transcript.stats.time_to_first_token_ms or 0:.0f} ms, {len(transcript.tokens)} tokens"
        + (f" at {decode:,.0f} tokens/s" if decode else "") + f") through {manifest.target}", highlight=False)


def _room_for(bundle: Path, hints: dict[str, Any], prompt: str, new_tokens: int) -> int:
    """``new_tokens``, or fewer where the prompt leaves less room in the bundle's cache (said); a prompt the cache
    cannot hold is refused before anything runs."""
    from tokenizers import Tokenizer

    from prefect_executorch.spec.causal_lm import prompt_ids
    from prefect_executorch.spec.llm import TOKENIZER_FILE

    length = (hints.get("llm") or {}).get("max_seq_len")
    if length is None:  # a bundle from before the manifest said it: the runner caps, and says why if it fails
        return new_tokens
    tokens = len(prompt_ids(Tokenizer.from_file(str(bundle / TOKENIZER_FILE)), prompt))
    if tokens >= length:
        raise SpecError(f"PROMPT is {tokens} tokens and this bundle's KV cache holds {length} positions (the prompt "
                        "and every token generated): shorten the prompt, or build the model with a larger "
                        "llm.max_seq_len")
    room = length - tokens
    if new_tokens > room:
        err_console.print(f"--new-tokens {new_tokens}: the {tokens}-token prompt leaves room for {room} in this "
                          f"bundle's {length}-position cache; generating at most {room}", highlight=False)
    return min(new_tokens, room)


@app.command("ls")
@handle_errors
def ls_command(
    name: str | None = typer.Argument(None, metavar="NAME", help="Model name (default: list the store's models)."),
    as_json: JsonOption = False,
    store: StoreOption = None,
    endpoint_url: EndpointOption = None,
) -> None:
    """List a model's versions, targets, compat keys and aliases; without NAME, the store's models."""
    from prefect_executorch.artifacts.catalog import ls, models, require_model

    opened = open_for_reading(store, endpoint_url)
    if name is None:
        names = models(opened)
        if as_json:
            sys.stdout.write(json.dumps({"store": opened.url, "models": names}, indent=2) + "\n")
            return
        console.print("\n".join(names) if names else f"no published models in {opened.url}")
        return
    require_model(opened, name)
    listing = ls(opened, name)
    if as_json:
        sys.stdout.write(listing.model_dump_json(indent=2) + "\n")
        return
    table = Table(title=f"{name} in {listing.store}")
    for column in ("version", "target", "compat", "aliases"):
        table.add_column(column)
    for key in listing.bundles:
        pointing = [a for a, r in listing.aliases.items() if r.bundle_key() == key]
        table.add_row(key.version, key.target, key.compat, ", ".join(sorted(pointing)))
    console.print(table)
    for record in listing.aliases.values():
        console.print(f"alias {record.describe()}")
    for prefix in listing.incomplete:
        console.print(f"[yellow]incomplete (no manifest):[/] {prefix}")


@app.command("gc")
@handle_errors
def gc_command(
    name: str | None = typer.Argument(None, metavar="NAME", help="Only this model (default: the whole store)."),
    apply: bool = typer.Option(False, "--apply", help="Remove what was found (default: dry run)."),
    grace_hours: float = typer.Option(GC_GRACE_HOURS, "--grace-hours", min=0, help="Leave anything younger than this."),
    store: StoreOption = None,
    endpoint_url: EndpointOption = None,
) -> None:
    """Find objects of bundles that never got a manifest, and unfinished uploads, older than the grace period."""
    import math
    from datetime import timedelta

    from prefect_executorch.artifacts.gc import gc

    # click's min=0 lets nan through (no comparison with nan is true), and timedelta overflows past ~10^10 h.
    if not math.isfinite(grace_hours) or grace_hours > 24 * 366 * 100:
        raise SpecError(f"--grace-hours: expected a number of hours in [0, {24 * 366 * 100}], got {grace_hours}")
    opened = open_for_reading(store, endpoint_url)
    if name is not None:
        from prefect_executorch.artifacts.catalog import require_model

        require_model(opened, name)
    report = gc(opened, name, grace=timedelta(hours=grace_hours), apply=apply)
    verb = "removed" if apply else "would remove"
    for info in report.orphans:
        console.print(f"{verb} {info.key} ({info.size} bytes, {info.last_modified:%Y-%m-%d %H:%M}Z)")
    for upload in report.uploads:
        console.print(f"{verb} unfinished upload of {upload.key} (started {upload.started:%Y-%m-%d %H:%M}Z)")
    console.print(f"{len(report.orphans)} orphaned objects, {len(report.uploads)} unfinished uploads; "
                  f"{report.kept_recent} younger than {grace_hours:g} h kept"
                  + ("" if apply else "; dry run: pass --apply to remove them"))
