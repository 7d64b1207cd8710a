"""The CLI as a user meets it: summaries, cache hits, refusals before export, consistent commands."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import CLI_NOISE, cpu_burner, session_api, settled, spec_data

CLI = [sys.executable, "-m", "prefect_executorch.cli"]
#: The CLI children report to the session's Prefect API (helpers.session_api); the tests of the embedded API, of
#: an interrupted build and of a refused one start their own, as a user's CLI does.
pytestmark = pytest.mark.usefixtures("prefect_harness")
MLP = {"methods": {"forward": {"inputs": [{"name": "x", "shape": [3, 32]}]}}, "target": "portable"}


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess, with the store under ``cwd``."""
    env = {**os.environ, **session_api(), "PREFECT_EXECUTORCH_STORE": str(cwd / "store")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def write_spec(path: Path, factory: str = "mlp", **overrides: Any) -> Path:
    """A JSON spec of a tests/models.py factory."""
    path.write_text(json.dumps(spec_data(factory, **{**MLP, **overrides})))
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A work directory whose store holds mlp 1 (portable), built once through the CLI."""
    work = tmp_path_factory.mktemp("cli")
    result = run_cli("build", str(write_spec(work / "spec.json")), cwd=work)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "fresh build: mlp/1/portable/" in result.stdout
    assert "stages: probe" in result.stdout and "export" in result.stdout and "publish" in result.stdout
    assert not [word for word in CLI_NOISE if word in result.stdout + result.stderr], result.stderr
    return work


def test_unchanged_rebuild_says_cache_hit_and_exports_nothing(built: Path) -> None:
    result = run_cli("build", str(built / "spec.json"), "--output", str(built / "out-hit"), cwd=built)
    assert result.returncode == 0, result.stderr
    assert "cache hit (unchanged rebuild, nothing exported): mlp/1/portable/" in result.stdout
    assert "compat cpu-portable-" in result.stdout
    assert not (built / "out-hit").exists()  # no export directory was even made


def test_changed_build_of_a_published_version_is_refused_before_export(built: Path) -> None:
    changed = write_spec(built / "changed.json", validation={"samples": 2})
    result = run_cli("build", str(changed), "--output", str(built / "out-changed"), cwd=built)
    assert result.returncode == 1
    assert "BundleConflict: mlp/1/portable/" in result.stderr
    assert "by a different build (spec fields changed: validation.samples); nothing was exported" in result.stderr
    assert not (built / "out-changed").exists()


def test_a_moved_copy_with_an_edited_model_is_refused_for_its_source_not_its_path(tmp_path: Path) -> None:
    import shutil

    first = tmp_path / "first"
    first.mkdir()
    shutil.copy(Path(__file__).parents[2] / "examples" / "convnet" / "model.py", first / "model.py")
    (first / "spec.json").write_text(json.dumps(spec_data("convnet", model="model.py:build", target="portable",
                                                          methods={"forward": {"inputs": [{"name": "x", "shape": [1, 3, 8, 8]}]}})))
    store = str(tmp_path / "store")
    assert run_cli("build", str(first / "spec.json"), "--store", store, cwd=tmp_path).returncode == 0
    moved = tmp_path / "elsewhere" / "moved"
    shutil.copytree(first, moved)
    same = run_cli("build", str(moved / "spec.json"), "--store", store, cwd=tmp_path)
    assert same.returncode == 0 and "cache hit" in same.stdout  # another folder alone changes nothing
    source = (moved / "model.py").read_text()
    (moved / "model.py").write_text(source.replace("num_classes: int = 10", "num_classes: int = 12"))
    edited = run_cli("build", str(moved / "spec.json"), "--store", store, cwd=tmp_path)
    assert edited.returncode == 1
    assert "by a different build (the model's source file changed" in edited.stderr, edited.stderr
    assert "spec" not in edited.stderr.split("by a different build")[1].split(")")[0]


def test_ls_without_a_name_lists_models_and_unknown_models_exit_1(built: Path) -> None:
    listed = run_cli("ls", "--json", cwd=built)
    assert listed.returncode == 0 and json.loads(listed.stdout)["models"] == ["mlp"]
    for command in (["ls", "nosuch"], ["gc", "nosuch"]):
        result = run_cli(*command, cwd=built)
        assert result.returncode == 1, command
        assert "BundleNotFound: no model nosuch in" in result.stderr and "models there: mlp" in result.stderr


def test_pull_of_an_unknown_model_lists_the_models_there(built: Path) -> None:
    result = run_cli("pull", "nosuch", "--version", "1", "--to", str(built / "nosuch"), cwd=built)
    assert result.returncode == 1
    assert "no model nosuch in" in result.stderr and "models there: mlp" in result.stderr


def test_inspect_of_a_folder_that_is_no_bundle_is_a_usage_error(built: Path) -> None:
    (built / "empty").mkdir(exist_ok=True)
    for command in ("inspect", "verify"):
        result = run_cli(command, str(built / "empty"), cwd=built)
        assert result.returncode == 2, (command, result.stderr)
        assert result.stderr.startswith("NotABundle: ") and "has no manifest.json, so it is no bundle" in result.stderr


def test_pull_into_an_existing_folder_is_a_usage_error(built: Path) -> None:
    (built / "taken").mkdir(exist_ok=True)
    result = run_cli("pull", "mlp", "--version", "1", "--to", str(built / "taken"), cwd=built)
    assert result.returncode == 2
    assert result.stderr.startswith("DestinationExists: destination") and "already exists" in result.stderr


def test_promote_to_a_missing_version_lists_the_versions(built: Path) -> None:
    result = run_cli("promote", "mlp", "9", "--alias", "prod", cwd=built)
    assert result.returncode == 1
    assert "no bundle of mlp version 9 in" in result.stderr and "versions of mlp there: 1" in result.stderr
    assert "published: none" not in result.stderr  # it said so beside "versions there: 1"
    other = run_cli("promote", "mlp", "1", "--alias", "prod", "--target", "xnnpack", cwd=built)
    assert other.returncode == 1 and "matches target=xnnpack" in other.stderr and "its bundles: portable/" in other.stderr


def test_inspect_summarizes_and_validate_accepts_the_pulled_folder(built: Path) -> None:
    pulled = built / "pulled"
    assert run_cli("pull", "mlp", "--version", "1", "--to", str(pulled), cwd=built).returncode == 0
    summary = run_cli("inspect", str(pulled), cwd=built)
    assert summary.returncode == 0, summary.stderr
    assert "mlp/1/portable/" in summary.stdout and "files match the manifest" in summary.stdout
    assert "forward: delegates none" in summary.stdout and "validation passed" in summary.stdout
    raw = run_cli("inspect", str(pulled), "--json", cwd=built)
    assert json.loads(raw.stdout)["name"] == "mlp"
    validated = run_cli("validate", str(built / "spec.json"), str(pulled), cwd=built)
    assert validated.returncode == 0, validated.stderr
    assert "validation passed" in validated.stdout


def _noise(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [word for word in CLI_NOISE if word in result.stdout + result.stderr]


def test_commands_that_start_children_print_no_third_party_noise(built: Path) -> None:
    # verify, pull --verify and promote start their children lazily, validate at once: none may print
    # what the forkserver's imports say (torchao's optional kernels, torch's _pytree notes).
    pulled = built / "pulled-quiet"
    commands = [["pull", "mlp", "--version", "1", "--to", str(pulled), "--verify"], ["verify", str(pulled)],
                ["validate", str(built / "spec.json"), str(pulled)], ["promote", "mlp", "1", "--alias", "quiet"]]
    for command in commands:
        result = run_cli(*command, cwd=built)
        assert result.returncode == 0, (command, result.stderr)
        assert not _noise(result), (command, _noise(result), result.stderr)


def test_tables_fit_80_columns_and_json_has_every_value(built: Path) -> None:
    pulled = built / "pulled-narrow"
    assert run_cli("pull", "mlp", "--version", "1", "--to", str(pulled), cwd=built).returncode == 0
    narrow = {**os.environ, "COLUMNS": "80", "PREFECT_EXECUTORCH_STORE": str(built / "store")}
    result = subprocess.run([*CLI, "validate", str(built / "spec.json"), str(pulled)], capture_output=True, text=True,
                            cwd=built, env=narrow, timeout=600)
    assert result.returncode == 0, result.stderr
    table_lines = [line for line in result.stdout.splitlines() if line.startswith(" ")]  # prose lines wrap
    assert table_lines and max(map(len, table_lines)) <= 80 and "…" not in result.stdout, result.stdout
    # promote's side-by-side table, its worst disagreement a long line: under the table, whole.
    from rich.console import Console

    from prefect_executorch.cli.render import rows_table
    from prefect_executorch.validate.sidebyside import ComparisonRow

    worst = "output [0] at static [[2, 32]]: 100.00% of elements beyond atol=0.0001 + rtol=1e-05*|eager| from default"
    row = ComparisonRow(method="forward_with_a_long_name", inputs=12, disagreeing=12, current_p50_ms=0.0812345,
                        candidate_p50_ms=0.0923456, current_p99_ms=0.12, candidate_p99_ms=0.14, regression=0.1367,
                        stable=True, worst=worst)
    console = Console(width=80, record=True, soft_wrap=True)
    console.print(rows_table("prod: 2 beside the bundle it held", [row]))
    shown = console.export_text()
    assert "…" not in shown and "0.0812" in shown and "forward_with_a_long_name" in shown and worst in shown, shown
    report = json.loads(run_cli("validate", str(built / "spec.json"), str(pulled), "--json", cwd=built).stdout)
    assert report["passed"] and report["cases"][0]["outputs"][0]["max_abs"] is not None
    assert json.loads(run_cli("promote", "mlp", "1", "--alias", "narrow", "--json", cwd=built).stdout)["version"] == "1"
    again = run_cli("promote", "mlp", "1", "--alias", "narrow", cwd=built)
    assert again.returncode == 0 and again.stdout.startswith("already: narrow -> mlp 1") and "nothing moved" in again.stdout


def test_debug_is_accepted_after_the_command_too(built: Path) -> None:
    plain = run_cli("inspect", str(built / "nothing-here"), cwd=built)
    assert "Traceback" not in plain.stderr and "No such option" not in plain.stderr
    for args in (["--debug", "inspect", str(built / "nothing-here")], ["inspect", str(built / "nothing-here"), "--debug"]):
        result = run_cli(*args, cwd=built)
        # --debug: the traceback, and the exit code the plain command has
        assert result.returncode == plain.returncode == 2 and "Traceback" in result.stderr, (args, result.stderr[-500:])


def test_validate_refuses_a_spec_of_another_model_or_version(built: Path) -> None:
    pulled = built / "pulled-other"
    assert run_cli("pull", "mlp", "--version", "1", "--to", str(pulled), cwd=built).returncode == 0
    other = write_spec(built / "other-version.json", version="2")
    result = run_cli("validate", str(other), str(pulled), cwd=built)
    assert result.returncode == 2
    assert "the spec is mlp 2 but" in result.stderr and "holds mlp 1" in result.stderr


def test_help_is_whole_and_imports_neither_torch_nor_prefect(tmp_path: Path) -> None:
    result = subprocess.run([*CLI[:1], "-X", "importtime", *CLI[1:], "--help"], capture_output=True, text=True,
                            cwd=tmp_path, timeout=60)
    assert result.returncode == 0
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time")}
    assert not {name for name in imported if name.split(".")[0] in ("torch", "prefect", "executorch")}
    commands = result.stdout.split("Commands:")[1].splitlines()
    assert len(commands) > 5 and not [line for line in commands if line.rstrip().endswith("...")]  # piped: never cut
    assert "<bool>" not in run_cli("ls", "--help", cwd=tmp_path).stdout


BERT = {"methods": {"forward": {"inputs": [
    {"name": "input_ids", "dtype": "int64", "shape": [1, 8], "high": 64,
     "dynamic": {1: {"min": 2, "max": 16, "name": "seq"}}}]}}, "target": "xnnpack"}


def test_a_transformers_bert_from_a_config_builds_through_the_cli(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    result = run_cli("build", str(write_spec(tmp_path / "bert.json", "tiny_bert", **BERT)), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "fresh build: tiny-bert/1/xnnpack/" in result.stdout and "XnnpackBackend ×" in result.stdout


def test_ids_outside_the_vocabulary_are_blamed_on_the_inputs_range(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    spec = json.loads(json.dumps(BERT))
    spec["methods"]["forward"]["inputs"][0]["high"] = 1000
    result = run_cli("build", str(write_spec(tmp_path / "bert.json", "tiny_bert", **spec)), cwd=tmp_path)
    assert result.returncode == 1
    assert "ExportFailed: stage eager run: method 'forward' with inputs (input_ids: int64 [1, 8] in [0, 1000))" \
        in result.stderr
    assert "IndexError" in result.stderr and "set methods.forward.inputs[].low/high" in result.stderr


def test_gc_apply_leaves_no_empty_folders(tmp_path: Path) -> None:
    from prefect_executorch.artifacts.store import LocalStore

    store = LocalStore(tmp_path / "store")
    store.put_bytes("lost/1/portable/cpu-portable-x86_64/model.pte", b"an upload whose manifest never came")
    store.put_bytes("kept/1/portable/cpu-portable-x86_64/manifest.json", b"{}")
    result = run_cli("gc", "--apply", "--grace-hours", "0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "removed lost/1/portable/cpu-portable-x86_64/model.pte" in result.stdout
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["kept"]  # no empty lost/1/portable/...


def test_the_children_start_before_prefect_is_imported(tmp_path: Path) -> None:
    """The child server's imports (torch, ExecuTorch) are a build's longest wait: they must not queue behind Prefect's."""
    demo = Path(__file__).resolve().parents[2] / "examples" / "convnet" / "spec.yaml"
    script = """
import runpy, sys
import prefect_executorch.isolation as isolation
def warm_up(quiet=False, exports=False):
    print("prefect imported when the children started:", "prefect" in sys.modules)
    raise SystemExit(0)
isolation.warm_up = warm_up
sys.argv = ["prefect-executorch", *sys.argv[1:]]
runpy.run_module("prefect_executorch.cli", run_name="__main__")
"""
    done = subprocess.run([sys.executable, "-c", script, "build", str(demo), "--store", str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=120)
    assert "prefect imported when the children started: False" in done.stdout, done.stdout + done.stderr


def test_the_embedded_api_runs_the_flow_without_prefect_server_in_the_cli_and_stops_with_it(tmp_path: Path) -> None:
    """The CLI starts Prefect's ephemeral API itself (embedded.EphemeralApi), not through an in-process import."""
    home = tmp_path / "prefect-home"
    script = """
import atexit, runpy, sys
atexit.register(lambda: print("prefect.server in the CLI:", "prefect.server.api.server" in sys.modules))
sys.argv = ["prefect-executorch", *sys.argv[1:]]
runpy.run_module("prefect_executorch.cli", run_name="__main__")
"""
    env = {**{k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}, "PREFECT_HOME": str(home),
           "PREFECT_EXECUTORCH_STORE": str(tmp_path / "store")}
    done = subprocess.run([sys.executable, "-c", script, "build", str(write_spec(tmp_path / "spec.json"))],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fresh build: mlp/1/portable/" in done.stdout
    assert "prefect.server in the CLI: False" in done.stdout
    with sqlite3.connect(home / "prefect.db") as db:  # the run went to this home's embedded API
        assert db.execute("select state_type from flow_run").fetchall() == [("COMPLETED",)]
    survivors = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if f"PREFECT_HOME={home}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                survivors.append(pid)
        except OSError:
            continue
    assert survivors == []


def test_prefect_is_imported_before_the_api_thread_starts(tmp_path: Path) -> None:
    """Prefect's import loads collections (ours too): in a second thread beside ours it could deadlock on import locks."""
    script = """
import sys
from prefect_executorch.cli.build import _start_prefect
future = _start_prefect()
prefect = sys.modules.get("prefect")
print("prefect imported when the thread started:", prefect is not None and not prefect.__spec__._initializing)
api = future.result()
if api is not None:
    api.stop()
"""
    env = {**{k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}, "PREFECT_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "prefect imported when the thread started: True" in done.stdout, done.stdout + done.stderr


def _processes_with(marker: str) -> list[str]:
    """Command lines of the processes whose environment carries ``marker`` (this command and all it started)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes():
                found.append((environ.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:120])
        except OSError:
            continue
    return found


#: When each interrupt comes: seconds after the CLI starts (its probe, forkserver and Prefect start up), or
#: after the export child's folder appears (the child starting, then running).
INTERRUPTS = {"ctrl-c": [("start", 0.5), ("start", 2.0), ("export", 0.0), ("export", 1.0)], "sigterm": [("start", 3.0), ("export", 0.5)]}


@pytest.mark.parametrize(("how", "status"), [("ctrl-c", 130), ("sigterm", 143)])
def test_an_interrupted_build_stops_everything_within_seconds(tmp_path: Path, how: str, status: int) -> None:
    """Repeated at several moments, with a CPU-bound process beside it: CI's load once hid a build that never exited."""
    with cpu_burner():
        for attempt, (moment, delay) in enumerate(INTERRUPTS[how]):
            _interrupt_a_build(tmp_path / f"{attempt}-{moment}-{delay}", how, status, moment, delay)


def _interrupt_a_build(work: Path, how: str, status: int, moment: str, delay: float) -> None:
    import signal
    import time
    import uuid

    work.mkdir()
    spec = write_spec(work / "spec.json", "hangs")  # its export child never finishes by itself
    marker = f"PREFECT_EXECUTORCH_TEST_MARKER={uuid.uuid4().hex}"
    env = {**os.environ, "PREFECT_EXECUTORCH_STORE": str(work / "store"), marker.split("=")[0]: marker.split("=")[1],
           "PYTHONFAULTHANDLER": "1"}  # a native crash on the way out prints where each thread was (CI once saw -6, silent)
    # Its own process group, as a terminal's foreground job: Ctrl-C reaches every process in it.
    cli = subprocess.Popen([*CLI, "build", str(spec), "--output", str(work / "out")], cwd=work, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while moment == "export" and not list((work / "out").glob(".export-*")) and time.monotonic() < deadline:
        time.sleep(0.1)  # until the export child starts
    assert cli.poll() is None, cli.communicate()
    time.sleep(delay)
    sent = time.monotonic()
    if how == "ctrl-c":
        os.killpg(cli.pid, signal.SIGINT)
    else:
        cli.send_signal(signal.SIGTERM)
    where = f"{how} at {moment} + {delay} s"
    try:
        cli.wait(timeout=60)
        took = time.monotonic() - sent
        # Its output ends when the last process holding its pipes does: one left running shows here, named.
        out, err = cli.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        raise AssertionError((where, f"exit status {cli.poll()}", "still running:", _processes_with(marker))) from None
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
    assert cli.returncode == status, (where, out, err)
    assert err.strip() == "interrupted: nothing published", (where, err)
    assert took < 5, (where, took)
    assert settled(lambda: _processes_with(marker)) == [], where  # forkserver, export child and Prefect's API are gone
    assert not (work / "store").exists() or not any((work / "store").rglob("manifest.json"))
    assert not (work / "out").exists() or not [p for p in (work / "out").iterdir() if not p.name.startswith(".")]


def test_a_refused_gpu_build_exits_2_every_time_and_leaves_nothing_running(tmp_path: Path) -> None:
    """Refused while Prefect's API and the forkserver still start (the probe not yet cached): the process once aborted
    at exit (134), 1 run in 3 here. Once the probe is cached, a refusal starts neither (~20 s of CPU each)."""
    import uuid

    script = """
import atexit, runpy, sys
import prefect_executorch.isolation as isolation
started = isolation.warm_up
def warm_up(quiet=False, exports=False):
    print("children started")
    started(quiet, exports)
isolation.warm_up = warm_up
atexit.register(lambda: print("api started:", "prefect_executorch.cli.embedded" in sys.modules))  # ApiStart's home
sys.argv = ["prefect-executorch", *sys.argv[1:]]
runpy.run_module("prefect_executorch.cli", run_name="__main__")
"""
    spec = write_spec(tmp_path / "spec.json", target="cuda")
    for attempt in range(3):
        marker = uuid.uuid4().hex
        env = {**os.environ, "PREFECT_EXECUTORCH_STORE": str(tmp_path / "store"), "PREFECT_EXECUTORCH_TEST_MARKER": marker}
        result = subprocess.run([sys.executable, "-c", script, "build", str(spec)], capture_output=True, text=True,
                                cwd=tmp_path, env=env, timeout=300)
        assert result.returncode == 2, (attempt, result.stderr[-3000:])
        if attempt:  # the first attempt cached the probe
            assert "children started" not in result.stdout, result.stdout
            assert "api started: False" in result.stdout, result.stdout
        assert result.stderr.startswith("ToolchainMismatch: this worker cannot build target cuda"), result.stderr
        assert result.stderr.count('pip install "prefect-executorch[cuda]"') == 1, result.stderr  # said once
        assert _processes_with(f"PREFECT_EXECUTORCH_TEST_MARKER={marker}") == [], attempt  # no API, no forkserver


def test_a_missing_or_wrong_store_is_named_before_any_work(built: Path, tmp_path: Path) -> None:
    """A wrong path once looked like an empty store to ls and pull, and failed a build with a traceback after its export."""
    afile = tmp_path / "a-file"
    afile.write_text("")
    missing, out = tmp_path / "missing", tmp_path / "out"
    changed = write_spec(tmp_path / "spec.json", validation={"samples": 3})  # not a cache hit anywhere
    cases = [
        (["ls", "--store", str(missing)], f"SpecError: store: {missing} does not exist"),
        (["ls", "--store", str(afile)], f"SpecError: store: {afile} is a file, not a directory"),
        (["pull", "mlp", "--to", str(tmp_path / "pulled"), "--store", str(missing)], f"store: {missing} does not exist"),
        (["promote", "mlp", "1", "--alias", "x", "--store", str(missing)], f"store: {missing} does not exist"),
        (["gc", "--store", str(missing)], f"store: {missing} does not exist"),
        (["verify", str(missing)], f"NotABundle: {missing} does not exist"),
        (["verify", str(afile)], f"NotABundle: {afile} is a file, not a bundle folder"),
        (["build", str(changed), "--output", str(out), "--store", str(afile)], f"store: {afile} is a file"),
        (["build", str(changed), "--output", str(out), "--store", "/proc/nope/bundles"],
         "SpecError: store: cannot write bundles to /proc/nope/bundles: No such file or directory"),
    ]
    for args, said in cases:
        result = run_cli(*args, cwd=built)
        assert result.returncode == 2, (args, result.stderr[-1500:])
        assert said in result.stderr.splitlines()[0] and "Traceback" not in result.stderr, (args, result.stderr[-1500:])
    assert not out.exists()  # refused before anything was exported


def test_the_advice_for_an_unsigned_bundle_works_a_rebuild_with_a_key_signs_it(tmp_path: Path) -> None:
    """IntegrityError says "publish it again with PREFECT_EXECUTORCH_SIGNING_KEY": the unchanged rebuild is a cache
    hit, and with the key set it signs the published bundle, which then pulls where the public key is required."""
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = tmp_path / "bundle.pem", tmp_path / "bundle.pub"
    private.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    spec = str(write_spec(tmp_path / "spec.json"))
    built = run_cli("build", spec, cwd=tmp_path)
    assert built.returncode == 0 and "unsigned: no model.sig" in built.stdout, built.stderr
    requiring = {**os.environ, "PREFECT_EXECUTORCH_STORE": str(tmp_path / "store"),
                 "PREFECT_EXECUTORCH_SIGNING_PUBLIC_KEY": str(public)}

    def pull(to: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, "pull", "mlp", "--version", "1", "--to", to], capture_output=True, text=True,
                              cwd=tmp_path, env=requiring, timeout=300)

    refused = pull("first")
    assert refused.returncode != 0 and "publish it again with PREFECT_EXECUTORCH_SIGNING_KEY" in refused.stderr
    signing = {**os.environ, **session_api(), "PREFECT_EXECUTORCH_STORE": str(tmp_path / "store"),
               "PREFECT_EXECUTORCH_SIGNING_KEY": str(private)}
    again = subprocess.run([*CLI, "build", spec], capture_output=True, text=True, cwd=tmp_path, env=signing, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "cache hit" in again.stdout and "signed: model.sig" in again.stdout
    assert "signed mlp/1/portable/" in again.stderr and "it was published unsigned" in again.stderr
    pulled = pull("second")
    assert pulled.returncode == 0, pulled.stderr
    inspected = run_cli("inspect", "second", cwd=tmp_path)
    assert inspected.returncode == 0 and "signed: model.sig" in inspected.stdout
