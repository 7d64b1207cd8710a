"""Real ``cuda`` builds: ExecuTorch's CUDA backend exports, runs on the GPU and is checked against eager CUDA.

Run on an NVIDIA GPU worker with the GPU stack (docs/cuda.md; on an offline host, ../shared/gpu/stage):

    python -m pytest -m "cuda or tensorrt" -ra

Elsewhere every test is skipped with the target's own refusal of this machine. The record of a run on an
H200 is records/gpu/2026-12-04-h200-5ca7cad/junit-cuda-h200.xml.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from prefect_executorch.artifacts.signing import SIGNATURE_FILE
from prefect_executorch.errors import ToolchainMismatch, ValidationFailed
from prefect_executorch.export.exporter import ExportedProgramDir, export_program
from prefect_executorch.machine.toolchain import Toolchain, probe
from prefect_executorch.runtime.bundled_cases import BUNDLED_FILE, BundledMethod, verify_bundled
from prefect_executorch.spec.buildspec import BuildSpec, parse_spec
from prefect_executorch.targets import get_target
from prefect_executorch.targets.cuda import DATA_FILE
from prefect_executorch.validate.report import ValidationReport
from prefect_executorch.validate.validator import require_passed, validate_program

from helpers import MODELS, write_wav

pytestmark = pytest.mark.cuda
TARGET = get_target("cuda")
ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "prefect_executorch.cli"]
BATCH = {0: {"min": 1, "max": 8, "name": "batch"}}
MLP = {"forward": {"inputs": [{"name": "x", "shape": [4, 32]}]}}


def spec_of(factory: str, methods: dict[str, Any], validation: dict[str, Any] | None = None, **target: Any) -> BuildSpec:
    return parse_spec({"name": factory.replace("_", "-"), "version": "1", "model": f"{MODELS}:{factory}",
                       "methods": methods, "target": {"kind": "cuda", **target},
                       "validation": {"samples": 2, **(validation or {})}})


@pytest.fixture(scope="module")
def gpu(record_testsuite_property: Callable[[str, object], None]) -> Toolchain:
    """This machine's probe; skips the module with the target's refusal where it cannot build target cuda.

    Where it can, the GPU and the stack go into the junit record's properties: what ran the tests.
    """
    found = probe()
    try:
        TARGET.check(spec_of("mlp", {"forward": {"inputs": [{"name": "x", "shape": [2, 32]}]}}), found)
    except ToolchainMismatch as exc:
        headline, *problems = str(exc).split("\n  - ")
        pytest.skip(f"{headline} {problems[0] if problems else ''} (all of them: prefect-executorch probe, docs/cuda.md)")
    stack = {"gpu": f"{found.gpus[0].name} {found.sm}", "driver": found.driver_version, "python": found.python,
             "torch": found.torch, "executorch": found.executorch, "triton": found.triton, "nvcc": found.nvcc_version,
             "torch-tensorrt-executorch-runtime": found.tensorrt_executorch_runtime,
             "runtime_backends": ",".join(found.runtime_backends or [])}
    for name, value in stack.items():
        record_testsuite_property(name, value)
    return found


Built = tuple[BuildSpec, ExportedProgramDir, ValidationReport]


@pytest.fixture(scope="module")
def build(gpu: Toolchain, tmp_path_factory: pytest.TempPathFactory) -> Callable[[BuildSpec], Built]:
    """Export and validate a spec (each once per module), writing the bundled cases."""
    done: dict[str, Built] = {}

    def run(spec: BuildSpec) -> Built:
        key = spec.canonical_json()
        if key not in done:
            root = tmp_path_factory.mktemp(spec.name)
            exported = export_program(spec, root)
            report = validate_program(spec, exported.path, exported.data_files, scratch_dir=root,
                                      delegation=exported.delegation, bundled_out=exported.path / BUNDLED_FILE)
            done[key] = (spec, exported, report)
        return done[key]

    return run


def _max_error(report: ValidationReport) -> float:
    return max(out.max_abs for case in report.cases for out in case.outputs)


def test_every_method_of_a_two_method_model_runs_in_the_cuda_backend(build: Callable[[BuildSpec], Built]) -> None:
    spec, exported, report = build(spec_of("mlp", {"forward": {"inputs": [{"name": "x", "shape": [4, 32]}]},
                                                   "encode": {"inputs": [{"name": "x", "shape": [4, 32]}]}}))
    require_passed(report)
    assert exported.data_files == [DATA_FILE] and report.used_data_file
    assert exported.delegates() == {"forward": ["CudaBackend"], "encode": ["CudaBackend"]}
    assert {name: facts.fraction for name, facts in exported.delegation.items()} == {"forward": 1.0, "encode": 1.0}
    assert {case.method for case in report.cases} == {"forward", "encode"}
    assert _max_error(report) < 1e-5, report.cases
    assert all(result.synchronized for result in report.latency)  # eager CUDA timed to completion


def test_one_program_runs_every_batch_of_a_dynamic_dim(build: Callable[[BuildSpec], Built]) -> None:
    _, exported, report = build(spec_of("convnet", {"forward": {"inputs": [{"name": "x", "shape": [4, 3, 8, 8],
                                                                           "dynamic": BATCH}]}}))
    require_passed(report)
    shapes = {case.shape_label: case.input_shapes[0][0] for case in report.cases}
    assert shapes == {"min": 1, "opt": 4, "max": 8}
    assert exported.methods["forward"].inputs[0] is not None and exported.methods["forward"].inputs[0].dynamic


BERT = {"forward": {"inputs": [{"name": "input_ids", "shape": [1, 8], "dtype": "int64", "high": 64,
                                "dynamic": {1: {"min": 2, "max": 16}}}]}}


def test_a_float32_bert_builds_with_attention_outside_the_triton_kernels(build: Callable[[BuildSpec], Built]) -> None:
    _, exported, report = build(spec_of("tiny_bert", BERT))
    require_passed(report)
    assert any("attention in float32" in note and "takes bfloat16 only" in note for note in exported.warnings)
    assert _max_error(report) < 1e-4


def test_a_bf16_bert_uses_the_triton_attention(build: Callable[[BuildSpec], Built]) -> None:
    _, exported, report = build(spec_of("tiny_bert", BERT, precision="bf16"))
    require_passed(report)
    assert exported.warnings == []  # attention runs in bfloat16: the backend's Triton kernel takes it
    assert all(out.atol == pytest.approx(1.6e-2) for case in report.cases for out in case.outputs)  # bf16 tolerances


def test_fp16_passes_its_tolerances_and_fails_tighter_ones_naming_the_output(
        build: Callable[[BuildSpec], Built], tmp_path: Path) -> None:
    methods = {"forward": {"inputs": [{"name": "x", "shape": [4, 32]}]}}
    spec, exported, report = build(spec_of("mlp", methods, precision="fp16"))
    require_passed(report)
    assert 0 < _max_error(report) < 5e-3  # computed in half precision
    strict = spec_of("mlp", methods, {"atol": 1e-7, "rtol": 0.0}, precision="fp16")
    failed = validate_program(strict, exported.path, exported.data_files, scratch_dir=tmp_path)
    with pytest.raises(ValidationFailed, match="validation cases failed; worst: forward"):
        require_passed(failed)


def test_tf32_runs_the_matmuls_on_tensor_cores_within_its_tolerances(build: Callable[[BuildSpec], Built]) -> None:
    # 32 rows of width 1024: GEMMs Inductor takes TF32 for (at least 16 rows, both other sizes at least 512).
    methods = {"forward": {"inputs": [{"name": "x", "shape": [32, 1024]}]}}
    _, _, exact = build(spec_of("wide_1024", methods))
    _, _, tf32 = build(spec_of("wide_1024", methods, precision="tf32"))
    require_passed(exact)
    require_passed(tf32)
    assert _max_error(exact) < 1e-5
    assert _max_error(tf32) > 10 * _max_error(exact), (_max_error(tf32), _max_error(exact))  # inputs rounded: TF32 ran
    assert all(out.atol == pytest.approx(5e-3) for case in tf32.cases for out in case.outputs)  # TF32's tolerances


def _fatbin_images(pte: Path, tmp_path: Path) -> list[Path]:
    """The CUDA fat binaries AOTInductor embedded in the program's kernel library, each as a file for cuobjdump."""
    data = pte.read_bytes()
    images, start = [], data.find(b"\x50\xed\x55\xba")
    while start != -1:
        header_size = int.from_bytes(data[start + 6:start + 8], "little")
        size = int.from_bytes(data[start + 8:start + 16], "little")
        image = tmp_path / f"kernel{len(images)}.fatbin"
        image.write_bytes(data[start:start + header_size + size])
        images.append(image)
        start = data.find(b"\x50\xed\x55\xba", start + header_size + size)
    return images


