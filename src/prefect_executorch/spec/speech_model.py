"""An ``asr:`` spec's model, tokenizer, feature extractor and clips, loaded offline from its model directory (the
export and validation children both use them)."""

from __future__ import annotations

import inspect
import wave
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from prefect_executorch.clips import DEFAULT_CLIPS, made_clip
from prefect_executorch.errors import SpecError
from prefect_executorch.spec.asr import ARCHITECTURES
from prefect_executorch.spec.buildspec import BuildSpec

if TYPE_CHECKING:
    import numpy as np
    import torch
    from tokenizers import Tokenizer
    from transformers import PreTrainedModel
    from transformers.feature_extraction_sequence_utils import SequenceFeatureExtractor


#: Moonshine's encoder strides the waveform by 64 x 3 x 2 samples: its program takes lengths in steps of this (what
#: torch.export proves the encoder's shapes for), each clip padded with silence to the next step.
WAVEFORM_STEP = 384
#: The fewest steps the waveform program takes (0.26 s at 16 kHz), a shorter clip padded to it.
WAVEFORM_MIN_STEPS = 11
#: The longest clip a waveform encoder's program takes: Moonshine has no fixed window.
WAVEFORM_WINDOW_S = 30.0


class Clip(NamedTuple):
    """One validation clip: its name (the file's, or a made clip's) and its samples at the extractor's rate."""

    name: str
    samples: np.ndarray


def load_speech_model(spec: BuildSpec, attention: str | None = None) -> PreTrainedModel:
    """The model directory's speech encoder-decoder in float32, eval mode, loaded from local files only, with
    transformers' ``attention`` implementation (default: its own choice)."""
    import torch
    from transformers import AutoConfig, AutoModelForSpeechSeq2Seq

    config = AutoConfig.from_pretrained(spec.model, local_files_only=True)
    if getattr(config, "model_type", None) not in ARCHITECTURES:
        raise SpecError(f"model: architecture {config.model_type!r} ({spec.model}) is not supported by `asr`; "
                        f"supported: {', '.join(ARCHITECTURES)} (docs/asr.md)")
    # Moonshine may pad its attention heads with zeros for kernels that want a multiple: no result changes without
    # them, and the program's attention takes the keys and values the encoder method made, unpadded.
    if getattr(config, "pad_head_dim_to_multiple_of", None):
        config.pad_head_dim_to_multiple_of = None
    return AutoModelForSpeechSeq2Seq.from_pretrained(spec.model, config=config, local_files_only=True,
                                                     dtype=torch.float32, attn_implementation=attention).eval()


def load_feature_extractor(model_dir: str | Path) -> SequenceFeatureExtractor:
    """The front end as the model directory's ``preprocessor_config.json`` sets it: Whisper's log-mel features, or
    Moonshine's waveform as it is."""
    from transformers import AutoFeatureExtractor

    return AutoFeatureExtractor.from_pretrained(str(model_dir), local_files_only=True)  # type: ignore[no-any-return]


def takes_waveform(extractor: SequenceFeatureExtractor) -> bool:
    """Whether the encoder reads the waveform itself (Moonshine) rather than features of a fixed window (Whisper)."""
    return bool(cast(Any, extractor).model_input_names[0] == "input_values")


def window_s(extractor: SequenceFeatureExtractor) -> float:
    """The longest clip the encoder takes, in seconds."""
    return WAVEFORM_WINDOW_S if takes_waveform(extractor) else float(cast(Any, extractor).chunk_length)


