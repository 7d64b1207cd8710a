"""Bundles that prove their numbers: model.bpte built from the published program, run by ExecuTorch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from prefect_executorch.artifacts.manifest import MANIFEST_FILE, Manifest
from prefect_executorch.artifacts.publishing import file_entries, publish, verify_bundle_dir
from prefect_executorch.artifacts.store import LocalStore
from prefect_executorch.errors import ValidationFailed
from prefect_executorch.flows.build import build_bundle
from prefect_executorch.hashing import sha256_file
from prefect_executorch.runtime.bundled_cases import BUNDLED_FILE, run_bundled_cases
from prefect_executorch.runtime.cpp_consumer import run_cpp_consumer
from prefect_executorch.settings import BundledSettings
from prefect_executorch.spec.buildspec import parse_spec
from prefect_executorch.validate.bundled import bundled_facts, skip_reason
from prefect_executorch.validate.report import ValidationReport

from helpers import session_api, spec_data

pytestmark = pytest.mark.usefixtures("prefect_harness")

CLI = [sys.executable, "-m", "prefect_executorch.cli"]
METHODS = {"forward": {"inputs": [{"name": "x", "shape": [2, 32], "dynamic": {0: {"min": 1, "max": 8}}}]},
           "encode": {"inputs": [{"name": "x", "shape": [3, 32]}]}}


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **session_api(), "PREFECT_EXECUTORCH_STORE": str(cwd / "store")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


@pytest.fixture(scope="module", params=[True, False], ids=["ptd", "embedded-weights"])
def built(request: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    """A two-method MLP built through the flow (with and without a .ptd), with a user sample; its store dir."""
    root = tmp_path_factory.mktemp("bundled")
    torch.save([(torch.full((5, 32), 0.5),)], root / "samples.pt")
    validation = {"samples": 1, "methods": {"forward": {"samples_file": str(root / "samples.pt")}}}
    spec = parse_spec(spec_data("mlp", methods=METHODS, external_weights=request.param, validation=validation))
    ref = build_bundle(spec, store=str(root / "store"))
    return root, verify_bundle_dir(root / "store" / ref.key.prefix)


def test_published_bundle_carries_its_cases_and_verifies_here(built: tuple[Path, Manifest]) -> None:
    root, manifest = built
    bundle = root / "store" / manifest.key.prefix
    facts = manifest.bundled
    assert facts is not None and facts.file == BUNDLED_FILE and facts.skipped is None
    assert facts.methods["forward"].cases == ["min[0]", "opt[0]", "max[0]", "samples_file[0]"]
    assert facts.methods["encode"].cases == ["static[0]"]
    assert facts.methods["forward"].atol == 1e-4  # the float32 default validation applied
    entry = manifest.file(BUNDLED_FILE)
    assert entry.role == "bundled" and entry.sha256 == sha256_file(bundle / BUNDLED_FILE)
    # The .bpte embeds the published program byte for byte.
    from executorch.devtools.bundled_program.serialize import deserialize_from_flatbuffer_to_bundled_program

    assert deserialize_from_flatbuffer_to_bundled_program((bundle / BUNDLED_FILE).read_bytes()).program == \
        (bundle / manifest.program).read_bytes()

    pulled = _cli("pull", manifest.name, "--version", manifest.version, "--to", str(root / "pulled"), "--verify",
                  cwd=root)
    assert pulled.returncode == 0, pulled.stderr
    verified = _cli("verify", str(root / "pulled"), cwd=root)
    assert verified.returncode == 0, verified.stderr
    assert "all 5 bundled cases pass on this machine (encode, forward)" in " ".join(pulled.stdout.split())
    assert "all 5 bundled cases pass on this machine (encode, forward)" in " ".join(verified.stdout.split())


def _tamper(bpte: Path, method: str, case: int) -> None:
    """Add 1.0 to the first expected output value of one case, keeping the program and the inputs."""
    from executorch.devtools.bundled_program.serialize import (
        _bundled_program_schema_to_flatbuffer,
        deserialize_from_flatbuffer_to_bundled_program,
    )

    program = deserialize_from_flatbuffer_to_bundled_program(bpte.read_bytes())
    suite = next(s for s in program.method_test_suites if s.method_name == method)
    tensor = suite.test_cases[case].expected_outputs[0].val
    values = torch.frombuffer(bytearray(tensor.data), dtype=torch.float32).clone()
    values[0] += 1.0
    tensor.data = values.numpy().tobytes()
    bpte.write_bytes(_bundled_program_schema_to_flatbuffer(program))


def test_a_tampered_expected_output_fails_naming_method_and_case(built: tuple[Path, Manifest], tmp_path: Path) -> None:
    root, manifest = built
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    for entry in manifest.files:
        (bundle / entry.path).write_bytes((root / "store" / manifest.key.prefix / entry.path).read_bytes())
    _tamper(bundle / BUNDLED_FILE, "forward", 2)
    with pytest.raises(ValidationFailed, match=r"1 of 5 bundled cases .* failed on this machine: "
                                               r"method 'forward' case 2 \(max\[0\]\): .*"):
        run_bundled_cases(bundle, manifest.target, manifest.data_files, manifest.bundled)

    # Published with a manifest that matches the tampered file, it is refused by `pull --verify`, and nothing lands.
    files = file_entries(bundle, manifest.program, manifest.data_files, [], [BUNDLED_FILE])
    forged = manifest.model_copy(update={"version": "tampered", "files": files})
    publish(LocalStore(root / "store"), bundle, forged)
    dest = tmp_path / "pulled"
    refused = _cli("pull", manifest.name, "--version", "tampered", "--to", str(dest), "--verify", cwd=root)
    assert refused.returncode == 1
    message = " ".join(refused.stderr.split())
    assert "ValidationFailed: 1 of 5 bundled cases" in message and "method 'forward' case 2 (max[0])" in message
    assert "Traceback" not in refused.stderr
    assert not dest.exists() and not list(tmp_path.glob(".pulled.partial-*"))


def test_large_programs_go_without_and_the_manifest_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    program = tmp_path / "model.pte"
    program.write_bytes(b"\0" * (2 * 2**20))
    xnnpack = parse_spec(spec_data("mlp"))
    assert skip_reason(program, xnnpack, BundledSettings(bundled_max_program_mib=4)) is None
    tensorrt = parse_spec(spec_data("mlp", target="tensorrt"))
    assert skip_reason(program, tensorrt, BundledSettings(bundled_max_program_mib=4)) == (
        "bundled cases are built for the xnnpack, portable, cuda targets only, not 'tensorrt'")
    # A quantized program is bundled too: its cases are checked by its own gates (cosine, relative error).
    quantized = parse_spec(spec_data("mlp", quantization={"scheme": "int8da4w"}))
    assert skip_reason(program, quantized, BundledSettings(bundled_max_program_mib=4)) is None
    monkeypatch.setenv("PREFECT_EXECUTORCH_BUNDLED_MAX_PROGRAM_MIB", "1.5")
    portable = parse_spec(spec_data("mlp", target="portable"))
    facts = bundled_facts(tmp_path, "model.pte", portable, ValidationReport(passed=True, cases=[], delegates={}, load_seconds=0.0, used_data_file=False))
    assert facts.file is None and not facts.methods
    assert facts.skipped == ("program is 2.0 MiB, above PREFECT_EXECUTORCH_BUNDLED_MAX_PROGRAM_MIB=1.5; "
                             "raise it to bundle the validation cases")


def test_verify_refuses_a_bundle_without_cases(built: tuple[Path, Manifest], tmp_path: Path) -> None:
    root, manifest = built
    with pytest.raises(ValidationFailed, match="has no model.bpte to run .*published before"):
        run_bundled_cases(tmp_path, manifest.target, manifest.data_files, None)
    assert (root / "store" / manifest.key.prefix / MANIFEST_FILE).exists()


def test_the_cpp_consumer_runs_the_bundles_cases_as_a_cpp_service_would(built: tuple[Path, Manifest],
                                                                         tmp_path: Path) -> None:
    """``verify --cpp``: ExecuTorch's Module from the wheel's own libraries (CMake's find_package), both methods, a
    dynamic batch, with and without a .ptd; a bundle it cannot load or whose numbers differ fails with one line."""
    root, manifest = built
    bundle = root / "store" / manifest.key.prefix
    done = _cli("verify", "--cpp", str(bundle), cwd=root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all 5 bundled cases pass through ExecuTorch's C++ runtime" in done.stdout
    assert [line.split(" ", 2)[:2] for line in done.stdout.splitlines() if line.startswith("ok ")] == [
        ["ok", "forward"]] * 4 + [["ok", "encode"]]
    assert done.stderr == ""
    assert manifest.runtime_hints["cpp_libraries"] == ["libexecutorch", "libexecutorch_backend_xnnpack"]
    assert manifest.bundled is not None
    tighter = {name: method.model_copy(update={"atol": 0.0, "rtol": 0.0})
               for name, method in manifest.bundled.methods.items()}
    exact = manifest.model_copy(update={"bundled": manifest.bundled.model_copy(update={"methods": tighter})})
    with pytest.raises(ValidationFailed, match=r"a case did not match its expected outputs: MISMATCH forward min\[0\]: "
                                               r"max abs error [0-9.e-]+: output 0: beyond atol=0"):
        run_cpp_consumer(bundle, exact)
    if manifest.data_files:  # the weights left out: ExecuTorch 1.5.1's runtime dies loading the method (seen here)
        with pytest.raises(ValidationFailed, match=r"the consumer was killed by SIGSEGV; a C\+\+ service linking"):
            run_cpp_consumer(bundle, manifest.model_copy(update={"data_files": []}))


def _renamed(bundle: Path, manifest: Manifest, name: str, where: Path) -> str:
    """A copy of ``bundle`` at ``where`` whose program names ``name`` with its last letter changed (length kept)."""
    import shutil

    shutil.copytree(bundle, where)
    program = where / manifest.program
    data = program.read_bytes()
    renamed = name[:-1] + ("x" if name[-1] != "x" else "y")
    assert name.encode() in data
    program.write_bytes(data.replace(name.encode(), renamed.encode(), 1))
    return renamed


def test_a_bundle_whose_backend_the_consumer_lacks_fails_in_cpp_with_one_line(built: tuple[Path, Manifest],
                                                                              tmp_path: Path) -> None:
    root, manifest = built
    missing = _renamed(root / "store" / manifest.key.prefix, manifest, "XnnpackBackend", tmp_path / "broken")
    with pytest.raises(ValidationFailed) as failed:
        run_cpp_consumer(tmp_path / "broken", manifest)
    message = str(failed.value)
    assert "the program did not load: LOAD ERROR: method " in message and "Error::NotFound" in message, message
    assert "a backend or data the program needs is not linked or given" in message and missing in message, message


def test_a_bundle_whose_operator_the_linked_kernels_lack_fails_in_cpp_with_one_line(tmp_path: Path) -> None:
    """A portable program (every operator a kernel call) naming an operator no linked kernel library has."""
    from prefect_executorch.program import read_program

    spec = parse_spec(spec_data("mlp", target="portable", validation={"samples": 1},
                                methods={"forward": {"inputs": [{"name": "x", "shape": [2, 32]}]}}))
    ref = build_bundle(spec, store=str(tmp_path / "store"))
    manifest = verify_bundle_dir(tmp_path / "store" / ref.key.prefix)
    operator = read_program(tmp_path / "store" / ref.key.prefix / manifest.program)["forward"].operators[0]
    missing = _renamed(tmp_path / "store" / ref.key.prefix, manifest, operator.split(".")[0], tmp_path / "broken")
    with pytest.raises(ValidationFailed) as failed:
        run_cpp_consumer(tmp_path / "broken", manifest)
    message = str(failed.value)
    assert "the program did not load: LOAD ERROR: method forward did not load: Error::OperatorMissing" in message, message
    assert "an operator the linked kernels lack" in message and missing in message, message
