"""Small speech encoder-decoders made here, for tests and benchmarks: a config with random weights, no hub.

Each tokenizer is ``tiny_llm``'s byte-level BPE with the architecture's special tokens first, and the directory holds
the feature extractor's settings beside it, as ``save_pretrained`` writes a real model's: a Whisper (log-mel features)
and a Moonshine (the raw waveform).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect_executorch.testing.tiny_llm import CORPUS, write_tokenizer

#: Whisper's special tokens, ids 0.. in this order.
SPECIALS = ("<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|translate|>", "<|notimestamps|>")
#: Moonshine's special tokens, ids 0.. in this order: unknown, start (its decoder's first token), end.
MOONSHINE_SPECIALS = ("<unk>", "<s>", "</s>")


def write_tiny_whisper(model_dir: Path, *, d_model: int = 64, layers: int = 2, mel_bins: int = 80, seed: int = 0,
                       train_steps: int = 0, window_s: int = 30, **config: Any) -> Path:
    """A Hugging Face Whisper directory (config.json, model.safetensors, tokenizer.json, preprocessor_config.json).

    Random weights repeat one token whatever they hear, which would let a program that ignored its input pass: with
    ``train_steps`` of Adam the model learns to transcribe each default clip as a sentence of ``CORPUS`` (after the
    start, English, transcribe and no-timestamps tokens), so its transcript depends on the audio and its next token
    stands out, as a real model's does, which is what a quantized build is judged on. ``window_s`` is the encoder's
    window (Whisper's is 30 s: its feature extractor's ``chunk_length``, two mel frames an encoder position); a shorter
    one makes every encoder call cheaper by as much, which the tests take.
    """
    import torch
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    model_dir.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(model_dir / "tokenizer.json", specials=SPECIALS)
    settings: dict[str, Any] = dict(
        vocab_size=vocab, num_mel_bins=mel_bins, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model,
        max_source_positions=window_s * 50, max_target_positions=64, pad_token_id=0, bos_token_id=0, eos_token_id=0,
        decoder_start_token_id=1, suppress_tokens=[], begin_suppress_tokens=[],
    )
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(WhisperConfig(**settings | config))
    model.generation_config = GenerationConfig(decoder_start_token_id=1, eos_token_id=0, pad_token_id=0)
    extractor = WhisperFeatureExtractor(feature_size=mel_bins, chunk_length=window_s)
    if train_steps:
        prompt = [SPECIALS.index(token) for token in ("<|startoftranscript|>", "<|en|>", "<|transcribe|>",
                                                       "<|notimestamps|>")]
        _train(model, extractor, model_dir / "tokenizer.json", prompt, SPECIALS.index("<|endoftext|>"), train_steps)
    model.save_pretrained(model_dir)
    extractor.save_pretrained(model_dir)
    return model_dir


def write_tiny_moonshine(model_dir: Path, *, hidden: int = 64, layers: int = 2, seed: int = 0,
                         train_steps: int = 0) -> Path:
    """A Hugging Face Moonshine directory (config.json, model.safetensors, tokenizer.json, preprocessor_config.json):
    an encoder of the raw 16 kHz waveform (no log-mel front end), trained as ``write_tiny_whisper``'s is, from its
    start token alone (Moonshine forces no language or task)."""
    import torch
    from transformers import (
        GenerationConfig,
        MoonshineConfig,
        MoonshineForConditionalGeneration,
        Wav2Vec2FeatureExtractor,
    )

    model_dir.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(model_dir / "tokenizer.json", specials=MOONSHINE_SPECIALS)
    torch.manual_seed(seed)
    model = MoonshineForConditionalGeneration(MoonshineConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, encoder_num_hidden_layers=layers,
        decoder_num_hidden_layers=layers, encoder_num_attention_heads=4, decoder_num_attention_heads=4,
        max_position_embeddings=64, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, pad_token_id=2,
        # Heads of 16 padded with zeros to 24, as a checkpoint may ask for its kernels: a build must leave them out
        # and still transcribe what transformers does with them.
        pad_head_dim_to_multiple_of=12))
    model.generation_config = GenerationConfig(decoder_start_token_id=1, eos_token_id=2, pad_token_id=2)
    # As UsefulSensors' checkpoints set it: the waveform as it is, no normalisation.
    extractor = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=False,
                                         return_attention_mask=True)
    if train_steps:
        _train(model, extractor, model_dir / "tokenizer.json", [1], 2, train_steps)
    model.save_pretrained(model_dir)
    extractor.save_pretrained(model_dir)
    return model_dir


def _train(model: Any, extractor: Any, tokenizer_file: Path, prompt: list[int], end: int, steps: int) -> None:
    """Each default clip to its own sentence of ``CORPUS`` after ``prompt``, ended by ``end`` (the clips padded to one
    length, with the mask where the extractor makes one)."""
    import torch
    from tokenizers import Tokenizer

    from prefect_executorch.clips import DEFAULT_CLIPS, made_clip

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    rows = [prompt + tokenizer.encode(text).ids + [end] for text in CORPUS[:len(DEFAULT_CLIPS)]]
    width = max(len(row) for row in rows)
    tokens = torch.tensor([row + [end] * (width - len(row)) for row in rows])
    labels = tokens[:, 1:].clone()
    labels[:, :len(prompt) - 1] = -100  # the forced tokens are given, not learned
    for row, length in enumerate(len(row) for row in rows):
        labels[row, length - 1:] = -100
    clips = [made_clip(name, extractor.sampling_rate) for name in DEFAULT_CLIPS]
    # A waveform extractor pads only when asked; Whisper's pads every clip to its window itself.
    padding = {"padding": True} if extractor.model_input_names[0] == "input_values" else {}
    batch = extractor(clips, sampling_rate=extractor.sampling_rate, return_tensors="pt", **padding)
    inputs = {name: batch[name] for name in extractor.model_input_names if name in batch}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = model(**inputs, decoder_input_ids=tokens[:, :-1], labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