def steps_holding(samples: int) -> int:
    """The fewest ``WAVEFORM_STEP`` steps that hold ``samples``."""
    return -(-samples // WAVEFORM_STEP)


def waveform_steps(extractor: SequenceFeatureExtractor) -> int:
    """The ``WAVEFORM_STEP`` steps that hold the longest clip a waveform encoder takes."""
    return steps_holding(int(window_s(extractor) * extractor.sampling_rate))


def load_speech_tokenizer(model_dir: str | Path) -> Tokenizer:
    """The model directory's ``tokenizer.json``."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))


def decoder_prompt(spec: BuildSpec, model: PreTrainedModel, tokenizer: Tokenizer) -> list[int]:
    """The tokens the decoder starts from: the model's start token, then the language, task and no-timestamps tokens
    the spec forces (each refused by name where the tokenizer lacks it)."""
    assert spec.asr is not None
    prompt = [int(model.config.decoder_start_token_id)]
    wanted = [(f"<|{spec.asr.language}|>", "asr.language") if spec.asr.language else None,
              (f"<|{spec.asr.task}|>", "asr.task") if spec.asr.task else None]
    for token, field in filter(None, wanted):
        found = tokenizer.token_to_id(token)
        if found is None:
            raise SpecError(f"{field}: the tokenizer has no {token} token; give one it has, or leave {field} out")
        prompt.append(found)
    no_timestamps = tokenizer.token_to_id("<|notimestamps|>")
    if not spec.asr.timestamps and no_timestamps is not None:
        prompt.append(no_timestamps)
    return prompt


def cache_argument(forward: Callable[..., Any]) -> str:
    """The name a transformers ``forward`` takes its cache by, and its output returns it by: ``cache`` since
    transformers renamed it, ``past_key_values`` before (5.17's, which the GPU image holds)."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def end_ids(model: PreTrainedModel) -> list[int]:
    """The model's end-of-transcript ids (its generation config's, else its config's)."""
    ends = getattr(model.generation_config, "eos_token_id", None) or model.config.eos_token_id
    return [int(end) for end in (ends if isinstance(ends, list) else [ends])]


def read_wav(path: Path, rate: int, window_s: float, field: str) -> np.ndarray:
    """A 16-bit PCM WAV file's samples in [-1, 1] (channels averaged), refused unless at ``rate`` and within the
    encoder's window of ``window_s`` seconds."""
    import numpy as np

    try:
        with wave.open(str(path), "rb") as audio:
            channels, width, found = audio.getnchannels(), audio.getsampwidth(), audio.getframerate()
            frames = audio.readframes(audio.getnframes())
    except (OSError, wave.Error, EOFError) as exc:
        raise SpecError(f"{field}: {path} is not a readable WAV file: {exc}") from None
    if width != 2:
        raise SpecError(f"{field}: {path} has {8 * width}-bit samples; give 16-bit PCM WAV")
    if found != rate:
        raise SpecError(f"{field}: {path} is sampled at {found} Hz; the model's feature extractor takes {rate} Hz: "
                        "resample it")
    samples = np.frombuffer(frames, dtype="<i2").astype(np.float32).reshape(-1, channels).mean(axis=1) / 32768
    if not len(samples):
        raise SpecError(f"{field}: {path} holds no samples; give a clip with sound in it")
    if len(samples) > rate * window_s:
        raise SpecError(f"{field}: {path} lasts {len(samples) / rate:.1f} s, longer than the encoder's window of "
                        f"{window_s:g} s; cut it into clips of at most {window_s:g} s")
    return samples


def validation_clips(spec: BuildSpec, extractor: SequenceFeatureExtractor) -> list[Clip]:
    """The spec's clips (or the default ones), each as samples at the feature extractor's rate."""
    assert spec.asr is not None
    rate, window = int(extractor.sampling_rate), window_s(extractor)
    if not spec.asr.clips:
        return [Clip(name=name, samples=made_clip(name, rate)) for name in DEFAULT_CLIPS]
    return [Clip(name=Path(clip).name, samples=read_wav(Path(clip), rate, window, f"asr.clips[{index}]"))
            for index, clip in enumerate(spec.asr.clips)]


def features_of(extractor: SequenceFeatureExtractor, samples: np.ndarray) -> torch.Tensor:
    """What the encoder reads of the clip: its log-mel features, padded to the encoder's window (``[1, mel bins,
    frames]``), or its waveform padded with silence to the next ``WAVEFORM_STEP`` (``[1, samples]``)."""
    import torch

    inputs = cast(Any, extractor)(samples, sampling_rate=extractor.sampling_rate, return_tensors="pt")
    if not takes_waveform(extractor):
        return inputs.input_features  # type: ignore[no-any-return]
    values = inputs.input_values
    steps = max(steps_holding(values.shape[-1]), WAVEFORM_MIN_STEPS)
    return torch.nn.functional.pad(values, (0, steps * WAVEFORM_STEP - values.shape[-1]))

