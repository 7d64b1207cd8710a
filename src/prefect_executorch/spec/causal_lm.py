"""Load an `llm:` spec's model and tokenizer, offline, and check that they belong together (export and validation both do)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefect_executorch.errors import SpecError, ToolchainMismatch
from prefect_executorch.spec.buildspec import BuildSpec

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedModel

#: Architectures (config ``model_type``) whose export and generation this project tests (tests/validate/test_llm.py).
SUPPORTED_ARCHITECTURES = ("gemma3_text", "llama", "qwen2", "qwen3")


#: What installs the stack a decoder-LM build needs (README).
LLM_INSTALL = 'pip install "prefect-executorch[llm]" -c constraints-cpu.txt'


def require_llm_stack(section: str = "llm") -> None:
    """Refuse, before any export, a Hugging Face model's build (the spec's ``section``) where transformers or
    tokenizers is not installed."""
    import importlib.util

    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except (ImportError, ValueError):  # a finder that refuses it
            return True

    missing = [name for name in ("transformers", "tokenizers") if absent(name)]
    if missing:
        kind = "a decoder LM" if section == "llm" else "a speech model"
        raise ToolchainMismatch(f"{section}: building {kind} needs {' and '.join(missing)}, which this worker lacks; "
                                f"install the llm extra: {LLM_INSTALL}")


def check_positions(spec: BuildSpec) -> None:
    """Refuse a cache longer than the positions the model was made for (its config's ``max_position_embeddings``),
    read from ``config.json`` without loading the model."""
    import json
    from pathlib import Path

    assert spec.llm is not None
    config = json.loads((Path(spec.model) / "config.json").read_text())
    limit = config.get("max_position_embeddings", (config.get("text_config") or {}).get("max_position_embeddings"))
    if isinstance(limit, int) and spec.llm.max_seq_len > limit:
        raise SpecError(f"llm.max_seq_len: {spec.llm.max_seq_len} is more positions than the model takes (its "
                        f"max_position_embeddings is {limit}): positions past it were never trained; set max_seq_len "
                        f"to at most {limit}")


def load_tokenizer(spec: BuildSpec) -> Tokenizer:
    """The spec's ``tokenizer.json``, as ``tokenizers`` reads it (what the runner's tokenizer reads too)."""
    from tokenizers import Tokenizer

    assert spec.llm is not None
    path = spec.llm.tokenizer_path(spec.model)
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own Exception for a file it cannot parse
        raise SpecError(f"llm.tokenizer: {path} is not a tokenizer.json that `tokenizers` reads: {exc}") from exc


def load_causal_lm(spec: BuildSpec) -> PreTrainedModel:
    """The model directory's causal LM in float32, eval mode, loaded from local files only."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(spec.model, local_files_only=True)
    architecture = getattr(config, "model_type", None)
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise SpecError(f"model: architecture {architecture!r} ({spec.model}) is not supported; supported: "
                        f"{', '.join(SUPPORTED_ARCHITECTURES)} (decoder-only text models; docs/llm.md)")
    model = AutoModelForCausalLM.from_pretrained(spec.model, local_files_only=True, dtype=torch.float32)
    return model.eval()


def check_vocabulary(model: PreTrainedModel, tokenizer: Tokenizer) -> None:
    """Refuse a tokenizer whose ids the model's embedding cannot take."""
    vocab = model.config.get_text_config().vocab_size
    if tokenizer.get_vocab_size() > vocab:
        raise SpecError(f"llm.tokenizer: it has {tokenizer.get_vocab_size()} tokens, more than the model's vocab_size "
                        f"of {vocab}: they do not belong together; give the model's own tokenizer.json")


def eos_ids(model: PreTrainedModel) -> list[int]:
    """The ids that end generation: the generation config's, else the model config's."""
    found: Any = getattr(model.generation_config, "eos_token_id", None)
    if found is None:
        found = model.config.get_text_config().eos_token_id
    return [] if found is None else [found] if isinstance(found, int) else list(found)


def prompt_ids(tokenizer: Tokenizer, prompt: str) -> list[int]:
    """``prompt`` as transformers' tokenizer encodes it by default: with the special tokens its post-processor adds
    (a Llama-3 tokenizer's BOS)."""
    return list(tokenizer.encode(prompt).ids)


def special_token_counts(tokenizer: Tokenizer, prompt: str) -> tuple[int, int]:
    """How many special tokens the default encoding puts before and after ``prompt``'s own: ExecuTorch's runner adds
    them when told these counts (its ``num_bos``/``num_eos``)."""
    plain, full = tokenizer.encode(prompt, add_special_tokens=False).ids, prompt_ids(tokenizer, prompt)
    before = next((start for start in range(len(full) - len(plain) + 1) if full[start:start + len(plain)] == plain), None)
    if before is None:
        raise SpecError(f"llm.tokenizer: its post-processor changes the prompt's own tokens ({prompt[:40]!r}: {plain} "
                        f"becomes {full}); only tokens added before and after it can be run by ExecuTorch's runner")
    return before, len(full) - len(plain) - before


def partial_utf8_tokens(tokenizer: Tokenizer) -> int:
    """How many of the vocabulary's tokens are not whole UTF-8 on their own (a byte-level BPE's lone bytes of a
    character: their text alone decodes to U+FFFD)."""
    return sum("\ufffd" in tokenizer.decode([token], skip_special_tokens=False)
               for token in range(tokenizer.get_vocab_size()))


def token_texts(tokenizer: Tokenizer, tokens: list[int]) -> list[str]:
    """Each token's text as it completes, decoded incrementally (``tokenizers``' ``DecodeStream``): a token that ends
    inside a character gives "" and the character comes whole with the token that completes it."""
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(skip_special_tokens=False)
    return [stream.step(tokenizer, token) or "" for token in tokens]


def check_prompt_lengths(spec: BuildSpec, tokenizer: Tokenizer) -> None:
    """Refuse a prompt that, with ``new_tokens``, does not fit the cache (before the export, not after it)."""
    assert spec.llm is not None
    for index, prompt in enumerate(spec.llm.prompts):
        length = len(prompt_ids(tokenizer, prompt))
        if length + spec.llm.new_tokens > spec.llm.max_seq_len:
            raise SpecError(f"llm.prompts[{index}]: {length} tokens plus new_tokens ({spec.llm.new_tokens}) exceed "
                            f"max_seq_len ({spec.llm.max_seq_len}); shorten the prompt or raise max_seq_len")
