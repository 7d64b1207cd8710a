"""Decoder language models: made here from transformers configs (random weights, a tokenizer trained in the test),
exported for ExecuTorch's LLM runner and judged by what they generate against eager PyTorch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from prefect_executorch.errors import SpecError, ValidationFailed
from prefect_executorch.export.exporter import ExportedProgramDir, export_program
from prefect_executorch.runtime.llm_runner import generate
from prefect_executorch.spec.buildspec import BuildSpec, load_spec, parse_spec
from prefect_executorch.spec.causal_lm import load_causal_lm
from prefect_executorch.spec.llm import GENERATION_CASES_FILE, TOKENIZER_FILE
from prefect_executorch.targets import check_build, get_target
from prefect_executorch.testing.tiny_llm import write_tiny_llm
from prefect_executorch.validate.validator import require_passed, validate_program

from helpers import session_api

CLI = [sys.executable, "-m", "prefect_executorch.cli"]
#: The CLI children report to the session's Prefect API (helpers.session_api).
pytestmark = pytest.mark.usefixtures("prefect_harness")
#: Short runs: a cache of 40 positions, 12 new tokens per prompt (the sliding window of the Gemma 3 model is 8).
LLM = {"max_seq_len": 40, "new_tokens": 12, "prompts": ["the quick brown", "prefect runs", "1, 2, 3,"]}
#: Tests of what the tokenizer and the runner do, not of a backend, build for portable: a CPU target's export of a
#: decoder is the same up to lowering, and XNNPACK's partitions add ~40% to each export. The Llama user's build,
#: the token-by-token and quantized tests keep XNNPACK, the default.


def llm_spec(model_dir: Path, target: str | None = None, **llm: Any) -> BuildSpec:
    """A spec of the model directory with the short runs above; the default target unless ``target`` is given."""
    return parse_spec({"name": "tiny", "version": "1", "model": str(model_dir), **({"target": target} if target else {}),
                       "llm": {**LLM, **llm}})


def export_and_validate(spec: BuildSpec, out: Path) -> tuple[ExportedProgramDir, Any]:
    export = export_program(spec, out)
    report = validate_program(spec, export.path, export.data_files, scratch_dir=out,
                              bundled_out=export.path / GENERATION_CASES_FILE)
    return export, report


#: One decoder layer where a test needs no more: each layer is six more XNNPACK partitions, ~1 s each, in every
#: export. Gemma 3 keeps two, a sliding-window layer and a full one, and so checks a cache of several layers.
LAYERS = 1


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("llms")
    for architecture in ("llama", "qwen2", "qwen3"):
        write_tiny_llm(root / architecture, architecture, layers=LAYERS)
    write_tiny_llm(root / "gemma3_text", "gemma3_text", layers=2)
    write_tiny_llm(root / "llama-other-seed", "llama", seed=1, layers=LAYERS)
    # a trained model's next token stands out
    write_tiny_llm(root / "llama-trained", "llama", train_steps=200, layers=LAYERS)
    return root


# --- the spec -----------------------------------------------------------------------------------------------

def test_an_llm_spec_names_a_model_directory_and_takes_defaults(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text("name: tiny\nversion: '1'\nmodel: ./my-model\nllm: {}\n")
    spec = load_spec(tmp_path / "spec.yaml")
    assert spec.model == str(tmp_path / "my-model")  # resolved against the spec's folder
    assert spec.llm is not None and spec.llm.max_seq_len == 128 and spec.llm.new_tokens == 32
    assert len(spec.llm.prompts) == 3 and spec.methods == {} and spec.target_name == "xnnpack"


@pytest.mark.parametrize(("extra", "message"), [
    ({"methods": {"forward": {"inputs": [{"name": "x", "shape": [1]}]}}}, "methods: not for an `llm:` spec"),
    ({"quantization": {"scheme": "int8-static"}}, "an `llm:` spec is quantized with int8da4w (linear layers"),
    ({"target": "tensorrt"}, "target: an `llm:` spec builds for xnnpack, portable, cuda, not 'tensorrt'"),
    ({"target": {"kind": "cuda", "precision": "bf16"}, "quantization": {"scheme": "int8da4w"}},
     "quantization: an `llm:` spec on target cuda is built in target.precision"),
    ({"model": "models.py:make"}, "with `llm`, model is the path of a Hugging Face model directory"),
    ({"llm": {"new_tokens": 200}}, "new_tokens (200) must be below max_seq_len (128)"),
    ({"llm": {"prompts": ["  "]}}, "prompts[0] is empty"),
    ({"llm": {"max_seq_lenn": 64}}, "did you mean 'max_seq_len'"),
    ({"llm": None, "model": "models.py:make", "quantization": {"scheme": "int8da4w", "embeddings": "int4"}},
     "quantization.embeddings: applies to the token embeddings of an `llm:` or `asr:` spec's model only"),
    ({"quantization": {"scheme": "int8da4w", "embeddings": "int2"}}, "quantization.embeddings"),
])
def test_a_wrong_llm_spec_is_refused_in_its_own_words(extra: dict[str, Any], message: str) -> None:
    data = {"name": "tiny", "version": "1", "model": "/models/tiny", "llm": {}, **extra}
    with pytest.raises(SpecError) as caught:
        parse_spec(data)
    assert message in str(caught.value)


def test_a_missing_model_directory_or_tokenizer_is_named_before_any_work(tmp_path: Path) -> None:
    cases = [(tmp_path / "absent", "is not a directory"), (tmp_path, "has no config.json")]
    for model_dir, message in cases:
        with pytest.raises(SpecError, match=message):
            llm_spec(model_dir).check_model_reference()
    model_dir = write_tiny_llm(tmp_path / "m", "llama", hidden_size=16)
    (model_dir / TOKENIZER_FILE).unlink()
    with pytest.raises(SpecError, match="llm.tokenizer: .* does not exist"):
        llm_spec(model_dir).check_model_reference()


def test_a_tokenizer_larger_than_the_vocabulary_and_an_unsupported_architecture_are_refused(
    models: Path, tmp_path: Path,
) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    small = write_tiny_llm(tmp_path / "small-vocab", "llama", hidden_size=16, vocab_size=64)
    with pytest.raises(SpecError, match=r"llm.tokenizer: it has \d+ tokens, more than the model's vocab_size of 64"):
        export_program(llm_spec(small), tmp_path / "out")
    gpt2 = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=400)).save_pretrained(gpt2)
    (gpt2 / TOKENIZER_FILE).write_bytes((models / "llama" / TOKENIZER_FILE).read_bytes())
    with pytest.raises(SpecError, match="architecture 'gpt2' .* is not supported; supported: gemma3_text, llama"):
        load_causal_lm(llm_spec(gpt2))  # what the export child calls first
    assert not (tmp_path / "out").exists() or not any(p for p in (tmp_path / "out").iterdir() if not p.name.startswith("."))


# --- export and validation by generation ----------------------------------------------------------------------

ARCHITECTURES = ["qwen2", "qwen3", "gemma3_text"]
#: Gemma 3's prompts add one of 23 tokens, more than two of its 8-position windows: its ring cache prefills in chunks.
LONG_PROMPT = "the quick brown fox jumps over the lazy dog, prefect runs flows on workers and 1, 2,"


def prompts_of(architecture: str) -> list[str]:
    return [*LLM["prompts"], LONG_PROMPT] if architecture == "gemma3_text" else list(LLM["prompts"])


@pytest.fixture(scope="module")
def exported(models: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[ExportedProgramDir, Any]]:
    """Each architecture exported (for portable: what differs between families is in the export) and validated
    once: its export directory and its report."""
    return {arch: export_and_validate(llm_spec(models / arch, "portable", prompts=prompts_of(arch)),
                                      tmp_path_factory.mktemp(arch)) for arch in ARCHITECTURES}


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_models_nobody_here_wrote_generate_what_eager_does_through_the_runner(
    exported: dict[str, tuple[ExportedProgramDir, Any]], models: Path, architecture: str,
) -> None:
    """Every program takes the prompt in one call with ExecuTorch's custom SDPA and KV-cache ops. Gemma 3's
    sliding-window layers (8 positions, shorter than the cache) keep theirs in a ring, as ExecuTorch's
    ``CustomRingKVCache`` does: its program takes 8 tokens a call, and its long prompt (23 tokens, 3 calls) and
    every prompt + 12 new tokens run past the window, generating eager's tokens."""
    from prefect_executorch.program import read_program
    from prefect_executorch.runtime.decoding import ForwardCalls
    from prefect_executorch.runtime.loaded_program import LoadedProgram

    export, report = exported[architecture]
    operators = {op for facts in read_program(export.path / "model.pte").values() for op in facts.operators}
    ring = architecture == "gemma3_text"
    assert {"llama::custom_sdpa.out", "llama::update_cache.out"} <= operators
    assert ("llama::update_cache_with_indices.out" in operators) == ring
    assert not any("attention: the model's own" in note for note in export.warnings), export.warnings
    calls = ForwardCalls(LoadedProgram(export.path / "model.pte"), export.path / TOKENIZER_FILE)
    assert calls.sequence and calls.chunk == (8 if ring else 39)
    if ring:
        assert 16 < len(calls.tokenizer.encode(LONG_PROMPT, add_special_tokens=False).ids) <= 40 - 12
    generation = report.generation
    assert report.passed, report.describe_worst()
    assert generation is not None and len(generation.cases) == len(prompts_of(architecture))
    assert all(len(case.actual) == len(case.expected) > 0 for case in generation.cases)
    assert generation.agreement() == 1.0
    cases = json.loads((export.path / GENERATION_CASES_FILE).read_text())
    assert cases["expected"] == [case.expected for case in generation.cases]
    assert (export.path / TOKENIZER_FILE).read_bytes() == (models / architecture / TOKENIZER_FILE).read_bytes()


