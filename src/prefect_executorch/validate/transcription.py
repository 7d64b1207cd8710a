"""Validation by transcript: each clip's encoder input (Whisper's log-mel features, Moonshine's waveform) through
eager PyTorch and through the program, both greedy from the same forced start tokens (the argmax after each token, no
logits processor on either side: a model's ``suppress_tokens`` are not applied, as a consumer driving the program does
not apply them), up to ``asr.max_new_tokens`` tokens or an end id. A float32 program must transcribe what eager does, token for token;
a quantized or bf16 one is judged by its agreement with fp32 eager (``asr.min_token_agreement``)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_executorch.clips import DEFAULT_CLIPS
from prefect_executorch.errors import ChildProcessFailed, ValidationFailed
from prefect_executorch.export.quantize import build_facts
from prefect_executorch.export.speech import DECODER
from prefect_executorch.isolation import StartMethod, run_isolated
from prefect_executorch.runtime.speech import (
    CASES_TIMEOUT_S,
    FrontEnd,
    ProgramTranscriber,
    SpeechBundle,
    TranscriptionCases,
    bundle_clips,
    token_pieces,
)
from prefect_executorch.scratch import scratch_dir
from prefect_executorch.spec.asr import PREPROCESSOR_PROGRAM, TRANSCRIPTION_CASES_FILE
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.speech_model import (
    cache_argument,
    decoder_prompt,
    end_ids,
    features_of,
    load_speech_model,
    load_speech_tokenizer,
    validation_clips,
)
from prefect_executorch.targets import get_target
from prefect_executorch.validate.generation import compare_generation
from prefect_executorch.validate.report import GateResult, GenerationReport, ValidationReport

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from prefect_executorch.validate.validator import ValidateRequest


def write_cases(spec: BuildSpec, bundle: Path, cases_file: Path, actual: list[list[int]]) -> None:
    """The clips and the program's tokens as the bundle's own cases; a spec's .wav clips copied into the bundle."""
    assert spec.asr is not None
    names = []
    for index, clip in enumerate(spec.asr.clips):
        names.append(f"clip-{index}.wav")
        shutil.copyfile(clip, bundle / names[-1])
    cases = TranscriptionCases(max_new_tokens=spec.asr.max_new_tokens, clips=names or list(DEFAULT_CLIPS),
                               expected=actual)
    cases_file.write_text(cases.model_dump_json(indent=1))


def run_transcription_cases(bundle: SpeechBundle, *, scratch: Path | None = None, shown_as: Path | None = None,
                            start: StartMethod | None = None) -> GenerationReport:
    """Run a speech bundle's own clips on this machine, in a child; ``ValidationFailed`` naming the first that
    transcribes otherwise."""
    bundle_dir = Path(bundle.bundle_dir)
    where = shown_as or bundle_dir
    if not (bundle_dir / TRANSCRIPTION_CASES_FILE).is_file():
        raise ValidationFailed(f"{where} has no {TRANSCRIPTION_CASES_FILE} to run (a speech bundle's own clips and "
                               "tokens); nothing was verified: revalidate it with `prefect-executorch validate`")
    with scratch_dir("asr", scratch) as work:
        try:
            report = run_isolated("verify-transcription", bundle, GenerationReport, timeout_s=CASES_TIMEOUT_S,
                                  scratch_dir=work, start=start,
                                  what=f"the transcription cases of {where}")
        except ChildProcessFailed as exc:
            raise ValidationFailed(f"{exc}; the program did not transcribe on this machine",
                                   child_output=exc.child_output) from exc
    failed = report.failed_cases()
    if failed:
        raise ValidationFailed(f"{len(failed)} of {len(report.cases)} clips of {where / TRANSCRIPTION_CASES_FILE} "
                               f"transcribe otherwise on this machine: {failed[0].describe()}; do not deploy it on "
                               "this machine")
    return report


def verify_transcription_in_child(request: dict[str, Any]) -> GenerationReport:
    """Child side: each of the bundle's clips through its program, against the tokens it made when validated."""
    req = SpeechBundle.model_validate(request)
    bundle = Path(req.bundle_dir)
    cases = TranscriptionCases.model_validate_json((bundle / TRANSCRIPTION_CASES_FILE).read_text())
    transcriber = req.open()
    tokenizer, front = load_speech_tokenizer(bundle), FrontEnd(bundle)
    results, timings = [], []
    for clip, expected in zip(bundle_clips(cases, bundle, front.extractor), cases.expected, strict=True):
        actual, timing = transcriber.transcribe(front.features(clip.samples), cases.max_new_tokens)
        results.append(compare_generation(clip.name, len(transcriber.prompt), token_pieces(tokenizer, expected),
                                          token_pieces(tokenizer, actual), reference="its validation", subject="clip"))
        timings.append(timing)
    return GenerationReport(new_tokens=cases.max_new_tokens, cases=results, stats=timings,
                            generated_by=ProgramTranscriber.name)


