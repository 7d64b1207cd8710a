"""A decoder LM's program generating greedily: through ExecuTorch's LLM runner where the target's runtime ships one,
else the program's forward called here a prompt (or a token) a call, as the runner would."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Field

from prefect_executorch.machine.runtime_extension import runtime_extension
from prefect_executorch.runtime.loaded_program import LoadedProgram, register_custom_op_kernels
from prefect_executorch.spec.causal_lm import partial_utf8_tokens, prompt_ids, special_token_counts
from prefect_executorch.spec.llm import tokenizer_files
from prefect_executorch.targets import get_target

if TYPE_CHECKING:
    import torch


class GenerationStats(BaseModel):
    """The LLM runner's timing of one prompt (its own stats: milliseconds, so short runs round to zero)."""

    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    time_to_first_token_ms: float | None = None

    @classmethod
    def of(cls, stats: Any) -> GenerationStats:
        """From the runner's ``Stats``."""
        prefill_ms = stats.prompt_eval_end_ms - stats.inference_start_ms
        decode_ms = stats.inference_end_ms - stats.prompt_eval_end_ms
        decoded = stats.num_generated_tokens - 1  # the first comes with the prefill
        return cls(
            prefill_tokens_per_s=stats.num_prompt_tokens * 1000 / prefill_ms if prefill_ms > 0 else None,
            decode_tokens_per_s=decoded * 1000 / decode_ms if decode_ms > 0 and decoded > 0 else None,
            time_to_first_token_ms=float(stats.first_token_ms - stats.inference_start_ms),
        )



class GenerationCases(BaseModel):
    """What ``generation_cases.json`` holds."""

    new_tokens: int
    prompts: list[str]
    expected: list[list[str]] = Field(description="The program's own tokens per prompt, each as its text: what it "
                                      "generated when validated, and what `verify` must reproduce.")
    eager: list[list[str]] | None = Field(None, description="fp32 eager's tokens per prompt, where a quantized or "
                                          "lower-precision program's differ from them (None: they are the same).")


class Generator(Protocol):
    """Greedy generation by a program: ExecuTorch's LLM runner, or the program one token per call."""

    #: What generates, in words: the report says which path judged a build.
    name: str

    def greedy(self, prompt: str, new_tokens: int,
               on_piece: Callable[[str], None] | None = None) -> tuple[list[str], GenerationStats]:
        """``prompt`` continued greedily from an empty cache, each token as its text, and the timing;
        ``on_piece`` gets each token's text as it is made."""
        ...


def load_runner(program: Path, tokenizer: Path) -> Any:
    """ExecuTorch's ``TextLLMRunner`` over a program and its tokenizer, with the runtime's quantized kernels.

    Given the tokenizer's folder where its configuration is there, the runner takes BOS and EOS from it, as
    transformers does.
    """
    from executorch.extension.llm.runner import TextLLMRunner

    runtime_extension()  # registers the quantized kernels (a program with quantized embeddings needs them)
    register_custom_op_kernels()  # and ExecuTorch's LLM ops (custom SDPA, KV-cache update)
    configured = len(tokenizer_files(tokenizer)) > 1
    return TextLLMRunner(str(program), str(tokenizer.parent if configured else tokenizer))


class LlmRunner:
    """ExecuTorch's ``TextLLMRunner``: what a consumer's app runs on CPU targets."""

    name = "ExecuTorch's LLM runner"

    def __init__(self, program: Path, tokenizer: Path) -> None:
        from tokenizers import Tokenizer

        self.runner = load_runner(program, tokenizer)
        self.tokenizer = Tokenizer.from_file(str(tokenizer))

    def greedy(self, prompt: str, new_tokens: int,
               on_piece: Callable[[str], None] | None = None) -> tuple[list[str], GenerationStats]:
        from executorch.extension.llm.runner import GenerationConfig

        pieces: list[str] = []
        stats: list[Any] = []

        def take(piece: str) -> None:
            pieces.append(piece)
            if on_piece is not None:
                on_piece(piece)

        # The special tokens transformers' encoding adds (a Llama-3 tokenizer's BOS), added by the runner alike.
        bos, eos = special_token_counts(self.tokenizer, prompt)
        self.runner.reset()
        self.runner.generate(prompt, GenerationConfig(echo=False, max_new_tokens=new_tokens, temperature=0.0,
                                                      num_bos=bos, num_eos=eos),
                             token_callback=take, stats_callback=stats.append)
        return pieces, GenerationStats.of(stats[-1]) if stats else GenerationStats()