def test_a_token_by_token_program_takes_a_token_a_call_and_generates_eagers_tokens(models: Path, tmp_path: Path) -> None:
    """``llm.prefill: token_by_token`` (what ``cuda_graphs`` builds, and the benchmark's one-token program): static
    shapes, one token a call, the prompt fed a token at a time by the runner; still eager's tokens."""
    from prefect_executorch.runtime.decoding import ForwardCalls
    from prefect_executorch.runtime.loaded_program import LoadedProgram

    export, report = export_and_validate(llm_spec(models / "llama", prefill="token_by_token"), tmp_path)
    calls = ForwardCalls(LoadedProgram(export.path / "model.pte"), export.path / TOKENIZER_FILE)
    assert not calls.sequence and calls.chunk == 1
    assert report.passed and report.generation is not None and report.generation.agreement() == 1.0


def test_side_by_side_of_two_llm_bundles_compares_their_tokens_and_times_a_generation(
    exported: dict[str, tuple[ExportedProgramDir, Any]], tmp_path: Path,
) -> None:
    """What a promotion runs: the candidate's prompts through both bundles' runners, one generation timed on each."""
    from prefect_executorch.isolation import run_isolated
    from prefect_executorch.spec.validation import ValidationSpec
    from prefect_executorch.validate.sidebyside import ProgramFiles, SideBySide, SideBySideRequest

    def side_by_side(current: str, candidate: str) -> Any:
        files = {role: ProgramFiles(dir=str(exported[arch][0].path), program="model.pte")
                 for role, arch in (("current", current), ("candidate", candidate))}
        request = SideBySideRequest(**files, methods={}, validation=ValidationSpec(latency_runs=2, latency_max_s=1),
                                    generation=True)
        return run_isolated("side_by_side", request, SideBySide, timeout_s=300, scratch_dir=tmp_path).methods[0]

    same = side_by_side("qwen3", "qwen3")
    assert (same.method, same.cases, same.disagreeing, same.worst) == ("generate", 3, 0, None)
    assert same.current is not None and same.candidate is not None and same.candidate.p50_ms > 0
    other = side_by_side("qwen3", "qwen2")
    assert other.disagreeing > 0 and "where the current bundle generates" in (other.worst or "")