def test_the_kernels_carry_code_for_this_gpus_arch_only(build: Callable[[BuildSpec], Built], gpu: Toolchain,
                                                        tmp_path: Path) -> None:
    cuobjdump = shutil.which("cuobjdump") or (str(Path(gpu.nvcc).parent / "cuobjdump") if gpu.nvcc else None)
    if cuobjdump is None or not Path(cuobjdump).exists():
        pytest.skip("no cuobjdump (the CUDA toolkit's) on this machine to read the kernels with")
    _, exported, _ = build(spec_of("mlp", {"forward": {"inputs": [{"name": "x", "shape": [4, 32]}]}}))
    images = _fatbin_images(exported.path / exported.program, tmp_path)
    assert images, "no fat binary found in the program's kernel library"
    listed = [subprocess.run([cuobjdump, "-lelf", "-lptx", str(image)], capture_output=True, text=True, timeout=60)
              for image in images]
    kinds = {line.split(":")[-1].strip().rsplit(".", 2)[-2] + ":" + line.split()[0]
             for result in listed for line in result.stdout.splitlines() if line.startswith(("ELF", "PTX"))}
    print("kernel images:", sorted(kinds))
    arch = gpu.sm.removeprefix("sm") if gpu.sm else "?"
    # SASS for exactly this GPU, and PTX of the same arch-specific target, which no other arch can JIT.
    assert kinds and all(kind.split(":")[0] in (f"sm_{arch}", f"sm_{arch}a") for kind in kinds), kinds
    assert TARGET.compat(spec_of("mlp", MLP), gpu) == f"{gpu.cuda_channel}-sm{arch}-cuda-{gpu.arch}"


