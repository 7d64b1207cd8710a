"""Child side of a speech-recognition export: the encoder (Whisper's log-mel features of one window, or Moonshine's
waveform, in; every decoder layer's cross-attention keys and values out) and the text decoder (one token a call into a
static self-attention cache, those keys and values beside it) from transformers' ExecuTorch wrappers, lowered into one
program with the metadata a consumer drives them by."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_executorch.errors import ExportFailed
from prefect_executorch.export.quantize import QuantizationFacts, build_facts, quantize_model
from prefect_executorch.export.stages import run_lowering, summary
from prefect_executorch.spec.asr import PREPROCESSOR_PROGRAM, SPEECH_MODEL_FILES, WAVEFORM_STEP_METHOD
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.speech_model import (
    WAVEFORM_MIN_STEPS,
    WAVEFORM_STEP,
    cache_argument,
    decoder_prompt,
    end_ids,
    features_of,
    load_feature_extractor,
    load_speech_model,
    load_speech_tokenizer,
    takes_waveform,
    waveform_steps,
)
from prefect_executorch.targets.base import Lowered, Target

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, WhisperFeatureExtractor

#: The program's methods, as optimum-executorch's ASR export names them.
ENCODER, DECODER = "encoder", "text_decoder"


#: transformers' name of the attention the program is exported with (``speech_attention``).
SPEECH_ATTENTION = "executorch_speech"
#: Set on a decoder layer's cross-attention module: its keys come transposed, ``[batch, heads, head dim, frames]``.
KEYS_TRANSPOSED = "keys_transposed"


def speech_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     **_: Any) -> tuple[torch.Tensor, None]:
    """Whisper's eager attention (matmuls and a softmax, which XNNPACK takes whole) as 3-D batched matmuls of views.

    A 4-D ``matmul`` lowers with a copy of each operand it expands and of the keys it transposes: every layer's
    cross-attention keys and values, on every token. Here the cross-attention keys come transposed from the encoder
    method, so a decoder step copies none of them.
    """
    import torch

    batch, heads, length, dim = query.shape
    rows = batch * heads
    keys = key.reshape(rows, dim, -1) if getattr(module, KEYS_TRANSPOSED, False) else \
        key.reshape(rows, -1, dim).transpose(1, 2)
    scores = torch.bmm(query.reshape(rows, length, dim), keys) * (dim**-0.5 if scaling is None else scaling)
    if attention_mask is not None:
        scores = (scores.view(batch, heads, length, -1) + attention_mask).view(rows, length, -1)
    weights = torch.nn.functional.softmax(scores, dim=-1)
    output = torch.bmm(weights, value.reshape(rows, -1, dim)).view(batch, heads, length, dim)
    return output.transpose(1, 2).contiguous(), None


def in_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` in ``dtype``; the same tensor (no operator in the graph) where it is in it already."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def waveform_lengths(steps: int, tensors: int) -> tuple[Any, Any]:
    """The dynamic shapes of a waveform encoder's method (its samples: any number of ``WAVEFORM_STEP`` steps up to
    ``steps``) and of the decoder's (the frames of the ``tensors`` cross-attention keys and values it takes, as many as
    the encoder makes: fewer than its steps)."""
    import torch

    frames = torch.export.Dim("frames", min=2, max=steps)
    samples = WAVEFORM_STEP * torch.export.Dim("steps", min=WAVEFORM_MIN_STEPS, max=steps)
    # Keys come transposed ([batch, heads, head dim, frames]), values not ([batch, heads, frames, head dim]).
    return ({1: samples},), (None, tuple({3 if index % 2 == 0 else 2: frames} for index in range(tensors)), None)


def cache_length(prompt: list[int], max_new_tokens: int) -> int:
    """The decoder's static cache: the forced prompt and every new token."""
    return len(prompt) + max_new_tokens


def speech_metadata(model: PreTrainedModel, prompt: list[int], length: int, largest: list[int],
                    waveform: bool) -> dict[str, Any]:
    """The constant methods a consumer reads to drive the program: its start tokens, end ids, cache, the largest input
    it takes and, for a waveform encoder, the step its length goes in."""
    return {
        "get_decoder_prompt_ids": prompt,
        "get_eos_ids": end_ids(model),
        "get_max_seq_len": length,
        "get_vocab_size": int(model.config.vocab_size),
        "get_feature_shape": largest,
        **({WAVEFORM_STEP_METHOD: WAVEFORM_STEP} if waveform else {}),
    }