def test_a_program_whose_generation_departs_from_eager_is_refused(built_llama: Path, models: Path, tmp_path: Path) -> None:
    """The program of one model judged against another with other weights: the report names prompt, position, tokens."""
    other = llm_spec(models / "llama-other-seed")
    report = validate_program(other, built_llama / "pulled", [], scratch_dir=tmp_path, bundled_out=tmp_path / "cases.json")
    assert not report.passed and report.generation is not None
    failed = next(case for case in report.generation.cases if not case.passed)
    at = failed.first_divergence
    assert at is not None and failed.actual[at] != failed.expected[at]
    assert report.describe_worst() == (f"prompt {failed.prompt!r}: new token {at} is {failed.actual[at]!r} where "
                                       f"eager generates {failed.expected[at]!r}")
    agreement = report.summary().generation_agreement
    assert agreement is not None and agreement < 1.0
    assert not (tmp_path / "cases.json").exists()  # a failed validation writes no test cases
    with pytest.raises(ValidationFailed, match=r"of 3 prompts generated other tokens than eager PyTorch; worst: prompt"):
        require_passed(report)


def test_a_quantized_build_passes_its_gates_at_a_fraction_of_the_size_and_tighter_gates_refuse_it(
    models: Path, built_llama: Path, tmp_path: Path,
) -> None:
    """int8da4w linears (torchao, as ExecuTorch's LLM recipes) and int4 embeddings (ExecuTorch's quantized embedding
    kernel, which the runner finds registered): judged by teacher-forced agreement and perplexity, at most 0.3x the
    float program's size (the user's Llama build: the same configuration, other weights)."""
    spec = parse_spec({"name": "tiny", "version": "1", "model": str(models / "llama-trained"), "llm": LLM,
                       "quantization": {"scheme": "int8da4w", "embeddings": "int4"}})
    export, report = export_and_validate(spec, tmp_path / "q")
    generation = report.generation
    assert report.passed, report.describe_worst()
    assert generation is not None and not generation.exact and report.quantization is not None
    assert report.quantization.scheme == "int8da4w" and report.quantization.quantized_linears
    assert report.quantization.embeddings == "int4"
    # What a C++ consumer must link, read from the program: its quantized embedding kernel is no XNNPACK op.
    assert get_target("xnnpack").cpp_libraries(list(export.methods.values())) == [
        "libexecutorch", "libexecutorch_backend_xnnpack", "libexecutorch_kernels_quantized"]
    agreement, ratio = generation.top1_agreement(), generation.perplexity_ratio()
    assert agreement is not None and agreement >= 0.9 and ratio is not None and 1 / 1.2 <= ratio <= 1.2
    assert [gate.gate for gate in report.gates] == ["min_top1_agreement", "max_perplexity_ratio"]
    # The bundle's cases hold the program's own tokens (what verify reproduces), eager's beside where they differ.
    cases = json.loads((export.path / GENERATION_CASES_FILE).read_text())
    assert cases["expected"] == [case.actual for case in generation.cases]
    departed = any(not case.passed for case in generation.cases)
    assert cases["eager"] == ([case.expected for case in generation.cases] if departed else None)
    assert (models / "llama-trained" / "config.json").read_text() == (models / "llama" / "config.json").read_text()
    size, float_size = (export.path / "model.pte").stat().st_size, (built_llama / "pulled" / "model.pte").stat().st_size
    assert size <= 0.3 * float_size, (size, float_size)
    tighter = spec.model_copy(update={"llm": spec.llm.model_copy(update={"max_perplexity_ratio": 1.0,  # type: ignore[union-attr]
                                                                         "min_top1_agreement": 1.0})})
    refused = validate_program(tighter, export.path, [], scratch_dir=tmp_path, bundled_out=tmp_path / "cases.json")
    failed = [gate for gate in refused.gates if not gate.passed]
    assert not refused.passed and failed and not (tmp_path / "cases.json").exists()
    assert failed[0].describe().startswith(f"gate llm.{failed[0].gate} on forward: ")
    # The message lists the failed gates once, then the figures and the first departure; departing prompts are no
    # failure of a quantized build.
    with pytest.raises(ValidationFailed) as info:
        require_passed(refused)
    message = str(info.value)
    assert message.startswith(failed[0].describe()) and message.count(failed[0].describe()) == 1
    assert "teacher-forced top-1 agreement" in message and "prompts generated other tokens" not in message
    assert refused.describe_worst() == refused.generation.describe()