def test_the_bundled_cases_run_on_the_gpu_and_a_crash_there_fails_the_check_not_this_process(
        build: Callable[[BuildSpec], Built], tmp_path: Path) -> None:
    import torch

    mlp_spec, mlp, mlp_report = build(spec_of("mlp", {"forward": {"inputs": [{"name": "x", "shape": [4, 32]}]}}))
    _, convnet, _ = build(spec_of("convnet", {"forward": {"inputs": [{"name": "x", "shape": [4, 3, 8, 8],
                                                                     "dynamic": BATCH}]}}))
    methods = {"forward": BundledMethod(cases=[f"{c.shape_label}[{c.sample}]" for c in mlp_report.cases],
                                        atol=1e-4, rtol=1e-4)}
    check = verify_bundled(mlp.path, "cuda", mlp.data_files, methods, scratch_dir=tmp_path)
    assert [result.error for result in check.results] == [None] * len(mlp_report.cases)
    # The program with another model's weights blob: the runtime fails or crashes in the child.
    swapped = tmp_path / "swapped"
    shutil.copytree(mlp.path, swapped)
    shutil.copy(convnet.path / DATA_FILE, swapped / DATA_FILE)
    try:
        bad = verify_bundled(swapped, "cuda", mlp.data_files, methods, scratch_dir=tmp_path)
    except ValidationFailed as exc:
        # By its reason: the runtime refused the foreign blob, or its child died on it, not some other failure.
        assert "did not run on this machine" in str(exc) or f"could not load {BUNDLED_FILE}" in str(exc), str(exc)
    else:
        assert bad.failures, "another model's weights reproduced this model's outputs"
    # This process, and its CUDA context, are untouched: the same check passes again.
    assert float(torch.ones(4, device="cuda").sum()) == 4.0
    again = verify_bundled(mlp.path, "cuda", mlp.data_files, methods, scratch_dir=tmp_path)
    assert not again.failures


