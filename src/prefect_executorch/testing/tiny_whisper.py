"""Small Whisper models made here, for tests and benchmarks: a config with random weights, no hub.

Its tokenizer is ``tiny_llm``'s byte-level BPE with Whisper's special tokens first (end of text, start of transcript,
a language, the tasks, no timestamps), and the directory holds the feature extractor's settings beside it, as
``save_pretrained`` writes a real Whisper's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect_executorch.testing.tiny_llm import CORPUS, write_tokenizer

#: Whisper's special tokens, ids 0.. in this order.
SPECIALS = ("<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|translate|>", "<|notimestamps|>")


def write_tiny_whisper(model_dir: Path, *, d_model: int = 64, layers: int = 2, mel_bins: int = 80, seed: int = 0,
                       train_steps: int = 0,
                       **config: Any) -> Path:
    """A Hugging Face Whisper directory (config.json, model.safetensors, tokenizer.json, preprocessor_config.json).

    Random weights repeat one token whatever they hear, which would let a program that ignored its input pass: with
    ``train_steps`` of Adam the model learns to transcribe each default clip as a sentence of ``CORPUS`` (after the
    start, English, transcribe and no-timestamps tokens), so its transcript depends on the audio and its next token
    stands out, as a real model's does, which is what a quantized build is judged on.
    """
    import torch
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    model_dir.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(model_dir / "tokenizer.json", specials=SPECIALS)
    settings: dict[str, Any] = dict(
        vocab_size=vocab, num_mel_bins=mel_bins, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=2 * d_model, decoder_ffn_dim=2 * d_model,
        max_target_positions=64, pad_token_id=0, bos_token_id=0, eos_token_id=0, decoder_start_token_id=1,
        suppress_tokens=[], begin_suppress_tokens=[],
    )
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(WhisperConfig(**settings | config))
    model.generation_config = GenerationConfig(decoder_start_token_id=1, eos_token_id=0, pad_token_id=0)
    extractor = WhisperFeatureExtractor(feature_size=mel_bins)
    if train_steps:
        _train(model, extractor, model_dir / "tokenizer.json", train_steps)
    model.save_pretrained(model_dir)
    extractor.save_pretrained(model_dir)
    return model_dir


def _train(model: Any, extractor: Any, tokenizer_file: Path, steps: int) -> None:
    """Each default clip to its own sentence of ``CORPUS``, ended by <|endoftext|>."""
    import torch
    from tokenizers import Tokenizer

    from prefect_executorch.clips import DEFAULT_CLIPS, made_clip

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    prompt = [SPECIALS.index(token) for token in ("<|startoftranscript|>", "<|en|>", "<|transcribe|>",
                                                   "<|notimestamps|>")]
    rows = [prompt + tokenizer.encode(text).ids + [0] for text in CORPUS[:len(DEFAULT_CLIPS)]]
    width = max(len(row) for row in rows)
    tokens = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    labels = tokens[:, 1:].clone()
    labels[:, :len(prompt) - 1] = -100  # the forced tokens are given, not learned
    for row, length in enumerate(len(row) for row in rows):
        labels[row, length - 1:] = -100
    clips = [made_clip(name, extractor.sampling_rate) for name in DEFAULT_CLIPS]
    features = extractor(clips, sampling_rate=extractor.sampling_rate, return_tensors="pt").input_features
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        loss = model(input_features=features, decoder_input_ids=tokens[:, :-1], labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
