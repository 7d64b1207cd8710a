"""Concurrency: one winner per publish key and per alias move; builds in one flow run share no directory."""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prefect import flow

from prefect_executorch.artifacts.aliases import AliasRecord, alias_history, move_alias, read_alias
from prefect_executorch.artifacts.manifest import CLAIM_FILE, MANIFEST_FILE
from prefect_executorch.artifacts.publishing import (
    BundleRef,
    list_bundles,
    publish,
    pull,
    read_manifest,
    verify_bundle_dir,
)
from prefect_executorch.artifacts.store import LocalStore, ObjectStore
from prefect_executorch.errors import BundleConflict
from prefect_executorch.export.exporter import ExportedProgramDir
from prefect_executorch.hashing import sha256_bytes
from prefect_executorch.isolation import start_child
from prefect_executorch.spec.buildspec import parse_spec
from prefect_executorch.tasks.export import export_model
from prefect_executorch.tasks.probe import probe_toolchain
from prefect_executorch.tasks.publish import publish_bundle
from prefect_executorch.tasks.validate import validate_export

from helpers import spec_data
from realbundle import SHAPES, RealBundle, store_kind

CONTENDERS = 8


def race(contenders: list[Callable[[], Any]]) -> list[Any]:
    """Start every call at once; each one's result, or the ``BundleConflict`` it raised."""
    outcomes: list[Any] = [None] * len(contenders)
    barrier = threading.Barrier(len(contenders))

    def run(index: int) -> None:
        barrier.wait()
        try:
            outcomes[index] = contenders[index]()
        except BundleConflict as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(contenders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


@pytest.mark.parametrize("builds", ["same program, own manifests", "same program, other reports", "other programs"])
def test_concurrent_publishes_of_one_key(real_bundle: Callable[[str], RealBundle], any_store: ObjectStore,
                                         faults: Any, tmp_path: Path, builds: str) -> None:
    fault = faults("concurrency", f"{CONTENDERS} publishes of one key, {builds} ({store_kind(any_store)})")
    convnet = real_bundle("convnet")
    bystander = publish(any_store, *convnet.variant(tmp_path / "bystander", version="99")).key
    if builds == "other programs":
        others = [convnet, real_bundle("mlp").under(convnet)]
        sources = [others[i % 2].variant(tmp_path / str(i)) for i in range(CONTENDERS)]
    else:
        suffix = (lambda i: b"\n" * i) if builds == "same program, other reports" else (lambda i: b"")
        sources = [convnet.variant(tmp_path / str(i), report_suffix=suffix(i)) for i in range(CONTENDERS)]
    outcomes = race([lambda source=source: publish(any_store, *source) for source in sources])

    won = [i for i, outcome in enumerate(outcomes) if isinstance(outcome, BundleRef)]
    lost = [outcome for outcome in outcomes if isinstance(outcome, BundleConflict)]
    # One race is one fault: survived when it ends with one bundle and a typed conflict for every other publisher.
    fault.outcome(injected=1, survived=int(len(won) == 1 and len(lost) == CONTENDERS - 1))
    assert len(won) == 1 and len(lost) == CONTENDERS - 1, outcomes
    assert all("nothing was" in str(exc) or "another publisher" in str(exc) for exc in lost), lost
    key = convnet.manifest.key
    stored, raw = read_manifest(any_store, key)
    assert stored == sources[won[0]][1] and sha256_bytes(raw) == outcomes[won[0]].manifest_sha256
    assert pull(any_store, key, tmp_path / "pulled") == stored
    assert verify_bundle_dir(tmp_path / "pulled") == stored
    left = {info.key for info in any_store.list(key.prefix + "/")}
    assert left == {key.key(entry.path) for entry in stored.files} | {key.key(MANIFEST_FILE)}, "a claim or a stray object"
    assert key.key(CLAIM_FILE) not in left and any_store.incomplete_uploads("") == []
    fault.check_intact(any_store, [bystander, key], tmp_path / "after")
    assert fault.lost == 0


def test_concurrent_promotions_one_winner_per_round(real_bundle: Callable[[str], RealBundle], any_store: ObjectStore,
                                                    faults: Any, tmp_path: Path) -> None:
    rounds = 3
    fault = faults("concurrency", f"{CONTENDERS} promotions of one alias, {rounds} rounds ({store_kind(any_store)})")
    convnet = real_bundle("convnet")
    versions = [str(10 + i) for i in range(CONTENDERS + 1)]
    for version in versions:
        publish(any_store, *convnet.variant(tmp_path, version=version))
    move_alias(any_store, "convnet", versions[0], "canary")
    winners = [versions[0]]
    for _ in range(rounds):
        # Every contender moves the alias away from where it is, each only if it is still there.
        contenders = [v for v in versions if v != winners[-1]]
        outcomes = race([lambda v=v, base=winners[-1]: move_alias(any_store, "convnet", v, "canary", expect_version=base)
                         for v in contenders])
        won = [v for v, outcome in zip(contenders, outcomes, strict=False) if isinstance(outcome, AliasRecord)]
        fault.outcome(injected=1, survived=int(len(won) == 1))  # each round's race is one fault
        assert len(won) == 1, outcomes
        assert all(f"convnet {won[0]}" in str(o) for o in outcomes if isinstance(o, BundleConflict))
        winners.append(won[0])
    current = read_alias(any_store, "convnet", "canary")
    assert current is not None and current[0].version == winners[-1]
    history = alias_history(any_store, "convnet", "canary")
    assert [h.version for h in history] == winners, "a lost update"
    assert all(h.previous is not None and h.previous.version == p.version for p, h in zip(history, history[1:], strict=False))
    fault.check_intact(any_store, [key for key in list_bundles(any_store, "convnet") if key.version in versions],
                       tmp_path / "after")
    assert fault.verified == len(versions) and fault.lost == 0


@flow
def publish_twice(spec_json: str, store: str, output_root: str) -> tuple[BundleRef, BundleRef]:
    """One build's export and validation published by two attempts, as a retry whose first attempt published and
    then died would: the same fingerprint both times."""
    from prefect_executorch.export.fingerprint import build_fingerprint
    from prefect_executorch.spec.buildspec import BuildSpec

    spec = BuildSpec.model_validate_json(spec_json)
    toolchain = probe_toolchain()
    export = export_model(spec, Path(output_root))
    report = validate_export(spec, export, Path(output_root))
    inputs = build_fingerprint(spec, toolchain, f"cpu-xnnpack-{os.uname().machine}", store)
    first = publish_bundle(spec, toolchain, export, report, store, build_inputs=inputs)
    return first, publish_bundle(spec, toolchain, export, report, store, build_inputs=inputs)


def test_a_rerun_that_finds_its_own_bundle_published_succeeds_and_another_build_is_refused(
        prefect_harness: None, tmp_path: Path) -> None:
    """An identical build's bundle (the same fingerprint) is this run's own: the second publish returns it as a
    cache hit, writing nothing; a build of other inputs under the same key is still a conflict."""
    from prefect_executorch.artifacts.rebuild import identical_build_published

    spec = parse_spec(spec_data("mlp", methods={"forward": {"inputs": [{"name": "x", "shape": SHAPES["mlp"]}]}}))
    store = LocalStore(tmp_path / "store")
    first, second = publish_twice(spec.model_dump_json(), str(store.root), str(tmp_path / "out"))
    assert not first.cache_hit and second.cache_hit
    assert second.model_copy(update={"cache_hit": False}) == first
    manifest, _ = read_manifest(store, first.key)
    assert identical_build_published(store, manifest.model_copy(update={"fingerprint": "0" * 64})) is None
    with pytest.raises(BundleConflict, match="is already published"):
        publish(store, store.root / first.key.prefix, manifest.model_copy(update={"fingerprint": "0" * 64}))


@flow
def build_three_at_once(store: str, output_root: str) -> list[tuple[ExportedProgramDir, BundleRef]]:
    """Export, validate and publish three models concurrently in one flow run, sharing one output root."""
    toolchain = probe_toolchain()
    specs = [parse_spec(spec_data(factory, methods={"forward": {"inputs": [{"name": "x", "shape": SHAPES[factory]}]}}))
             for factory in ("convnet", "two_outputs", "mlp")]
    exports = [export_model.submit(spec, Path(output_root)) for spec in specs]
    reports = [validate_export.submit(spec, export, Path(output_root)) for spec, export in zip(specs, exports, strict=False)]
    refs = [publish_bundle.submit(spec, toolchain, export, report, store)
            for spec, export, report in zip(specs, exports, reports, strict=False)]
    return [(export.result(), ref.result()) for export, ref in zip(exports, refs, strict=False)]


def test_concurrent_builds_in_one_flow_run_share_nothing_on_disk(prefect_harness: None, faults: Any,
                                                                 tmp_path: Path) -> None:
    # One flow with 3 concurrent builds is one fault (the shared output root), not 3.
    fault = faults("concurrency", "3 builds of different models in one flow run, one output root")
    store = LocalStore(tmp_path / "store")
    built = build_three_at_once(str(store.root), str(tmp_path / "out"))
    fault.outcome(injected=1, survived=int(len({export.out_dir for export, _ in built}) == 3))
    dirs = [Path(export.out_dir) for export, _ in built]
    assert len(set(dirs)) == 3 and all(d.parent == tmp_path / "out" for d in dirs)
    for export, ref in built:
        # Each directory holds exactly its own bundle, byte for byte what was published.
        manifest = pull(store, ref.key, tmp_path / "pulled" / ref.key.name)
        assert {p.name for p in Path(export.out_dir).iterdir()} == {e.path for e in manifest.files}
        for entry in manifest.files:
            pulled = tmp_path / "pulled" / ref.key.name / entry.path
            assert (Path(export.out_dir) / entry.path).read_bytes() == pulled.read_bytes()
    fault.check_intact(store, [ref.key for _, ref in built], tmp_path / "after")
    assert fault.lost == 0


def test_children_started_from_many_threads_each_report_their_own_exit_status() -> None:
    """Concurrent builds start children from several threads: each child's exit status reaches its own caller.

    CPython's ``Process.start()`` polls every earlier child, and a forkserver child's status can be read
    once: a start in one thread could take another thread's status, which then read exit code 255.
    """
    context = multiprocessing.get_context("forkserver")
    statuses: list[int | None] = []

    def start_and_join(count: int) -> None:
        for _ in range(count):
            child = context.Process(target=os.getpid)
            start_child(child)
            child.join(60)
            statuses.append(child.exitcode)

    threads = [threading.Thread(target=start_and_join, args=(50,)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(statuses) == 200
    assert [status for status in statuses if status != 0] == []


def test_starting_the_forkserver_leaves_this_process_environment_alone(tmp_path: Path) -> None:
    """Other threads of the caller read ``os.environ`` while one starts the forkserver (three builds of one flow run
    once met "dictionary changed size during iteration" there); the forkserver's own setting reaches its children."""
    import subprocess
    import sys

    seen = tmp_path / "child-env.txt"
    script = (
        "import os\n"
        "writes = []\n"
        "class Watched(type(os.environ)):\n"
        "    def __setitem__(self, key, value):\n        writes.append(key); super().__setitem__(key, value)\n"
        "    def __delitem__(self, key):\n        writes.append(key); super().__delitem__(key)\n"
        "os.environ.__class__ = Watched\n"
        "from prefect_executorch.isolation import _context\n"
        "context = _context('forkserver')\n"
        f"child = context.Process(target=os.system, args=('echo \"$PYTORCH_NVML_BASED_CUDA_CHECK\" > {seen}',))\n"
        "child.start(); child.join(120)\n"
        "print('writes', writes, 'PYTORCH_NVML_BASED_CUDA_CHECK' in os.environ)\n"
    )
    env = {name: value for name, value in os.environ.items() if name != "PYTORCH_NVML_BASED_CUDA_CHECK"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "writes [] False", done.stdout
    assert seen.read_text().strip() == "1"


def test_the_forkserver_starts_its_children_warm_and_leaves_them_no_thread_that_hangs_them() -> None:
    """A building process's forkserver exports and lowers a tiny model last, so that each child's export starts
    warm (a process that only runs programs leaves it out); it does so on one thread
    and without tqdm's monitor: a child forked from a process whose OpenMP pool had started hung at its first matmul.
    Run as a user's process is, with every core (no OMP_NUM_THREADS); the server's threads counted against a
    forkserver without the warm-up."""
    import subprocess
    import sys

    script = (
        "import os, sys\n"
        "from prefect_executorch import isolation\n"
        "code = ('import os, sys, torch; x = torch.randn(1500, 1500); x @ x; '\n"
        "        'warm = sys.modules.get(\"prefect_executorch.forkserver_warm\"); '\n"
        "        'print(warm and warm.WARMED, len(os.listdir(f\"/proc/{os.getppid()}/task\")), flush=True)')\n"
        "context = isolation._context('forkserver', exports=sys.argv[1] == 'warm')\n"
        "child = context.Process(target=exec, args=(code,), daemon=True)\n"
        "child.start(); child.join(120)\n"
        "print('exit', child.exitcode)\n"
    )
    env = {name: value for name, value in os.environ.items() if name != "OMP_NUM_THREADS"}

    def child_of(preload: str) -> tuple[str, str]:
        done = subprocess.run([sys.executable, "-c", script, preload], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        *_, said, exit_line = done.stdout.strip().splitlines()
        assert exit_line == "exit 0", (preload, done.stdout + done.stderr[-2000:])  # None: the child hung in its matmul
        warmed, threads = said.split()
        return warmed, threads

    (warmed, threads), (unwarmed, cold_threads) = child_of("warm"), child_of("cold")
    assert (warmed, unwarmed) == ("True", "None")
    assert threads == cold_threads