def _key_pair(directory: Path) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = directory / "bundle.pem", directory / "bundle.pub"
    private.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    return private, public


def _cli_in(work: Path) -> Callable[..., str]:
    """The CLI run in ``work`` with a store and a signing key there: its output, one line, after a zero exit."""
    private, public = _key_pair(work)
    env = {**os.environ, "PREFECT_EXECUTORCH_STORE": str(work / "store"),
           "PREFECT_EXECUTORCH_SIGNING_KEY": str(private), "PREFECT_EXECUTORCH_SIGNING_PUBLIC_KEY": str(public)}

    def cli(*args: str) -> str:
        done = subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=work, env=env, timeout=900)
        print(f"$ prefect-executorch {' '.join(args)}\n{done.stdout}{done.stderr}")
        assert done.returncode == 0, done.stdout + done.stderr
        return " ".join((done.stdout + done.stderr).split())

    return cli


def test_the_demo_spec_builds_signs_verifies_and_promotes_side_by_side_through_the_cli(
        gpu: Toolchain, tmp_path: Path) -> None:
    demo = yaml.safe_load((ROOT / "examples" / "convnet" / "spec.yaml").read_text())
    shutil.copy(ROOT / "examples" / "convnet" / "model.py", tmp_path / "model.py")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({**demo, "target": "cuda"}))
    (tmp_path / "next.yaml").write_text(yaml.safe_dump({**demo, "version": "1.0.1", "target": "cuda"}))
    cli = _cli_in(tmp_path)
    compat = f"{gpu.cuda_channel}-{gpu.sm}-cuda-{gpu.arch}"
    built = cli("build", "spec.yaml")
    assert f"small-convnet/1.0.0/cuda/{compat}" in built
    bundle = tmp_path / "store" / "small-convnet" / "1.0.0" / "cuda" / compat
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["data_files"] == [DATA_FILE] and manifest["validation"]["passed"]
    assert manifest["methods"]["forward"]["delegates"] == ["CudaBackend"]
    assert manifest["bundled"]["file"] == BUNDLED_FILE
    assert any(path.name.startswith(SIGNATURE_FILE) for path in bundle.iterdir()), sorted(bundle.iterdir())
    pulled = cli("pull", "small-convnet", "--version", "1.0.0", "--to", "pulled", "--verify")
    assert "bundled cases pass on this machine" in pulled
    assert "bundled cases pass on this machine" in cli("verify", "pulled")
    cli("promote", "small-convnet", "1.0.0", "--alias", "staging")
    cli("build", "next.yaml")
    # Side by side on this GPU: the candidate's outputs and latency beside the alias's bundle. Sub-millisecond
    # GPU latencies move by more than the default 10% between runs; the outputs must still agree.
    promoted = cli("promote", "small-convnet", "1.0.1", "--alias", "staging", "--max-latency-regression", "1.0")
    assert "1.0.1" in promoted