# --- the product, as a user runs it ---------------------------------------------------------------------------

def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **session_api(), "PREFECT_EXECUTORCH_STORE": str(cwd / "store")}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


@pytest.fixture(scope="module")
def built_llama(models: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's build of the Llama directory, pulled with --verify: the folder they worked in."""
    work = tmp_path_factory.mktemp("llama-user")
    (work / "llm.yaml").write_text(
        f"name: tiny-llama\nversion: '1'\nmodel: {models / 'llama'}\n"
        f"llm:\n  max_seq_len: 40\n  new_tokens: 12\n  prompts: {json.dumps(LLM['prompts'])}\n")
    built = _cli("build", "llm.yaml", cwd=work)
    assert built.returncode == 0, built.stderr[-3000:]
    assert "validation through ExecuTorch's LLM runner: 3 prompts, every token as eager's" in built.stdout
    assert "get_max_seq_len" not in built.stdout  # the runner's metadata methods are not the user's methods
    pulled = _cli("pull", "tiny-llama", "--version", "1", "--to", "pulled", "--verify", cwd=work)
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    assert "all 3 prompts generate eager's tokens through ExecuTorch's LLM runner on this machine" in pulled.stdout
    return work


def test_a_user_builds_verifies_and_generates_with_a_llama_directory(built_llama: Path) -> None:
    work = built_llama
    manifest = json.loads((work / "pulled" / "manifest.json").read_text())
    assert {f["path"]: f["role"] for f in manifest["files"]}[TOKENIZER_FILE] == "generation"
    expected = json.loads((work / "pulled" / GENERATION_CASES_FILE).read_text())["expected"][0]
    generated = _cli("generate", "./pulled", "the quick brown", "--new-tokens", "12", cwd=work)
    assert generated.returncode == 0, generated.stderr[-3000:]
    assert generated.stdout.rstrip("\n") == "the quick brown" + "".join(expected)
    assert f"{len(expected)} tokens by ExecuTorch's LLM runner" in generated.stderr
    from_store = _cli("generate", "tiny-llama", "prefect runs", "--version", "1", cwd=work)
    assert from_store.returncode == 0 and from_store.stdout.startswith("prefect runs"), from_store.stderr[-3000:]
    # No version or alias: the newest version that runs here, named; a wrong pair is named as generate's.
    newest = _cli("generate", "tiny-llama", "prefect runs", "--new-tokens", "2", cwd=work)
    assert newest.returncode == 0 and newest.stdout.startswith("prefect runs"), newest.stderr[-3000:]
    assert "tiny-llama 1: the newest version that runs here (choose with --version or --alias)" in newest.stderr
    both = _cli("generate", "tiny-llama", "x", "--version", "1", "--alias", "prod", cwd=work)
    assert both.returncode == 2 and "generate: give exactly one of --version and --alias" in both.stderr, both.stderr
    inspected = _cli("inspect", "pulled", cwd=work)
    assert "validation passed: 3 prompts through ExecuTorch's LLM runner" in inspected.stdout, inspected.stderr[-2000:]
    assert "get_eos_ids" not in inspected.stdout
    tensor_bundle = _cli("generate", str(work / "store"), "x", cwd=work)
    assert tensor_bundle.returncode == 2 and "has no manifest.json" in tensor_bundle.stderr, tensor_bundle.stderr


def test_the_forward_calls_path_generates_what_the_llm_runner_does(built_llama: Path) -> None:
    """What drives a decoder LM where the runtime has no LLM runner (CUDA's): the program's forward called here, the
    prompt in one call (the program takes a sequence: its enable_dynamic_shape), then a token a call, greedy, stopping
    at the program's own end-of-sequence ids; on CPU it must make the runner's very tokens."""
    from prefect_executorch.runtime.decoding import ForwardCalls, LlmRunner
    from prefect_executorch.runtime.loaded_program import LoadedProgram

    bundle = built_llama / "pulled"
    calls = ForwardCalls(LoadedProgram(bundle / "model.pte"), bundle / TOKENIZER_FILE)
    runner = LlmRunner(bundle / "model.pte", bundle / TOKENIZER_FILE)
    assert calls.eos == {1}  # the program's get_eos_ids: the tiny model's eos_token_id
    assert calls.sequence and calls.chunk == 39  # max_seq_len 40: up to 39 tokens a call into 40 positions
    for prompt in ("the quick brown", "prefect runs", "1, 2, 3,"):
        pieces, stats = calls.greedy(prompt, 12)
        assert pieces and pieces == runner.greedy(prompt, 12)[0]
        assert stats.decode_tokens_per_s and stats.prefill_tokens_per_s and stats.time_to_first_token_ms
    # The same logits whether the prompt comes in one call or a token a call.
    ids = calls.tokenizer.encode("prefect runs flows", add_special_tokens=False).ids
    whole = calls.logits(ids, 0)
    one_by_one = [calls.next_logits(token, position) for position, token in enumerate(ids)]
    for row, single in zip(whole, one_by_one, strict=True):
        assert float((row - single).abs().max()) < 1e-4


def test_generate_hands_over_the_text_as_the_child_makes_it(built_llama: Path) -> None:
    """``generate``'s text reaches its caller through ``on_text`` as the runner makes it, whole and in order."""
    chunks: list[str] = []
    generated = generate(built_llama / "pulled", "xnnpack", [], "prefect runs", 24, on_text=chunks.append, start="spawn")
    assert generated.pieces and "".join(chunks) == "".join(generated.pieces)


def test_a_generation_case_the_program_does_not_reproduce_fails_verify_by_generation(built_llama: Path,
                                                                                  tmp_path: Path) -> None:
    """The cases edited and the manifest sealed again over them (checksums and digest right, as a careless re-publish
    would make them): only running the prompts can catch it, and verify names the prompt and the token."""
    import hashlib
    import shutil

    from prefect_executorch.artifacts.signing import seal

    copy = tmp_path / "copy"
    shutil.copytree(built_llama / "pulled", copy)
    cases_file = copy / GENERATION_CASES_FILE
    cases = json.loads(cases_file.read_text())
    cases["expected"][0][2] = "NOT-A-TOKEN"
    cases_file.write_text(json.dumps(cases))
    document = json.loads((copy / "manifest.json").read_text())
    del document["digest"]
    for entry in document["files"]:
        if entry["path"] == GENERATION_CASES_FILE:
            entry.update(sha256=hashlib.sha256(cases_file.read_bytes()).hexdigest(), size=cases_file.stat().st_size)
    (copy / "manifest.json").write_bytes(seal(document))
    (copy / "model.sig").unlink(missing_ok=True)
    mismatch = _cli("verify", str(copy), cwd=tmp_path)
    assert mismatch.returncode == 1, mismatch.stderr
    last = mismatch.stderr.strip().splitlines()[-1]
    assert f"1 of 3 prompts of {copy / GENERATION_CASES_FILE} generate other tokens on this machine" in last
    assert "new token 2 is" in last and "where its validated run generates 'NOT-A-TOKEN'" in last


def test_a_changed_generation_case_is_caught_by_verify(built_llama: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(built_llama / "pulled", copy)
    cases = copy / GENERATION_CASES_FILE
    cases.write_text(cases.read_text().replace('"new_tokens": 12', '"new_tokens": 11'))
    tampered = _cli("verify", str(copy), cwd=tmp_path)
    assert tampered.returncode != 0 and GENERATION_CASES_FILE in tampered.stderr, tampered.stderr


def test_a_bos_adding_tokenizer_generates_what_transformers_generates(tmp_path: Path) -> None:
    """A Llama-3-style tokenizer (its post-processor puts BOS first; tokenizer_config.json names BOS and EOS), the model
    trained after BOS: the bundle carries the tokenizer's configuration, and `generate` prints exactly what
    transformers' own tokenizer and greedy generation make of the prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = write_tiny_llm(tmp_path / "llama3-style", "llama", train_steps=200, adds_bos=True, layers=LAYERS)
    (tmp_path / "llm.yaml").write_text(
        f"name: bos\nversion: '1'\nmodel: {model_dir}\ntarget: portable\nllm:\n  max_seq_len: 40\n  new_tokens: 12\n")
    built = _cli("build", "llm.yaml", cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-3000:]
    bundle = next((tmp_path / "store" / "bos" / "1" / "portable").iterdir())
    files = {entry["path"] for entry in json.loads((bundle / "manifest.json").read_text())["files"]}
    assert {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"} <= files
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompt = "prefect runs"
    encoded = tokenizer(prompt, return_tensors="pt")
    assert int(encoded["input_ids"][0, 0]) == tokenizer.bos_token_id  # transformers' encoding starts with BOS
    with torch.no_grad():
        out = model.generate(**encoded, max_new_tokens=12, do_sample=False)
    expected = prompt + tokenizer.decode(out[0, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
    generated = _cli("generate", str(bundle), prompt, "--new-tokens", "12", cwd=tmp_path)
    assert generated.returncode == 0, generated.stderr[-3000:]
    assert generated.stdout.rstrip("\n") == expected


def test_an_llm_build_without_transformers_is_refused_before_export_with_the_install_line(
        models: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "no-transformers"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoTransformers:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'transformers':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, _NoTransformers())\n")
    (tmp_path / "llm.yaml").write_text(f"name: t\nversion: '1'\nmodel: {models / 'llama'}\nllm:\n  max_seq_len: 40\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")]),
           "PREFECT_EXECUTORCH_STORE": str(tmp_path / "store")}
    done = subprocess.run([*CLI, "build", "llm.yaml"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "ToolchainMismatch: llm: building a decoder LM needs transformers, which this worker lacks; install the llm "
        'extra: pip install "prefect-executorch[llm]" -c constraints-cpu.txt')
    assert not (tmp_path / "store").exists()


def test_tokens_that_are_not_whole_utf8_build_and_generate(tmp_path: Path) -> None:
    """A byte-level BPE with the whole byte alphabet: characters come over several tokens. The runner's Python binding
    cannot pass such a token, so the bundle is driven through the runtime, decoding incrementally, and says so."""
    from tokenizers import Tokenizer

    from prefect_executorch.spec.causal_lm import partial_utf8_tokens

    model_dir = write_tiny_llm(tmp_path / "bytes", "llama", byte_alphabet=True, layers=LAYERS)
    assert partial_utf8_tokens(Tokenizer.from_file(str(model_dir / TOKENIZER_FILE))) > 0
    (tmp_path / "llm.yaml").write_text(f"name: bytes\nversion: '1'\nmodel: {model_dir}\ntarget: portable\n"
                                       "llm:\n  max_seq_len: 64\n  new_tokens: 24\n  prompts: ['日本', 'naïve café']\n")
    built = _cli("build", "llm.yaml", cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-3000:]
    assert "of its tokenizer's tokens are not whole UTF-8, which the LLM runner's Python binding cannot pass" \
        in built.stdout and "every token as eager's" in built.stdout
    generated = _cli("generate", "bytes", "東京", "--new-tokens", "24", cwd=tmp_path)
    assert generated.returncode == 0 and generated.stdout.startswith("東京"), generated.stderr[-3000:]


def test_generate_says_what_the_cache_cannot_hold_before_running(built_llama: Path) -> None:
    """The bundle's cache holds 40 positions: a longer prompt is refused in one line, and more new tokens than the
    prompt leaves room for are capped, saying so."""
    work = built_llama
    long_prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 8)
    refused = _cli("generate", "./pulled", long_prompt, cwd=work)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith("SpecError: PROMPT is ")
    assert "this bundle's KV cache holds 40 positions" in refused.stderr
    capped = _cli("generate", "./pulled", "prefect runs", "--new-tokens", "100", cwd=work)
    assert capped.returncode == 0, capped.stderr[-2000:]
    assert "--new-tokens 100: the 2-token prompt leaves room for 38 in this bundle's 40-position cache; generating at " \
           "most 38" in capped.stderr


def test_a_cache_longer_than_the_model_takes_is_refused_before_export(models: Path) -> None:
    from prefect_executorch.machine.toolchain import probe

    spec = llm_spec(models / "llama", max_seq_len=1024)  # the tiny models take 512 positions
    with pytest.raises(SpecError, match="llm.max_seq_len: 1024 is more positions than the model takes \\(its "
                                        "max_position_embeddings is 512\\)"):
        check_build(spec, probe())
