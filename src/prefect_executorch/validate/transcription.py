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

from pydantic import BaseModel, Field

from prefect_executorch.clips import DEFAULT_CLIPS, made_clip
from prefect_executorch.errors import ChildProcessFailed, ValidationFailed
from prefect_executorch.export.quantize import build_facts
from prefect_executorch.export.speech import DECODER, ENCODER
from prefect_executorch.isolation import StartMethod, run_isolated
from prefect_executorch.scratch import scratch_dir
from prefect_executorch.spec.asr import PREPROCESSOR_PROGRAM, TRANSCRIPTION_CASES_FILE
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.speech_model import (
    Clip,
    cache_argument,
    decoder_prompt,
    end_ids,
    features_of,
    load_feature_extractor,
    load_speech_model,
    load_speech_tokenizer,
    read_wav,
    validation_clips,
    window_s,
)
from prefect_executorch.targets import get_target
from prefect_executorch.validate.generation import compare_generation
from prefect_executorch.validate.loaded_program import LoadedProgram
from prefect_executorch.validate.report import GateResult, GenerationReport, GenerationStats, ValidationReport

if TYPE_CHECKING:
    import numpy as np
    import torch
    from tokenizers import Tokenizer
    from transformers import PreTrainedModel
    from transformers.feature_extraction_sequence_utils import SequenceFeatureExtractor

    from prefect_executorch.validate.validator import ValidateRequest


#: Wall-time limit of a child that runs a bundle's clips again (a small model takes seconds).
CASES_TIMEOUT_S = 600.0


class TranscriptionCases(BaseModel):
    """What ``transcription_cases.json`` holds: the bundle's own test cases, which `verify` runs again."""

    max_new_tokens: int
    clips: list[str] = Field(description="Each clip: a default clip's name, or a .wav file the bundle carries.")
    expected: list[list[int]] = Field(description="The program's tokens per clip when it was validated.")


class SpeechBundle(BaseModel):
    """A speech bundle as a child runs it: its folder, program, data files and the runtime its target sets up."""

    bundle_dir: str
    program: str
    target: str = Field(description="The bundle's target: which runtime runs it.")
    data_files: list[str] = Field(default_factory=list)
    runtime_hints: dict[str, Any] = Field(default_factory=dict, description="The bundle's runtime hints (its manifest's).")

    def open(self) -> ProgramTranscriber:
        """The bundle's program, loaded after its target's runtime setup, as a consumer drives it."""
        get_target(self.target).runtime_setup(self.runtime_hints)
        bundle = Path(self.bundle_dir)
        return ProgramTranscriber(LoadedProgram(bundle / self.program,
                                                bundle / self.data_files[0] if self.data_files else None))


class TranscribeRequest(SpeechBundle):
    """What the child that transcribes a user's audio file with a speech bundle gets."""

    audio: str
    max_new_tokens: int | None = Field(default=None, description="None: as many as the decoder's cache holds.")


class Transcript(BaseModel):
    """One audio file transcribed by a bundle's program, and what it took."""

    text: str
    tokens: list[int]
    audio_s: float
    features_s: float = Field(description="The front end: the encoder's input by the bundle's preprocessor settings.")
    program_s: float = Field(description="The encoder once and the decoder a token a call.")
    stats: GenerationStats
    capped_at: int | None = Field(default=None, description="The new tokens the cache holds, where fewer than asked "
                                  "and the transcript filled them.")

    @property
    def real_time_factor(self) -> float:
        """Seconds of work per second of audio: front end and program."""
        return (self.features_s + self.program_s) / self.audio_s


def bundle_clips(cases: TranscriptionCases, bundle: Path, extractor: SequenceFeatureExtractor) -> list[Clip]:
    """The cases' clips as samples: made again by name, or read from the bundle's copies."""
    rate, window = int(extractor.sampling_rate), window_s(extractor)
    return [Clip(name=name, samples=made_clip(name, rate) if name in DEFAULT_CLIPS
                 else read_wav(bundle / name, rate, window, f"{TRANSCRIPTION_CASES_FILE}: clip {name}"))
            for name in cases.clips]


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


def transcribe(bundle: SpeechBundle, audio: Path, max_new_tokens: int | None, scratch: Path, *,
               start: StartMethod | None = None) -> Transcript:
    """``audio`` (a WAV file) transcribed greedily by the bundle's program, in a child working in ``scratch``."""
    request = TranscribeRequest(**bundle.model_dump(), audio=str(audio.resolve()), max_new_tokens=max_new_tokens)
    return run_isolated("transcribe", request, Transcript, timeout_s=CASES_TIMEOUT_S, scratch_dir=scratch, start=start,
                        what=f"transcription of {audio} with {bundle.bundle_dir}")