def encoder_module(model: PreTrainedModel) -> torch.nn.Module:
    """The encoder and every decoder layer's cross-attention key and value projections of its states, as a module of
    the encoder's input alone (Whisper's features, Moonshine's waveform): keys and values of layer 0, then of layer
    1..., each ``[1, heads, frames, head dim]``, computed once a clip, in float32 whatever ``model``'s type (as its
    input).

    (transformers' encoder wrapper passes ``input_ids``; its decoder wrapper projects the encoder's states again on
    every token, 4 layers x 2 GEMMs of 1,500 frames a token at whisper-tiny's size, which eager's cache does once.)
    """
    import torch

    attention = model.get_decoder().layers[0].encoder_attn

    class SpeechEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = model.get_encoder()
            self.projections = torch.nn.ModuleList(projection for layer in model.get_decoder().layers
                                                   for projection in (layer.encoder_attn.k_proj, layer.encoder_attn.v_proj))

        def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, ...]:
            states = self.encoder(**{model.main_input_name: in_dtype(features, model.dtype)}).last_hidden_state
            shape = (states.shape[0], -1, self.projections[0].out_features // attention.head_dim, attention.head_dim)
            # As the attention projects them, [batch, heads, frames, head dim]; keys transposed for speech_attention.
            return tuple(in_dtype(projection(states).view(shape).permute(0, 2, 3, 1).contiguous() if index % 2 == 0
                              else projection(states).view(shape).transpose(1, 2).contiguous(), torch.float32)
                         for index, projection in enumerate(self.projections))

    return SpeechEncoder().eval()


def decoder_module(model: PreTrainedModel, length: int) -> torch.nn.Module:
    """transformers' static-cache decoder wrapper over ``model``, its cross-attention read from the encoder method's
    keys and values (its inputs, a tensor each) instead of projected from the encoder's states on every call; float32
    in and out whatever ``model``'s type."""
    import torch
    from transformers.cache_utils import DynamicCache, DynamicLayer, EncoderDecoderCache
    from transformers.integrations.executorch import Seq2SeqLMDecoderExportableModuleWithStaticCache

    def holding(cross_attention: tuple[torch.Tensor, ...]) -> DynamicCache:
        # Each layer's keys and values as they are: DynamicCache's own fill concatenates them onto an empty tensor,
        # which would copy every one on every token.
        cache = DynamicCache()
        for index in range(0, len(cross_attention), 2):
            layer = DynamicLayer()
            layer.lazy_initialization(cross_attention[index], cross_attention[index + 1])
            layer.keys, layer.values = cross_attention[index], cross_attention[index + 1]
            cache.layers.append(layer)
        return cache

    class WithLmHead(torch.nn.Module):  # the wrapper reads ``lm_head``: Whisper's is ``proj_out``
        def __init__(self) -> None:
            super().__init__()
            self.model, self.lm_head, self.config = model, model.get_output_embeddings(), model.config

        def get_decoder(self) -> torch.nn.Module:
            return model.get_decoder()  # type: ignore[no-any-return]

    class CrossCachedDecoder(Seq2SeqLMDecoderExportableModuleWithStaticCache):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(WithLmHead(), max_static_cache_length=length, batch_size=1)
            # The wrapper makes its cache in float32: a bf16 model's keys cannot be copied into it.
            for index, layer in enumerate(self.static_cache.layers):
                layer.keys, layer.values = layer.keys.to(model.dtype), layer.values.to(model.dtype)
                self.register_buffer(f"key_cache_{index}", layer.keys, persistent=False)
                self.register_buffer(f"value_cache_{index}", layer.values, persistent=False)

        def forward(self, decoder_input_ids: torch.Tensor, cross_attention: tuple[torch.Tensor, ...],
                    cache_position: torch.Tensor) -> torch.Tensor:
            cross_attention = tuple(in_dtype(tensor, model.dtype) for tensor in cross_attention)
            for layer in self.static_cache.layers:  # the wrapper's own reset: positions from cache_position
                layer.cumulative_length.copy_(cache_position[0])
            # A cross-attention cache that holds every layer's keys and values counts as updated: the attention reads
            # it and leaves the encoder's states alone. Those are needed only as the flag that a layer cross-attends,
            # and for their shape ([batch, frames, width]: a model that masks cross-attention sizes its mask by it):
            # the first layer's values, viewed so.
            cache = EncoderDecoderCache(self.static_cache, holding(cross_attention))
            states = cross_attention[1].transpose(1, 2).flatten(2)
            outputs = self.decoder(input_ids=decoder_input_ids, encoder_hidden_states=states, use_cache=True,
                                   **{cache_name: cache})
            return in_dtype(self.lm_head(outputs[0]), torch.float32)

    cache_name = cache_argument(model.get_decoder().forward)
    for layer in model.get_decoder().layers:
        setattr(layer.encoder_attn, KEYS_TRANSPOSED, True)
    return CrossCachedDecoder()


def export_front_end(extractor: WhisperFeatureExtractor, path: Path) -> None:
    """ExecuTorch's own log-mel front end (``extension.audio.mel_spectrogram``, lowered to XNNPACK) with the model's
    feature extractor settings, one window of audio at most, as the program at ``path``."""
    from executorch.extension.audio.mel_spectrogram import export_processor

    try:
        export_processor(str(path), backend="xnnpack", feature_size=extractor.feature_size,
                         sampling_rate=extractor.sampling_rate, hop_length=extractor.hop_length,
                         chunk_length=extractor.chunk_length, n_fft=extractor.n_fft,
                         padding_value=extractor.padding_value, max_audio_len=extractor.chunk_length)
    except Exception as exc:  # torch.export and ExecuTorch's lowering raise many types
        raise ExportFailed(f"stage front end: ExecuTorch's log-mel front end does not export with the settings of "
                           f"preprocessor_config.json: {summary(exc)}") from exc


def lower_speech(spec: BuildSpec, target: Target, out_dir: Path) -> tuple[Lowered, QuantizationFacts | None]:
    """Export the spec's speech model (its linears quantized, if the spec says so) as ``encoder`` and ``text_decoder``
    and lower both, with the metadata, tokenizer and front end's settings, into ``out_dir``."""
    import torch
    from transformers import WhisperFeatureExtractor

    assert spec.asr is not None
    # Attention as matmuls and a softmax, which XNNPACK takes whole: SDPA's decomposition leaves its masked-row
    # handling (eq, any, where over every head's 1500 x 1500 scores) to portable kernels, the encoder 2.4x slower.
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(SPEECH_ATTENTION, speech_attention)
    AttentionMaskInterface.register(SPEECH_ATTENTION, eager_mask)  # additive masks, as eager attention takes them
    loaded = load_speech_model(spec, attention=SPEECH_ATTENTION)
    prompt = decoder_prompt(spec, loaded, load_speech_tokenizer(spec.model))
    length = cache_length(prompt, spec.asr.max_new_tokens)
    positions = getattr(loaded.config, "max_target_positions", None) or loaded.config.max_position_embeddings
    if length > positions:
        raise ExportFailed(f"asr.max_new_tokens: {spec.asr.max_new_tokens} new tokens after {len(prompt)} forced ones "
                           f"pass the decoder's {positions} positions; lower asr.max_new_tokens")
    extractor = load_feature_extractor(spec.model)
    waveform = takes_waveform(extractor)
    # A waveform encoder is exported at its longest: ExecuTorch bounded the input by the example's size, not the
    # declared range (31,104 samples for a 16,128-sample example), and refused longer clips at run time.
    example = waveform_steps(extractor) * WAVEFORM_STEP if waveform else extractor.sampling_rate
    features = features_of(extractor, torch.zeros(example).numpy())
    encoder_shapes, decoder_shapes = waveform_lengths(features.shape[-1] // WAVEFORM_STEP,
                                                      2 * len(loaded.get_decoder().layers)) if waveform else (None, None)
    facts = build_facts(spec, loaded, None, 0) if spec.quantization else None
    # On the target's device in its compute type: a GPU's compiler builds for the device it was exported on.
    model: Any = target.placed_model(quantize_model(loaded, spec), spec)
    with torch.no_grad():
        try:
            encoder = encoder_module(model)
            features = features.to(model.device)
            cross_attention = encoder(features)
            decoder = decoder_module(model, length)
            # strict: the non-strict export of the decoder wrapper fails in ExecuTorch's lowering (run_decompositions:
            # "expected compiled_fn to be GraphModule").
            programs = {
                ENCODER: torch.export.export(encoder, (features,), dynamic_shapes=encoder_shapes, strict=True),
                DECODER: torch.export.export(decoder, (torch.tensor([[prompt[0]]], device=model.device),
                                                       cross_attention, torch.tensor([0], device=model.device)),
                                             dynamic_shapes=decoder_shapes, strict=True),
            }
        except Exception as exc:  # transformers and torch.export raise many types
            raise ExportFailed(f"stage torch.export: the {loaded.config.model_type} model in {spec.model} does not "
                               f"export as an encoder and a decoder with a static cache of {length} positions: "
                               f"{summary(exc)}") from exc
        metadata = speech_metadata(loaded, prompt, length, list(features.shape), waveform)
        lowered = run_lowering(lambda: target.lower(programs, spec, out_dir, constant_methods=metadata), target.name)
    if isinstance(extractor, WhisperFeatureExtractor):  # a waveform encoder's front end is the waveform itself
        export_front_end(extractor, out_dir / PREPROCESSOR_PROGRAM)
    for name in SPEECH_MODEL_FILES:  # what a consumer's tokenizer and front end read, and the model's shape
        if (Path(spec.model) / name).is_file():
            shutil.copyfile(Path(spec.model) / name, out_dir / name)
    return lowered, facts
