"""The toolchain probe's cache: answers an unchanged machine at once, misses on any change that matters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prefect_executorch.errors import SpecError
from prefect_executorch.machine import probecache
from prefect_executorch.machine.probecache import cached_toolchain, probe_cached, probe_key
from prefect_executorch.machine.toolchain import Toolchain

from helpers import spec_data

CLI = [sys.executable, "-m", "prefect_executorch.cli"]
#: A child start method the isolation module refuses: any attempt to start a child then fails loudly.
NO_CHILDREN = {"PREFECT_EXECUTORCH_CHILD_START": "none-allowed"}
#: The CLI with a tripwire on every way it could start a process (an isolated child, Prefect's server, any
#: subprocess). The environment stays as it is: it is part of the probe cache's key.
CLI_WITHOUT_CHILDREN = [sys.executable, "-c", """
import os, runpy, sys
sys.path[0] = os.getcwd()  # as `python -m` has it: sys.path is part of the probe cache's key
def refuse(event, args):
    if event in ("subprocess.Popen", "os.posix_spawn", "os.fork", "os.exec"):
        raise RuntimeError("tripwire: this run may not start a process (" + event + ")")
sys.addaudithook(refuse)
import prefect_executorch.isolation as isolation
def no_child(*args, **kwargs):
    raise RuntimeError("tripwire: this run may not start a child (run_isolated)")
isolation.run_isolated = no_child
isolation.warm_up = no_child  # the forkserver's start (its spawn raises no audit event)
sys.argv = ["prefect-executorch", *sys.argv[1:]]
runpy.run_module("prefect_executorch.cli", run_name="__main__")
"""]


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty user cache directory for this test."""
    home = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


def _dist_info(site: Path, name: str, version: str, record: str = "x.py,,\n") -> Path:
    folder = site / f"{name}-{version}.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (folder / "RECORD").write_text(record)
    return folder


