"""The ``llm:`` section of a spec: a decoder language model from a local Hugging Face model directory.

With it, ``model`` names that directory (``config.json``, safetensors weights, ``tokenizer.json``) and the
program is the one ExecuTorch's LLM runner drives: the prompt in one call, then one token a call, into a static KV
cache, with the metadata methods the runner reads (``export/causal_lm.py``). Validation is by generation
(``validate/generation.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from prefect_executorch.spec.base import StrictModel

#: Prompts validated when the spec gives none: prose, code and a list, short enough for a small cache.
DEFAULT_PROMPTS = ("The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,")
#: What a model directory's tokenizer file is called, and the name it has in a bundle.
TOKENIZER_FILE = "tokenizer.json"
#: The tokenizer's configuration beside it, where present (which tokens are BOS and EOS): the bundle carries them, and
#: ExecuTorch's runner reads them when given the bundle's folder.
TOKENIZER_CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")
#: The constant methods ExecuTorch's LLM runner reads from the program (extension/llm/runner/constants.h).
RUNNER_METADATA = ("get_max_seq_len", "get_max_context_len", "get_vocab_size", "get_bos_id", "get_eos_ids",
                   "use_kv_cache", "enable_dynamic_shape", "use_sdpa_with_kv_cache")
#: The bundle's own test cases: its prompts and eager's tokens, which `verify` runs through the runner again.
GENERATION_CASES_FILE = "generation_cases.json"


class TextGenerationSpec(StrictModel):
    """How a decoder LM is exported (its cache) and validated (prompts, greedy tokens through the runner)."""

    tokenizer: str | None = Field(
        None, description="The tokenizer.json the runner uses (relative to the spec); default: the model directory's."
    )
    max_seq_len: int = Field(
        128, ge=2, le=32768, description="Longest prompt plus generated text, in tokens: the static KV cache's length."
    )
    prompts: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PROMPTS), min_length=1, max_length=64,
        description="Validation prompts: each is generated greedily by eager PyTorch and by the program.",
    )
    new_tokens: int = Field(32, ge=1, description="Tokens generated per prompt; fp32 must match eager's, token for token.")
    prefill: Literal["auto", "one_call", "token_by_token"] = Field(
        "auto", description="one_call: the program takes the prompt in one call (a dynamic sequence, up to "
        "max_seq_len - 1 tokens), then one token a call; token_by_token: one token every call (static shapes); auto: "
        "one_call, except where the target replays a static forward (cuda with cuda_graphs).")
    attention: Literal["auto", "executorch", "transformers"] = Field(
        "auto", description="executorch: ExecuTorch's custom SDPA and KV-cache update ops (CPU targets; what its LLM "
        "export uses); transformers: the model's own attention over transformers' static cache; auto: executorch where "
        "the target and the model allow it.")
    min_top1_agreement: float = Field(
        0.9, ge=0, le=1, description="Gate of quantized builds: share of positions where the program's most likely "
        "next token is fp32 eager's, fed eager's tokens (teacher-forced).")
    max_perplexity_ratio: float = Field(
        1.2, ge=1, description="Gate of quantized builds: the program's perplexity of eager's continuations over fp32 "
        "eager's own.")

    @model_validator(mode="after")
    def _fits(self) -> TextGenerationSpec:
        for index, prompt in enumerate(self.prompts):
            if not prompt.strip():
                raise ValueError(f"prompts[{index}] is empty; give text to generate from")
        if self.new_tokens >= self.max_seq_len:
            raise ValueError(f"new_tokens ({self.new_tokens}) must be below max_seq_len ({self.max_seq_len}), "
                             "which holds the prompt too")
        return self

    def tokenizer_path(self, model_dir: str) -> Path:
        """The tokenizer file: the one given, else the model directory's."""
        return Path(self.tokenizer) if self.tokenizer else Path(model_dir) / TOKENIZER_FILE


def check_model_dir(model_dir: str, tokenizer: Path) -> None:
    """Check, without loading anything, that ``model_dir`` looks like a Hugging Face model and ``tokenizer`` exists."""
    from prefect_executorch.errors import SpecError

    path = Path(model_dir)
    if not path.is_dir():
        raise SpecError(f"model: {model_dir} is not a directory; with `llm`, model is a Hugging Face model directory")
    if not (path / "config.json").is_file():
        raise SpecError(f"model: {model_dir} has no config.json; save the model there with save_pretrained()")
    if not any(path.glob("*.safetensors")):
        raise SpecError(f"model: {model_dir} has no .safetensors weights; save the model with save_pretrained() "
                        "(safetensors is its default)")
    if not tokenizer.is_file():
        raise SpecError(f"llm.tokenizer: {tokenizer} does not exist; save the tokenizer as {TOKENIZER_FILE} in the "
                        "model directory or give its path")


def tokenizer_files(tokenizer: Path) -> list[Path]:
    """The tokenizer file and the configuration files beside it that exist, in a stable order."""
    return [tokenizer, *(found for name in TOKENIZER_CONFIG_FILES if (found := tokenizer.parent / name).is_file())]


def model_files(model_dir: str, tokenizer: Path) -> list[Path]:
    """The files that decide an LLM build: configs, safetensors weights and the tokenizer's files, in a stable order."""
    path = Path(model_dir)
    found = [path / name for name in ("config.json", "generation_config.json") if (path / name).is_file()]
    return [*found, *sorted(path.glob("*.safetensors")), *tokenizer_files(tokenizer)]