def transcribe_in_child(request: dict[str, Any]) -> Transcript:
    """Child side: the audio's features, then the program from its start tokens to an end id or the token limit."""
    req = TranscribeRequest.model_validate(request)
    bundle = Path(req.bundle_dir)
    transcriber = req.open()  # the target's runtime set up before the front-end program loads ExecuTorch's own
    front, tokenizer = FrontEnd(bundle), load_speech_tokenizer(bundle)
    rate = int(front.extractor.sampling_rate)
    samples = read_wav(Path(req.audio), rate, window_s(front.extractor), "AUDIO")
    room = transcriber.max_new_tokens
    started = time.perf_counter()
    features = front.features(samples)
    featured = time.perf_counter()
    tokens, stats = transcriber.transcribe(features, min(req.max_new_tokens or room, room))
    return Transcript(text=tokenizer.decode(tokens, skip_special_tokens=True).strip(), tokens=tokens,
                      audio_s=len(samples) / rate, features_s=featured - started,
                      program_s=time.perf_counter() - featured, stats=stats,
                      capped_at=room if (req.max_new_tokens or 0) > room == len(tokens) else None)


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


class FrontEnd:
    """The encoder's input as the bundle's consumer computes it: log-mel features by its front-end program (a bundle
    built before it had one: ``WhisperFeatureExtractor`` with the bundle's settings), a waveform encoder's by its
    extractor (the waveform, padded to its step)."""

    def __init__(self, bundle: Path) -> None:
        self.extractor = load_feature_extractor(bundle)
        path = bundle / PREPROCESSOR_PROGRAM
        self.program = LoadedProgram(path, None) if path.is_file() else None

    def features(self, samples: np.ndarray) -> torch.Tensor:
        """``samples``' features ``[1, mel bins, frames]``, padded to the encoder's window (a waveform: ``[1, samples]``,
        padded to its step)."""
        import torch

        if self.program is None:
            return features_of(self.extractor, samples)
        return self.program.execute("forward", (torch.from_numpy(samples),))[0]  # type: ignore[no-any-return]


class ProgramTranscriber:
    """The program driven as a consumer drives it: ``encoder`` once a clip, then ``text_decoder`` a token a call from
    the start tokens and up to the end ids its metadata names."""

    name = "ExecuTorch's runtime: encoder once, text_decoder a token a call"

    def __init__(self, program: LoadedProgram) -> None:
        self.program = program
        self.prompt = [int(token) for token in program.execute("get_decoder_prompt_ids", ())]
        self.ends = {int(token) for token in program.execute("get_eos_ids", ())}
        #: The most new tokens its cache holds after the start tokens.
        self.max_new_tokens = int(program.execute("get_max_seq_len", ())[0]) - len(self.prompt)

    def transcribe(self, features: torch.Tensor, new_tokens: int) -> tuple[list[int], GenerationStats]:
        """The greedy transcript of ``features`` and its timing (time to the first new token, decode rate)."""

        started = time.perf_counter()
        # Every layer's cross-attention keys and values (a program built before them: the encoder's states).
        states = self.program.execute(ENCODER, (features,))
        tokens: list[int] = []
        logits: Any = None
        for position, token in enumerate(self.prompt):
            logits = self._decode(token, states, position)
        first = time.perf_counter()
        while True:
            tokens.append(int(logits[0, -1].argmax()))
            if len(tokens) == new_tokens or tokens[-1] in self.ends:
                break
            logits = self._decode(tokens[-1], states, len(self.prompt) + len(tokens) - 1)
        ended = time.perf_counter()
        return tokens, GenerationStats(
            time_to_first_token_ms=(first - started) * 1000,
            decode_tokens_per_s=(len(tokens) - 1) / (ended - first) if len(tokens) > 1 else None,
            prefill_tokens_per_s=len(self.prompt) / (first - started),
        )

    def _decode(self, token: int, states: list[torch.Tensor], position: int) -> torch.Tensor:
        import torch

        return self.program.execute(DECODER, (torch.tensor([[token]]), *states, torch.tensor([position])))[0]


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


def token_pieces(tokenizer: Tokenizer, tokens: list[int]) -> list[str]:
    """Each token as the tokenizer spells it (the report shows them; an id it does not know, as the number)."""
    return [tokenizer.id_to_token(token) or str(token) for token in tokens]


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