def test_a_cached_answer_is_returned_without_a_probe(cache_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probed = probe_cached()
    assert list((cache_home / probecache.CACHE_SUBDIR).glob("*.json")) == [
        cache_home / probecache.CACHE_SUBDIR / f"{probe_key()}.json"]
    for name, value in NO_CHILDREN.items():
        monkeypatch.setenv(name, value)
    assert probe_cached() == probed  # no child could have started
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # what torch sees changed: the cache must not answer
    assert cached_toolchain() is None
    with pytest.raises(SpecError, match="none-allowed"):
        probe_cached()


def test_a_probe_whose_gpu_cuda_did_not_start_is_not_kept(cache_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect_executorch.machine.toolchain import probe

    here = probe()
    failed = here.model_copy(update={"cuda_available": False, "gpus": [], "cuda_error": "Cannot re-initialize CUDA"})
    answers = iter([failed, here])
    monkeypatch.setattr(probecache, "probe_isolated", lambda timeout_s: next(answers))  # the child's answers
    assert probe_cached() == failed and cached_toolchain() is None  # asked again next time
    assert probe_cached() == here and cached_toolchain() == here


def test_a_write_retires_month_old_entries_and_a_failed_one_leaves_no_file(cache_home: Path) -> None:
    toolchain = Toolchain.model_validate_json((Path(__file__).parents[1] / "fixtures" / "probe_h200.json").read_text())
    folder = cache_home / probecache.CACHE_SUBDIR
    folder.mkdir(parents=True)
    for name in ("old.json", "recent.json"):
        (folder / name).write_text("{}")
    month_ago = time.time() - probecache.RETIRE_AFTER_S - 60
    os.utime(folder / "old.json", (month_ago, month_ago))
    probecache.store_toolchain(toolchain, "new")
    assert sorted(p.name for p in folder.iterdir()) == ["new.json", "recent.json"]
    assert Toolchain.model_validate_json((folder / "new.json").read_text()) == toolchain
    (folder / "taken.json").mkdir()  # the entry's name is taken: the rename fails
    probecache.store_toolchain(toolchain, "taken")
    assert sorted(p.name for p in folder.iterdir()) == ["new.json", "recent.json", "taken.json"]


def test_distributions_the_driver_and_cuda_devices_change_the_key(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    driver = tmp_path / "nvidia-version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05\n")
    monkeypatch.setattr(probecache, "_SYSTEM_FILES", (str(driver),))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    keys = [probe_key()]
    dist = _dist_info(site, "somelib", "1.0")
    keys.append(probe_key())  # installed
    dist.rename(site / "somelib-1.1.dist-info")
    keys.append(probe_key())  # upgraded
    (site / "somelib-1.1.dist-info" / "RECORD").write_text("x.py,,\ny.py,,\n")
    keys.append(probe_key())  # reinstalled with other files, same version
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.105.08\n")
    keys.append(probe_key())  # driver upgraded
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    keys.append(probe_key())
    assert len(set(keys)) == len(keys), keys
    assert probe_key() == keys[-1]  # and nothing else moves it


def test_the_working_directory_does_not_change_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m prefect_executorch.cli` puts the folder it runs in first on sys.path: a build from another
    folder (each test's own) must answer from the cache, while a folder of packages on the path still counts."""
    started_in = os.getcwd()
    monkeypatch.syspath_prepend(started_in)
    here, rest = probe_key(), [entry for entry in sys.path if entry != started_in]
    for folder in (tmp_path / "a", tmp_path / "b"):
        folder.mkdir()
        monkeypatch.chdir(folder)
        monkeypatch.setattr(sys, "path", [str(folder), *rest])
        assert probe_key() == here
    gone = tmp_path / "gone"  # a folder deleted under the running process: os.getcwd() raises there
    gone.mkdir()
    monkeypatch.chdir(gone)
    monkeypatch.setattr(sys, "path", rest)
    gone.rmdir()
    assert probe_key() == here
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert probe_key() != here


def test_a_real_pip_install_and_upgrade_invalidate_the_cache(cache_home: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "site"
    monkeypatch.syspath_prepend(str(target))
    target.mkdir()
    probe_cached()
    cached_before = cached_toolchain()
    assert cached_before is not None
    for version in ("1.0", "1.1"):
        project = tmp_path / f"tinydist-{version}"
        (project / "tinydist").mkdir(parents=True)
        (project / "tinydist" / "__init__.py").write_text(f"VERSION = {version!r}\n")
        (project / "pyproject.toml").write_text(
            f'[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
            f'[project]\nname = "tinydist"\nversion = "{version}"\n')
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                               "--upgrade", "--target", str(target), str(project)],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert (target / f"tinydist-{version}.dist-info").is_dir()
        assert cached_toolchain() is None, f"tinydist {version} installed, yet the old probe answered"
        probecache.store_toolchain(cached_before, probe_key())


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A store holding mlp 1 (portable), built through the CLI with its own user cache directory."""
    work = tmp_path_factory.mktemp("probecache-cli")
    (work / "spec.json").write_text(json.dumps(spec_data(
        "mlp", methods={"forward": {"inputs": [{"name": "x", "shape": [3, 32]}]}}, target="portable")))
    env = {**os.environ, "PREFECT_EXECUTORCH_STORE": str(work / "store"), "XDG_CACHE_HOME": str(work / "cache")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    result = subprocess.run([*CLI, "build", "spec.json"], capture_output=True, text=True, cwd=work, env=env,
                            timeout=600)
    assert result.returncode == 0 and "fresh build: mlp/1/portable/" in result.stdout, result.stdout + result.stderr
    return work, env


def test_the_cli_rebuild_answers_from_the_cached_probe_and_probes_again_after_a_change(
        built: tuple[Path, dict[str, str]]) -> None:
    work, env = built
    rebuild, guarded = [*CLI, "build", "spec.json"], [*CLI_WITHOUT_CHILDREN, "build", "spec.json"]
    hit = subprocess.run(guarded, capture_output=True, text=True, cwd=work, env=env, timeout=300)
    assert hit.returncode == 0, hit.stdout + hit.stderr
    assert "cache hit (unchanged rebuild, nothing exported): mlp/1/portable/" in hit.stdout
    changed = {**env, "CUDA_VISIBLE_DEVICES": "3"}
    refused = subprocess.run(guarded, capture_output=True, text=True, cwd=work, env=changed, timeout=300)
    # The probe's inputs changed, so the CLI had to start a child to probe (and the tripwire forbids it).
    assert refused.returncode != 0 and "tripwire" in refused.stdout + refused.stderr, refused.stdout + refused.stderr
    probed = subprocess.run(rebuild, capture_output=True, text=True, cwd=work, env={**env, "CUDA_VISIBLE_DEVICES": "3"},
                            timeout=300)
    assert probed.returncode == 0 and "cache hit" in probed.stdout, probed.stdout + probed.stderr
