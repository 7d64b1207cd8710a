"""Small decoder LMs made here, for tests, the demo and benchmarks: a config with random weights, no hub.

The tokenizer is a byte-level BPE trained by ``tokenizers`` on a few sentences, without the full byte
alphabet: every token is whole UTF-8, as the LLM runner's Python token callback needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Architectures ``write_tiny_llm`` makes: config ``model_type`` -> (config class, model class) names in transformers.
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
}
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a model turns tokens into text and text into tokens",
    "prefect runs flows of tasks on workers",
    "executorch runs programs on phones and servers",
    "The capital of France is Paris. def fibonacci(n): return n",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10",
]
#: Text whose characters a byte-level BPE with the whole byte alphabet splits over several tokens.
UNICODE_CORPUS = ["héllo wörld, ça va", "日本語のテキスト", "naïve café 東京"]
BOS, EOS = "<s>", "</s>"


def write_tokenizer(path: Path, vocab_size: int = 320, adds_bos: bool = False, byte_alphabet: bool = False,
                    specials: tuple[str, ...] = (BOS, EOS)) -> int:
    """Train a byte-level BPE on ``CORPUS`` and save it as ``path``; its vocabulary size.

    ``adds_bos``: as a Llama-3 tokenizer, its post-processor puts BOS before every text (``TemplateProcessing``), and
    ``tokenizer_config.json`` and ``special_tokens_map.json`` beside it name BOS and EOS. ``byte_alphabet``: every
    byte is a token, as in real byte-level BPEs, and it is trained on ``UNICODE_CORPUS`` too: many tokens are a
    character's first bytes only, not whole UTF-8. ``specials``: the special tokens, ids from 0 in this order.
    """
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet() if byte_alphabet else []
    texts = CORPUS + UNICODE_CORPUS if byte_alphabet else CORPUS
    tokenizer.train_from_iterator(texts * 20, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                                                  initial_alphabet=alphabet))
    if adds_bos:
        bos_id = tokenizer.token_to_id(BOS)
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, bos_id)])
        names = {"bos_token": BOS, "eos_token": EOS}
        (path.parent / "tokenizer_config.json").write_text(json.dumps(
            {**names, "add_bos_token": True, "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512}))
        (path.parent / "special_tokens_map.json").write_text(json.dumps(names))
    tokenizer.save(str(path))
    return int(tokenizer.get_vocab_size())


def write_tiny_llm(model_dir: Path, architecture: str = "llama", *, hidden_size: int = 64, layers: int = 2,
                   seed: int = 0, train_steps: int = 0, adds_bos: bool = False, byte_alphabet: bool = False,
                   **config: Any) -> Path:
    """A Hugging Face model directory (config.json, model.safetensors, tokenizer.json) of a small model.

    Random weights, or ``train_steps`` of Adam on ``CORPUS``: a trained model's next token stands out, as a
    real model's does, which is what a quantized build is judged on. ``adds_bos``: a Llama-3-style tokenizer
    (``write_tokenizer``), whose BOS the model is trained after; ``byte_alphabet``: its tokenizer has every byte.
    """
    import torch
    import transformers

    config_class, model_class = ARCHITECTURES[architecture]
    model_dir.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(model_dir / "tokenizer.json", vocab_size=400 if byte_alphabet else 320, adds_bos=adds_bos,
                            byte_alphabet=byte_alphabet)
    settings: dict[str, Any] = dict(
        vocab_size=vocab, hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden_size // 4, max_position_embeddings=512,
        bos_token_id=0, eos_token_id=1, pad_token_id=1, tie_word_embeddings=False,
    )
    if architecture == "gemma3_text":
        settings.update(sliding_window=8, layer_types=["sliding_attention", "full_attention"] * (layers // 2))
    torch.manual_seed(seed)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**settings | config))
    if train_steps:
        _train(model, model_dir / "tokenizer.json", train_steps)
    model.save_pretrained(model_dir)
    return model_dir


def _train(model: Any, tokenizer_file: Path, steps: int) -> None:
    """Next-token training on ``CORPUS``, one sentence a batch row."""
    import torch
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    rows = [tokenizer.encode(text).ids for text in CORPUS]
    width = max(len(row) for row in rows)
    ids = torch.tensor([row + [1] * (width - len(row)) for row in rows])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