class ForwardCalls:
    """The program's ``forward`` called here through ExecuTorch's runtime, as the LLM runner calls it: the prompt in one
    call where the program takes a sequence (its ``enable_dynamic_shape``; chunked at its ``get_max_seq_len``), else a
    token a call, then one token a call. Where the runtime that has a program's delegate ships no LLM runner (the
    runtime wheel with ``CudaBackend``) this generates, with the program's own end-of-sequence ids; validation's
    teacher-forced pass feeds every program through it."""

    def __init__(self, program: LoadedProgram, tokenizer: Path, why: str = "this runtime has no LLM runner") -> None:
        from tokenizers import Tokenizer

        self.program, self.tokenizer = program, Tokenizer.from_file(str(tokenizer))
        self.eos = {int(token) for token in self._constant("get_eos_ids", [])}
        self.sequence = bool(self._constant("enable_dynamic_shape", [False])[0])
        self.chunk = int(self._constant("get_max_seq_len", [1])[0]) if self.sequence else 1
        self.name = (f"ExecuTorch's runtime, {'the prompt in one call' if self.sequence else 'one token per call'} "
                     f"({why})")

    def _constant(self, method: str, default: list[Any]) -> list[Any]:
        return list(self.program.execute(method, ())) if method in self.program.facts else default

    def logits(self, tokens: list[int], start: int) -> torch.Tensor:
        """The logits after each of ``tokens``, fed from cache position ``start`` (the cache holds what came before)."""
        import torch

        rows = []
        for offset in range(0, len(tokens), self.chunk):
            piece = tokens[offset:offset + self.chunk]
            positions = torch.arange(start + offset, start + offset + len(piece))
            rows.append(self.program.execute("forward", (torch.tensor([piece]), positions))[0][0])
        return torch.cat(rows)

    def next_logits(self, token: int, position: int) -> torch.Tensor:
        """The next-token logits after ``token`` at ``position``."""
        return self.logits([token], position)[-1]

    def greedy(self, prompt: str, new_tokens: int,
               on_piece: Callable[[str], None] | None = None) -> tuple[list[str], GenerationStats]:
        from tokenizers.decoders import DecodeStream

        ids = prompt_ids(self.tokenizer, prompt)
        started = time.perf_counter()
        logits = self.logits(ids, 0)[-1]
        prefilled = time.perf_counter()
        pieces: list[str] = []
        stream = DecodeStream(skip_special_tokens=False)  # a character split over tokens comes whole (token_texts)
        while True:
            token = int(logits.argmax())
            pieces.append(stream.step(self.tokenizer, token) or "")
            if on_piece is not None:
                on_piece(pieces[-1])
            if len(pieces) == new_tokens or token in self.eos:
                break
            logits = self.next_logits(token, len(ids) + len(pieces) - 1)
        ended = time.perf_counter()
        return pieces, GenerationStats(
            prefill_tokens_per_s=len(ids) / (prefilled - started),
            decode_tokens_per_s=(len(pieces) - 1) / (ended - prefilled) if len(pieces) > 1 else None,
            time_to_first_token_ms=(prefilled - started) * 1000,
        )


def open_generator(program: Path, tokenizer: Path, target: str, data: Path | None = None,
                   hints: Mapping[str, Any] | None = None) -> Generator:
    """What generates with ``program`` on ``target``: ExecuTorch's LLM runner where its runtime ships one, else
    the program's forward called here through the runtime that has the target's delegate, set up as the bundle's
    runtime ``hints`` say (CUDA-graph replay)."""
    from tokenizers import Tokenizer

    chosen = get_target(target)
    partial = partial_utf8_tokens(Tokenizer.from_file(str(tokenizer)))
    if chosen.runs_in_executorch_runtime and not partial:
        return LlmRunner(program, tokenizer)
    chosen.runtime_setup(hints)
    # The runner's Python binding hands each token's text to Python as str: a token that ends inside a character
    # fails it (UnicodeDecodeError), so such a tokenizer's bundles are driven here, decoding incrementally.
    why = (f"{partial} of its tokenizer's tokens are not whole UTF-8, which the LLM runner's Python binding cannot "
           "pass" if partial and chosen.runs_in_executorch_runtime else "this runtime has no LLM runner")
    return ForwardCalls(LoadedProgram(program, data), tokenizer, why)