def test_a_bf16_decoder_lm_builds_passes_its_gates_and_generates_through_the_cli(gpu: Toolchain, tmp_path: Path) -> None:
    """A trained tiny Llama directory built for target cuda in bf16 with CUDA-graph replay: the static KV cache is the
    program's state, attention the backend's Triton kernel; the runtime wheel with CudaBackend has no LLM runner, so the program is
    judged one token per call against fp32 eager by the bf16 gates, then pulled, verified and run by `generate`."""
    from prefect_executorch.testing.tiny_llm import EOS, write_tiny_llm

    model_dir = write_tiny_llm(tmp_path / "llama", "llama", train_steps=200)
    prompts = ["the quick brown", "prefect runs", "1, 2, 3,"]
    (tmp_path / "llm.yaml").write_text(yaml.safe_dump({
        "name": "tiny-llama", "version": "1", "model": str(model_dir),
        "target": {"kind": "cuda", "precision": "bf16", "cuda_graphs": True},
        "llm": {"max_seq_len": 40, "new_tokens": 12, "prompts": prompts}}))
    cli = _cli_in(tmp_path)
    built = cli("build", "llm.yaml")
    assert "validation through ExecuTorch's runtime, one token per call" in built and "teacher-forced top-1" in built
    # The bf16 gates' values, as the summary says them: at least the spec's defaults (90%, 1.2x).
    gates = re.search(r"teacher-forced top-1 agreement ([0-9.]+)%, perplexity ([0-9.]+)x", built)
    assert gates is not None and float(gates[1]) >= 90.0 and float(gates[2]) <= 1.2, built
    bundle = tmp_path / "store" / "tiny-llama" / "1" / "cuda" / f"{gpu.cuda_channel}-{gpu.sm}-cuda-{gpu.arch}"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["data_files"] == [DATA_FILE] and manifest["validation"]["passed"]
    assert manifest["methods"]["forward"]["delegates"] == ["CudaBackend"]
    assert manifest["validation"]["generated_by"].startswith("ExecuTorch's runtime, one token per call")
    # The decode step replayed as a CUDA graph: shown captured and equal to a direct call, then every prompt on it.
    assert manifest["runtime_hints"]["cuda_graph_methods"] == ["forward"]
    assert manifest["validation"]["replayed"] == ["forward"]
    pulled = cli("pull", "tiny-llama", "--version", "1", "--to", "pulled", "--verify")
    assert "all 3 prompts generate" in pulled
    cases = json.loads((tmp_path / "pulled" / "generation_cases.json").read_text())
    generated = cli("generate", "./pulled", prompts[0], "--new-tokens", "12")
    # The case's pieces end with EOS's where the program generated it; generate stops there and prints no EOS.
    printed = prompts[0] + "".join(piece for piece in cases["expected"][0] if piece != EOS)
    assert generated.startswith(" ".join(printed.split())), (generated, cases["expected"][0])
    assert "tokens by ExecuTorch's runtime, one token per call" in generated and "decode" in generated


def test_a_bf16_whisper_builds_passes_its_agreement_gate_and_transcribes_through_the_cli(
        gpu: Toolchain, tmp_path: Path) -> None:
    """A Whisper directory made here, built for target cuda in bf16: encoder and decoder compiled by the CUDA backend,
    float32 at the program's edges, judged against fp32 eager by the agreement gate; pulled, verified and run by
    `transcribe`, whose text is the validated tokens'."""
    from prefect_executorch.clips import made_clip
    from prefect_executorch.spec.speech_model import load_speech_tokenizer
    from prefect_executorch.testing.tiny_speech import write_tiny_whisper

    model_dir = write_tiny_whisper(tmp_path / "whisper", train_steps=100)
    (tmp_path / "asr.yaml").write_text(yaml.safe_dump({
        "name": "tiny-whisper", "version": "1", "model": str(model_dir), "target": {"kind": "cuda", "precision": "bf16"},
        "asr": {"language": "en", "task": "transcribe", "max_new_tokens": 12}}))
    cli = _cli_in(tmp_path)
    cli("build", "asr.yaml")
    bundle = tmp_path / "store" / "tiny-whisper" / "1" / "cuda" / f"{gpu.cuda_channel}-{gpu.sm}-cuda-{gpu.arch}"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["data_files"] == [DATA_FILE] and manifest["validation"]["passed"]
    assert {name: manifest["methods"][name]["delegates"] for name in ("encoder", "text_decoder")} == \
        {"encoder": ["CudaBackend"], "text_decoder": ["CudaBackend"]}
    validation = json.loads((bundle / "validation.json").read_text())
    gates = {gate["gate"]: gate for gate in validation["gates"]}
    assert set(gates) == {"min_token_agreement", "feature_atol"} and all(gate["passed"] for gate in gates.values())
    assert not validation["generation"]["exact"], validation["generation"]
    pulled = cli("pull", "tiny-whisper", "--version", "1", "--to", "pulled", "--verify")
    assert "all 3 clips transcribe as validated" in pulled
    clip = write_wav(tmp_path / "chirp.wav", made_clip("chirp-200-2000hz-2s", 16000))
    cases = json.loads((tmp_path / "pulled" / "transcription_cases.json").read_text())
    expected = load_speech_tokenizer(bundle).decode(cases["expected"][cases["clips"].index("chirp-200-2000hz-2s")],
                                                    skip_special_tokens=True).strip()
    transcribed = cli("transcribe", "./pulled", str(clip))
    assert expected and transcribed.startswith(" ".join(expected.split())) and "real-time factor" in transcribed, (expected,
                                                                                                      transcribed)