def eager_transcript(model: PreTrainedModel, features: torch.Tensor, prompt: list[int], new_tokens: int,
                     ends: set[int]) -> list[int]:
    """Eager PyTorch's greedy transcript of ``features`` after ``prompt``: the encoder once, the decoder a token a call."""
    import torch

    encoded = model.get_encoder()(**{model.main_input_name: features})
    cache_name = cache_argument(model.forward)
    output = model(encoder_outputs=encoded, decoder_input_ids=torch.tensor([prompt]), use_cache=True)
    tokens: list[int] = []
    while True:
        tokens.append(int(output.logits[0, -1].argmax()))
        if len(tokens) == new_tokens or tokens[-1] in ends:
            return tokens
        output = model(encoder_outputs=encoded, decoder_input_ids=torch.tensor([[tokens[-1]]]),
                       use_cache=True, **{cache_name: getattr(output, cache_name)})


def validate_transcription(req: ValidateRequest) -> ValidationReport:
    """Child side of a speech model's validation: every clip through eager PyTorch and the program; a float build must
    transcribe token for token, a quantized one pass its agreement gate."""
    import torch

    spec, bundle = req.spec, Path(req.bundle_dir)
    assert spec.asr is not None
    target = get_target(spec.target_name)
    started = time.monotonic()
    transcriber = SpeechBundle(bundle_dir=req.bundle_dir, program=req.program, target=target.name,
                               data_files=req.data_files, runtime_hints=target.runtime_hints(spec)).open()
    program = transcriber.program
    load_seconds = time.monotonic() - started
    model = load_speech_model(spec)
    tokenizer = load_speech_tokenizer(spec.model)
    prompt, ends = decoder_prompt(spec, model, tokenizer), set(end_ids(model))
    front = FrontEnd(bundle)  # the bundle's own front end, as a consumer runs it
    cases, timings, actuals, feature_errors = [], [], [], {}
    with torch.no_grad():
        for clip in validation_clips(spec, front.extractor):
            reference = features_of(front.extractor, clip.samples)
            features = front.features(clip.samples)
            feature_errors[clip.name] = float((features - reference).abs().max())
            expected = eager_transcript(model, reference, prompt, spec.asr.max_new_tokens, ends)
            actual, timing = transcriber.transcribe(features, spec.asr.max_new_tokens)
            actuals.append(actual)
            cases.append(compare_generation(clip.name, len(prompt), token_pieces(tokenizer, expected),
                                            token_pieces(tokenizer, actual), subject="clip"))
            timings.append(timing)
    # Judged against fp32 eager on this CPU: exactly where the program computes in float32, else by the agreement gate.
    report = GenerationReport(new_tokens=spec.asr.max_new_tokens, cases=cases, stats=timings,
                              exact=spec.quantization is None and target.compute_dtype(spec) is None,
                              generated_by=ProgramTranscriber.name)
    gates = ([] if report.exact else [agreement_gate(report, spec)]) + \
        ([front_end_gate(feature_errors, spec)] if front.program is not None else [])
    passed = report.passed and all(gate.passed for gate in gates)
    if req.bundled_out and passed:
        write_cases(spec, bundle, Path(req.bundled_out), actuals)
    return ValidationReport(
        passed=passed, cases=[], load_seconds=load_seconds,
        delegates={name: facts.delegates for name, facts in program.facts.items()}, used_data_file=bool(req.data_files),
        gates=gates, delegation=req.delegation, generation=report,
        quantization=build_facts(spec, model, None, 0) if spec.quantization else None,
        file_sizes={name: (bundle / name).stat().st_size for name in [req.program, *req.data_files]},
    )


def front_end_gate(errors: dict[str, float], spec: BuildSpec) -> GateResult:
    """The front-end program's gate: its features against ``WhisperFeatureExtractor``'s, the worst clip named."""
    assert spec.asr is not None
    worst = max(errors, key=lambda name: errors[name])
    limit = spec.asr.feature_atol
    return GateResult(gate="feature_atol", section="asr", method=PREPROCESSOR_PROGRAM, measured=errors[worst],
                      limit=limit, passed=errors[worst] <= limit,
                      detail=f"largest log-mel difference from WhisperFeatureExtractor's {errors[worst]:.3g} (clip "
                      f"{worst!r}), at most {limit:g} allowed")


def agreement_gate(report: GenerationReport, spec: BuildSpec) -> GateResult:
    """A quantized or bf16 build's gate: the share of fp32 eager's tokens it transcribes the same, before each first
    divergence."""
    assert spec.asr is not None
    agreement, minimum = report.agreement(), spec.asr.min_token_agreement
    return GateResult(gate="min_token_agreement", section="asr", method=DECODER, measured=agreement, limit=minimum,
                      passed=agreement >= minimum, detail=f"{agreement:.1%} of fp32 eager's transcript tokens the same "
                      f"before each clip's first departure, at least {minimum:.1%} required")
