"""The ``asr:`` section of a spec: a speech-recognition encoder-decoder (Whisper, Moonshine) from a local Hugging Face
model directory.

With it, ``model`` names that directory (``config.json``, safetensors weights, ``tokenizer.json``,
``preprocessor_config.json``) and the program has two methods: ``encoder`` (Whisper's log-mel features of one 30-s
window, or Moonshine's waveform, in; every decoder layer's cross-attention keys and values out) and ``text_decoder``
(one token a call into a static self-attention cache, those keys and values beside it), with the metadata a consumer
needs to drive them (``export/speech.py``). Validation is by transcript:
each clip through eager PyTorch and through the program, greedy, token for token (``validate/transcription.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from prefect_executorch.errors import SpecError
from prefect_executorch.spec.base import StrictModel

#: The feature extractor's settings (sampling rate, mel bins, window): the bundle carries them for its front end.
PREPROCESSOR_FILE = "preprocessor_config.json"
#: The log-mel front end as its own program (ExecuTorch's ``extension.audio.mel_spectrogram``): waveform in, the
#: encoder's features out, so that a consumer needs no Python audio stack.
PREPROCESSOR_PROGRAM = "preprocessor.pte"
#: The bundle's own test cases: each clip's name and the program's tokens when validated.
TRANSCRIPTION_CASES_FILE = "transcription_cases.json"
#: The constant methods a consumer drives a speech program by (``export/speech.py`` answers each).
SPEECH_METADATA = ("get_decoder_prompt_ids", "get_eos_ids", "get_max_seq_len", "get_vocab_size", "get_feature_shape")
#: The constant method of a waveform encoder's program that answers the step its input's length goes in.
WAVEFORM_STEP_METHOD = "get_waveform_step"
#: Config ``model_type``s this section builds: Whisper (ExecuTorch's and optimum-executorch's ASR exports are its) and
#: Moonshine (an encoder of the raw waveform).
ARCHITECTURES = ("whisper", "moonshine")
#: The files of a speech model directory that decide a build, where present (weights are every ``*.safetensors``).
SPEECH_MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "added_tokens.json", PREPROCESSOR_FILE)


class SpeechRecognitionSpec(StrictModel):
    """How a speech encoder-decoder is exported (its decoder's cache) and validated (clips, greedy transcripts)."""

    clips: list[str] = Field(
        default_factory=list, max_length=64, description="Validation audio: 16-bit PCM .wav files at the feature "
        "extractor's sampling rate, each within the encoder's window (relative to the spec); default: three clips "
        "made here (a tone, a chirp, noise).")
    max_new_tokens: int = Field(32, ge=1, le=440, description="Tokens transcribed per clip at most; fp32 must match "
                                "eager's, token for token.")
    language: str | None = Field(None, description="Language token to force after the start token, e.g. 'en' for "
                                 "<|en|>; default: none (the model predicts it).")
    task: Literal["transcribe", "translate"] | None = Field(
        None, description="Task token to force (<|transcribe|>, <|translate|>); default: none.")
    timestamps: bool = Field(False, description="Whether the model may predict timestamps; false forces "
                             "<|notimestamps|> where the tokenizer has it.")
    feature_atol: float = Field(
        1e-3, gt=0, description="Gate of the front-end program: the largest absolute difference of its log-mel "
        "features from WhisperFeatureExtractor's, over every clip.")
    min_token_agreement: float = Field(
        0.9, ge=0, le=1, description="Gate of quantized builds: share of fp32 eager's transcript tokens the program "
        "reproduces at the same positions, over every clip.")

    @field_validator("clips")
    @classmethod
    def _wav_files(cls, clips: list[str]) -> list[str]:
        for index, clip in enumerate(clips):
            if not clip.lower().endswith(".wav"):
                raise ValueError(f"clips[{index}]: {clip!r} is not a .wav file; give 16-bit PCM WAV audio")
        return clips


def check_speech_model_dir(model_dir: str) -> None:
    """Check, without loading anything, that ``model_dir`` holds a speech model this section builds."""
    path = Path(model_dir)
    if not path.is_dir():
        raise SpecError(f"model: {model_dir} is not a directory; with `asr`, model is a Hugging Face model directory")
    if not (path / "config.json").is_file():
        raise SpecError(f"model: {model_dir} has no config.json; save the model there with save_pretrained()")
    try:
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError) as exc:
        raise SpecError(f"model: {model_dir}/config.json is not a JSON object: {exc}") from None
    if model_type not in ARCHITECTURES:
        raise SpecError(f"model: {model_dir} is a {model_type!r} model; `asr` builds {', '.join(ARCHITECTURES)} "
                        "encoder-decoders (docs/asr.md)")
    if not any(path.glob("*.safetensors")):
        raise SpecError(f"model: {model_dir} has no .safetensors weights; save the model with save_pretrained()")
    for name, how in (("tokenizer.json", "the tokenizer"), (PREPROCESSOR_FILE, "the feature extractor")):
        if not (path / name).is_file():
            raise SpecError(f"model: {model_dir} has no {name}; save {how} there with save_pretrained()")


def speech_model_files(model_dir: str) -> list[Path]:
    """The files that decide a speech build: configs, tokenizer, preprocessor and safetensors weights, stably ordered."""
    path = Path(model_dir)
    found = [path / name for name in SPEECH_MODEL_FILES if (path / name).is_file()]
    return [*found, *sorted(path.glob("*.safetensors"))]
