"""Speech recognition: a Whisper made here from a transformers config (trained a few steps to transcribe the default
clips, a tokenizer trained in the test), exported as an encoder and a decoder with a static cache, and judged by the
transcript it produces against eager PyTorch."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prefect_executorch.clips import made_clip
from prefect_executorch.errors import SpecError, ValidationFailed
from prefect_executorch.export.exporter import export_program
from prefect_executorch.runtime.speech import SpeechBundle
from prefect_executorch.spec.asr import SPEECH_METADATA, TRANSCRIPTION_CASES_FILE, WAVEFORM_STEP_METHOD
from prefect_executorch.spec.buildspec import BuildSpec, load_spec, parse_spec
from prefect_executorch.spec.speech_model import (
    features_of,
    load_feature_extractor,
    load_speech_tokenizer,
    read_wav,
    validation_clips,
)
from prefect_executorch.spec.validation import ValidationSpec
from prefect_executorch.testing.tiny_llm import write_tiny_llm
from prefect_executorch.testing.tiny_speech import write_tiny_moonshine, write_tiny_whisper
from prefect_executorch.validate.sidebyside import ProgramFiles, SideBySideRequest, side_by_side_in_child
from prefect_executorch.validate.transcription import run_transcription_cases
from prefect_executorch.validate.validator import require_passed, validate_program

from helpers import session_api, write_wav

CLI = [sys.executable, "-m", "prefect_executorch.cli"]
#: The CLI's builds report to the session's Prefect API (helpers.session_api).
pytestmark = pytest.mark.usefixtures("prefect_harness")
ASR = {"language": "en", "task": "transcribe", "max_new_tokens": 12}
#: The test Whisper's window: Whisper's own 30 s (benchmarks/asr.py builds it) costs six times as much each encoder call.
WINDOW_S = 5
#: One encoder and one decoder layer: each more is more XNNPACK partitions, ~1 s each, in every export.
LAYERS = 1


def asr_spec(model_dir: Path, version: str = "1", **extra: Any) -> BuildSpec:
    return parse_spec({"name": "tiny-whisper", "version": version, "model": str(model_dir), "asr": ASR, **extra})


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Trained: random weights repeat one token whatever they hear; a trained model's transcript depends on the clip.
    return write_tiny_whisper(tmp_path_factory.mktemp("asr") / "whisper", train_steps=100, window_s=WINDOW_S,
                              layers=LAYERS)


# --- the spec -----------------------------------------------------------------------------------------------

def test_an_asr_spec_names_a_model_directory_and_its_clips_relative_to_the_spec(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text("name: w\nversion: '1'\nmodel: ./whisper\nasr: {clips: [audio/a.wav]}\n")
    spec = load_spec(tmp_path / "spec.yaml")
    assert spec.model == str(tmp_path / "whisper") and spec.methods == {}
    assert spec.asr is not None and spec.asr.clips == [str(tmp_path / "audio" / "a.wav")]
    assert spec.asr.max_new_tokens == 32 and spec.target_name == "xnnpack"


@pytest.mark.parametrize(("extra", "message"), [
    ({"methods": {"forward": {"inputs": [{"name": "x", "shape": [1]}]}}}, "methods: not for an `asr:` spec"),
    ({"llm": {}}, "llm, asr: a spec builds one model kind"),
    ({"target": "tensorrt"}, "target: an `asr:` spec builds for xnnpack, portable, cuda, not 'tensorrt'"),
    ({"target": "cuda", "quantization": {"scheme": "int8da4w"}},
     "quantization: an `asr:` spec on target cuda is built in target.precision"),
    ({"quantization": {"scheme": "int8-dynamic"}}, "an `asr:` spec is quantized with int8da4w"),
    ({"model": "models.py:make"}, "with `asr`, model is the path of a Hugging Face model directory"),
    ({"asr": {"clips": ["talk.mp3"]}}, "clips[0]: 'talk.mp3' is not a .wav file"),
    ({"asr": {"max_new_tokns": 8}}, "did you mean 'max_new_tokens'"),
])
def test_a_wrong_asr_spec_is_refused_in_its_own_words(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec({"name": "w", "version": "1", "model": "/models/whisper", "asr": {}, **extra})
    assert message in str(caught.value)


def test_a_directory_of_another_architecture_or_without_its_front_end_is_named_before_any_work(
        whisper: Path, tmp_path: Path) -> None:
    llama = write_tiny_llm(tmp_path / "llama", "llama", hidden_size=16)
    with pytest.raises(SpecError, match=r"is a 'llama' model; `asr` builds whisper, moonshine encoder-decoders"):
        asr_spec(llama).check_model_reference()
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (bare / name).write_bytes((whisper / name).read_bytes())
    with pytest.raises(SpecError, match=r"has no preprocessor_config.json; save the feature extractor there"):
        asr_spec(bare).check_model_reference()
    with pytest.raises(SpecError, match=r"asr.clips\[0\]: file .*missing.wav' does not exist"):
        asr_spec(whisper, asr={**ASR, "clips": [str(tmp_path / "missing.wav")]}).check_model_reference()


def test_clips_are_read_at_the_front_ends_rate_and_refused_off_rate_or_past_the_window(
        whisper: Path, tmp_path: Path) -> None:
    extractor = load_feature_extractor(whisper)
    tone = np.sin(np.arange(16000) / 16000 * 2 * np.pi * 300) * 0.5
    ok = write_wav(tmp_path / "ok.wav", tone)
    [clip] = validation_clips(asr_spec(whisper, asr={**ASR, "clips": [str(ok)]}), extractor)
    assert clip.name == "ok.wav" and len(clip.samples) == 16000 and abs(clip.samples.max() - 0.5) < 1e-3
    slow = write_wav(tmp_path / "slow.wav", tone[:8000], rate=8000)
    with pytest.raises(SpecError, match=r"asr.clips\[0\]: .*slow.wav is sampled at 8000 Hz; .* takes 16000 Hz"):
        validation_clips(asr_spec(whisper, asr={**ASR, "clips": [str(slow)]}), extractor)
    long = write_wav(tmp_path / "long.wav", np.zeros(16000 * (WINDOW_S + 1)))
    with pytest.raises(SpecError, match=rf"lasts {WINDOW_S + 1}.0 s, longer than the encoder's window of {WINDOW_S} s"):
        validation_clips(asr_spec(whisper, asr={**ASR, "clips": [str(long)]}), extractor)


def test_an_empty_wav_file_is_refused_by_the_field_that_named_it(tmp_path: Path) -> None:
    empty = write_wav(tmp_path / "empty.wav", np.zeros(0))
    with pytest.raises(SpecError, match=r"^AUDIO: .*empty.wav holds no samples; give a clip with sound in it$"):
        read_wav(empty, 16000, 30.0, "AUDIO")


# --- builds ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def built(whisper: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A user's build through the CLI: the spec file beside the model directory, the store a local folder."""
    root = tmp_path_factory.mktemp("asr-build")
    (root / "spec.yaml").write_text(json.dumps({"name": "tiny-whisper", "version": "1", "model": str(whisper),
                                                "asr": ASR}))
    done = subprocess.run([*CLI, "build", "spec.yaml", "--store", str(root / "store")], cwd=root, capture_output=True,
                          text=True, env={**os.environ, **session_api()}, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return root, root / "store" / "tiny-whisper" / "1" / "xnnpack" / "cpu-xnnpack-x86_64"


def test_a_user_builds_a_whisper_directory_and_its_transcripts_are_eagers(built: tuple[Path, Path]) -> None:
    _, bundle = built
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert set(manifest["methods"]) == {"encoder", "text_decoder", *SPEECH_METADATA}
    files = {entry["path"] for entry in manifest["files"]}
    # What a consumer's front end reads, and ExecuTorch's front end as a program of its own.
    assert {"model.pte", "tokenizer.json", "preprocessor_config.json", "preprocessor.pte"} <= files
    [gate] = json.loads((bundle / "validation.json").read_text())["gates"]
    assert gate["gate"] == "feature_atol" and gate["passed"] and 0 < gate["measured"] <= 1e-3, gate
    cases = json.loads((bundle / "validation.json").read_text())["generation"]["cases"]
    assert [case["prompt"] for case in cases] == ["tone-440hz-1s", "chirp-200-2000hz-2s", "noise-1500ms"]
    for case in cases:
        assert case["first_divergence"] is None and case["actual"] == case["expected"] and case["actual"], case
    # The transcript depends on what was heard: a program that ignored its audio would give one transcript for all.
    assert len({tuple(case["actual"]) for case in cases}) > 1, cases
    # Its own test cases: the clips and its tokens, which verify runs again through the program on this machine.
    assert "transcription_cases.json" in files
    done = subprocess.run([*CLI, "verify", str(bundle)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "all 3 clips transcribe as validated" in done.stdout, done.stdout + done.stderr
    done = subprocess.run([*CLI, "generate", str(bundle), "hello"], capture_output=True, text=True, timeout=600)
    assert done.returncode != 0 and "is no decoder-LM bundle" in done.stderr, done.stderr


def test_a_spec_s_wav_clips_travel_in_the_bundle_and_a_changed_case_fails_verify(
        built: tuple[Path, Path], whisper: Path, tmp_path: Path) -> None:
    _, published = built
    bundle = tmp_path / "bundle"
    shutil.copytree(published, bundle)
    clip = write_wav(tmp_path / "hello.wav", made_clip("noise-1500ms", 16000))
    spec = asr_spec(whisper, asr={**ASR, "clips": [str(clip)]})
    report = validate_program(spec, bundle, [], scratch_dir=tmp_path, bundled_out=bundle / TRANSCRIPTION_CASES_FILE)
    assert report.passed and report.generation is not None and report.generation.cases[0].prompt == "hello.wav"
    cases = json.loads((bundle / TRANSCRIPTION_CASES_FILE).read_text())
    assert cases["clips"] == ["clip-0.wav"] and (bundle / "clip-0.wav").read_bytes() == clip.read_bytes()
    speech = SpeechBundle(bundle_dir=str(bundle), program="model.pte", target="xnnpack")
    assert run_transcription_cases(speech).cases[0].passed
    cases["expected"][0][0] += 1  # a token the program does not make
    (bundle / TRANSCRIPTION_CASES_FILE).write_text(json.dumps(cases))
    with pytest.raises(ValidationFailed, match=r"1 of 1 clips .* transcribe otherwise on this machine: clip "
                                               r"'clip-0.wav': new token 0 is .* where its validation generates"):
        run_transcription_cases(speech)


def test_a_front_end_program_off_the_feature_extractor_fails_its_gate_naming_the_clip(
        built: tuple[Path, Path], tmp_path: Path, whisper: Path) -> None:
    _, bundle = built
    report = validate_program(asr_spec(whisper, asr={**ASR, "feature_atol": 1e-9}), bundle, [], scratch_dir=tmp_path)
    [gate] = report.gates
    assert not report.passed and gate.gate == "feature_atol" and gate.measured is not None and gate.measured > 1e-9
    assert re.search(r"largest log-mel difference from WhisperFeatureExtractor's .* \(clip '[a-z0-9-]+'\), at most "
                     r"1e-09 allowed", gate.detail), gate.detail


def test_a_program_whose_transcript_departs_from_eager_is_refused_naming_the_clip_and_both_tokens(
        built: tuple[Path, Path], tmp_path: Path) -> None:
    _, bundle = built
    other = write_tiny_whisper(tmp_path / "other-seed", seed=1, window_s=WINDOW_S, layers=LAYERS)  # the same shapes, other weights
    report = validate_program(asr_spec(other), bundle, [], scratch_dir=tmp_path)
    with pytest.raises(ValidationFailed) as caught:
        require_passed(report)
    assert "clip 'tone-440hz-1s': new token 0 is " in str(caught.value) and "where eager generates" in str(caught.value)
    # Judged as a quantized build would be: by its agreement gate, which names what it measured.
    report = validate_program(asr_spec(other, quantization={"scheme": "int8da4w"}), bundle, [], scratch_dir=tmp_path)
    [gate] = [gate for gate in report.gates if gate.gate == "min_token_agreement"]
    assert not report.passed and not gate.passed and gate.measured is not None and gate.measured < 0.9, gate
    assert "of fp32 eager's transcript tokens the same" in gate.detail


def test_a_quantized_build_passes_its_agreement_gate_at_a_fraction_of_the_size(
        built: tuple[Path, Path], whisper: Path, tmp_path: Path) -> None:
    _, bundle = built
    spec = asr_spec(whisper, version="1-q", quantization={"scheme": "int8da4w"})
    export = export_program(spec, tmp_path)
    report = validate_program(spec, export.path, export.data_files, scratch_dir=tmp_path)
    assert {gate.gate for gate in report.gates} == {"min_token_agreement", "feature_atol"}
    [gate] = [gate for gate in report.gates if gate.gate == "min_token_agreement"]
    assert report.passed and gate.measured is not None and gate.measured >= 0.9
    assert report.quantization is not None and report.quantization.scheme == "int8da4w"
    assert (export.path / "model.pte").stat().st_size < 0.75 * (bundle / "model.pte").stat().st_size


def test_transcribe_prints_a_wav_files_text_as_validated_and_its_real_time_factor(
        built: tuple[Path, Path], tmp_path: Path) -> None:
    root, bundle = built
    clip = write_wav(tmp_path / "chirp.wav", made_clip("chirp-200-2000hz-2s", 16000))
    # By its model name in the store, as a user runs it: the newest version that runs here.
    done = subprocess.run([*CLI, "transcribe", "tiny-whisper", str(clip), "--store", str(root / "store")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    [case] = [case for case in json.loads((bundle / "validation.json").read_text())["generation"]["cases"]
              if case["prompt"] == "chirp-200-2000hz-2s"]
    tokenizer = load_speech_tokenizer(bundle)
    tokens = [tokenizer.token_to_id(piece) for piece in case["actual"]]  # the report spells tokens as pieces
    assert done.stdout.strip() == tokenizer.decode(tokens, skip_special_tokens=True).strip() != ""
    rtf = re.search(r"real-time factor (\d+\.\d+): .* for 2\.00 s of audio", done.stderr)
    assert rtf and float(rtf.group(1)) > 0, done.stderr
    slow = write_wav(tmp_path / "slow.wav", np.zeros(8000), rate=8000)
    done = subprocess.run([*CLI, "transcribe", str(bundle), str(slow)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and done.stderr.strip() == (
        f"SpecError: AUDIO: {slow} is sampled at 8000 Hz; the model's feature extractor takes 16000 Hz: resample it")


# --- a second architecture --------------------------------------------------------------------------------------

def test_a_moonshine_directory_builds_one_program_for_any_length_that_transcribes_as_transformers_generates(
        tmp_path: Path) -> None:
    """Moonshine reads the waveform itself (no log-mel front end, no fixed window): its encoder is exported for any
    length in steps of 384 samples, each clip padded with silence to the next step, and the bundle says the step."""
    import torch
    from transformers import MoonshineForConditionalGeneration

    model_dir = write_tiny_moonshine(tmp_path / "moonshine", train_steps=100, layers=LAYERS)
    (tmp_path / "spec.yaml").write_text(json.dumps({"name": "tiny-moonshine", "version": "1", "model": str(model_dir),
                                                    "asr": {"max_new_tokens": 12}}))
    done = subprocess.run([*CLI, "build", "spec.yaml", "--store", "store"], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, **session_api()}, timeout=900)
    assert done.returncode == 0 and "3 clips, every token as eager's" in done.stdout, done.stdout + done.stderr
    bundle = tmp_path / "store" / "tiny-moonshine" / "1" / "xnnpack" / "cpu-xnnpack-x86_64"
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert set(manifest["methods"]) == {"encoder", "text_decoder", *SPEECH_METADATA, WAVEFORM_STEP_METHOD}
    assert "preprocessor.pte" not in {entry["path"] for entry in manifest["files"]}  # the waveform is the input
    cases = json.loads((bundle / "validation.json").read_text())["generation"]["cases"]
    assert len({tuple(case["actual"]) for case in cases}) > 1, cases  # it hears the clips
    # A clip longer than any validated one, through `transcribe`: transformers' own greedy generate on the same
    # padded waveform says the same.
    samples = made_clip("noise-1500ms", 16000).tolist() * 3 + made_clip("chirp-200-2000hz-2s", 16000).tolist()
    clip = write_wav(tmp_path / "long.wav", np.array(samples))
    done = subprocess.run([*CLI, "transcribe", str(bundle), str(clip)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "for 6.50 s of audio" in done.stderr, done.stderr
    model = MoonshineForConditionalGeneration.from_pretrained(model_dir).eval()
    heard = read_wav(clip, 16000, 30.0, "clip")
    with torch.no_grad():
        generated = model.generate(features_of(load_feature_extractor(model_dir), heard), max_new_tokens=12,
                                   do_sample=False, num_beams=1)
    tokenizer = load_speech_tokenizer(bundle)
    assert done.stdout.strip() == tokenizer.decode(generated[0].tolist(), skip_special_tokens=True).strip() != ""


def test_promote_compares_two_speech_bundles_by_transcript_and_refuses_ones_that_hear_otherwise(
        built: tuple[Path, Path], tmp_path: Path) -> None:
    """The side-by-side `promote` runs: the default clips through both programs; bundles whose front ends differ
    would give the two programs different inputs, so they are refused before either runs."""
    _, bundle = built
    same = ProgramFiles(dir=str(bundle), program="model.pte")
    validation = ValidationSpec(latency_runs=3, latency_warmup=1, latency_max_s=5)
    compared = side_by_side_in_child(SideBySideRequest(current=same, candidate=same, methods={}, validation=validation,
                                                       speech=True).model_dump())
    [method] = compared.methods
    assert (method.method, method.cases, method.disagreeing) == ("transcribe", 3, 0), method
    assert method.current is not None and method.candidate is not None and method.candidate.p50_ms > 0
    other = tmp_path / "other"
    shutil.copytree(bundle, other)
    settings = json.loads((other / "preprocessor_config.json").read_text())
    (other / "preprocessor_config.json").write_text(json.dumps({**settings, "padding_value": 0.5}))
    with pytest.raises(ValidationFailed, match=r"the current bundle's front end \(its preprocessor_config.json\) is "
                                               r"not the candidate's"):
        side_by_side_in_child(SideBySideRequest(current=same, candidate=ProgramFiles(dir=str(other), program="model.pte"),
                                                methods={}, validation=validation, speech=True).model_dump())
