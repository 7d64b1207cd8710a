"""A speech bundle run as its consumer runs it: the front end (the bundle's log-mel program, or the waveform as it
is), the encoder once a clip, then the decoder a token a call, greedy; ``transcribe`` in a child process."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from prefect_executorch.clips import DEFAULT_CLIPS, made_clip
from prefect_executorch.export.speech import DECODER, ENCODER
from prefect_executorch.isolation import StartMethod, run_isolated
from prefect_executorch.runtime.decoding import GenerationStats
from prefect_executorch.runtime.loaded_program import LoadedProgram
from prefect_executorch.spec.asr import PREPROCESSOR_PROGRAM, TRANSCRIPTION_CASES_FILE
from prefect_executorch.spec.speech_model import (
    Clip,
    features_of,
    load_feature_extractor,
    load_speech_tokenizer,
    read_wav,
    window_s,
)
from prefect_executorch.targets import get_target

if TYPE_CHECKING:
    import numpy as np
    import torch
    from tokenizers import Tokenizer
    from transformers.feature_extraction_sequence_utils import SequenceFeatureExtractor


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


def token_pieces(tokenizer: Tokenizer, tokens: list[int]) -> list[str]:
    """Each token as the tokenizer spells it (the report shows them; an id it does not know, as the number)."""
    return [tokenizer.id_to_token(token) or str(token) for token in tokens]