def test_a_bf16_moonshine_builds_one_program_for_any_length_and_transcribes_through_the_cli(
        gpu: Toolchain, tmp_path: Path) -> None:
    """Moonshine on cuda: its encoder of any number of 384-sample steps and its decoder (a gated MLP: the ``chunk``
    the CUDA backend cannot compile as a split, so lowered as slices) compiled by the CUDA backend in bf16; a clip
    longer than any validated one transcribes through the CLI."""
    import numpy as np

    from prefect_executorch.clips import made_clip
    from prefect_executorch.testing.tiny_speech import write_tiny_moonshine

    model_dir = write_tiny_moonshine(tmp_path / "moonshine", train_steps=100)
    (tmp_path / "asr.yaml").write_text(yaml.safe_dump({
        "name": "tiny-moonshine", "version": "1", "model": str(model_dir),
        "target": {"kind": "cuda", "precision": "bf16"}, "asr": {"max_new_tokens": 12}}))
    cli = _cli_in(tmp_path)
    cli("build", "asr.yaml")
    bundle = tmp_path / "store" / "tiny-moonshine" / "1" / "cuda" / f"{gpu.cuda_channel}-{gpu.sm}-cuda-{gpu.arch}"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["validation"]["passed"] and "preprocessor.pte" not in {f["path"] for f in manifest["files"]}
    assert {name: manifest["methods"][name]["delegates"] for name in ("encoder", "text_decoder")} == \
        {"encoder": ["CudaBackend"], "text_decoder": ["CudaBackend"]}
    samples = made_clip("noise-1500ms", 16000).tolist() * 3 + made_clip("chirp-200-2000hz-2s", 16000).tolist()
    cli("pull", "tiny-moonshine", "--version", "1", "--to", "pulled")
    transcribed = cli("transcribe", "./pulled", str(write_wav(tmp_path / "long.wav", np.array(samples))))
    assert "for 6.50 s of audio" in transcribed, transcribed


def test_the_runtime_setup_lets_the_cuda_pool_keep_its_memory(gpu: Toolchain) -> None:
    """CudaBackend allocates from the default pool every call; validation times it as a server would run it."""
    import ctypes

    from prefect_executorch.targets.gpu import KEEP_ALL, set_cuda_pool_release_threshold

    def threshold() -> int:
        driver, device, pool, value = ctypes.CDLL("libcuda.so.1"), ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
        assert driver.cuInit(0) == 0 and driver.cuDeviceGet(ctypes.byref(device), 0) == 0
        assert driver.cuDeviceGetDefaultMemPool(ctypes.byref(pool), device) == 0
        assert driver.cuMemPoolGetAttribute(pool, 4, ctypes.byref(value)) == 0
        return value.value

    set_cuda_pool_release_threshold(0)
    assert threshold() == 0
    TARGET.runtime_setup()
    assert threshold() == KEEP_ALL


def test_cuda_graphs_replay_what_a_direct_call_computes_and_validation_judges_the_replays(
        build: Callable[[BuildSpec], Built], tmp_path: Path) -> None:
    """target.cuda_graphs: the runtime captures the method on its fourth call (its log says so), the replay's outputs
    equal the direct call's bit for bit, and the cases, then the bundled cases, run on the replays."""
    spec, exported, report = build(spec_of("mlp", MLP, cuda_graphs=True))
    assert [check.model_dump() for check in report.replay] == [
        {"method": "forward", "captured": True, "identical": True, "calls": 5}]
    require_passed(report)
    assert report.summary().replayed == ["forward"]
    hints = TARGET.runtime_hints(spec)
    assert hints["cuda_graph_methods"] == ["forward"]
    methods = {"forward": BundledMethod(cases=[f"{c.shape_label}[{c.sample}]" for c in report.cases],
                                        atol=1e-4, rtol=1e-4)}
    check = verify_bundled(exported.path, "cuda", exported.data_files, methods, scratch_dir=tmp_path,
                           runtime_hints=hints)
    assert [result.error for result in check.results] == [None] * len(report.cases)
