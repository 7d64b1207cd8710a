"""Validation by generation: eager greedy ``generate`` against the program run by ExecuTorch's LLM runner.

Both sides get the prompt as the bundle's tokenizer encodes it (no special tokens added: the runner adds
none) and generate greedily up to ``llm.new_tokens`` tokens or an end-of-sequence token. The runner reports
each token as its text, so the two sequences are compared piece by piece: a float32 program must generate
what eager PyTorch does, token for token.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from prefect_executorch.errors import SpecError
from prefect_executorch.llm.model import check_vocabulary, eos_ids, load_causal_lm, load_tokenizer
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.llm import TOKENIZER_FILE
from prefect_executorch.validate.report import GenerationCase, GenerationReport, GenerationStats, ValidationReport

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedModel

    from prefect_executorch.validate.validator import ValidateRequest


class GenerationCases(BaseModel):
    """What ``generation_cases.json`` holds."""

    new_tokens: int
    prompts: list[str]
    expected: list[list[str]] = Field(description="Eager's tokens per prompt, each as its text.")


def eager_greedy(model: PreTrainedModel, tokenizer: Tokenizer, prompt: str, new_tokens: int) -> tuple[int, list[str]]:
    """The prompt's token count and eager PyTorch's greedy continuation, a text piece per token."""
    import torch

    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    ends = eos_ids(model)
    generated = model.generate(  # type: ignore[operator]
        torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False, num_beams=1, eos_token_id=ends or None,
        pad_token_id=ends[0] if ends else 0)
    tokens = generated[0, len(ids):].tolist()
    return len(ids), [tokenizer.decode([token], skip_special_tokens=False) for token in tokens]


def runner_greedy(runner: Any, prompt: str, new_tokens: int) -> tuple[list[str], GenerationStats]:
    """The runner's greedy continuation of ``prompt`` from an empty cache, and its timing."""
    from executorch.extension.llm.runner import GenerationConfig

    pieces: list[str] = []
    stats: list[Any] = []
    runner.reset()
    runner.generate(prompt, GenerationConfig(echo=False, max_new_tokens=new_tokens, temperature=0.0),
                    token_callback=pieces.append, stats_callback=stats.append)
    return pieces, GenerationStats.of(stats[-1]) if stats else GenerationStats()


def compare_generation(prompt: str, prompt_tokens: int, expected: list[str], actual: list[str],
                       reference: str = "eager") -> GenerationCase:
    """Where the runner's tokens first depart from ``reference``'s (None: they agree)."""
    diverges = next((i for i, (e, a) in enumerate(zip(expected, actual, strict=False)) if e != a), None)
    if diverges is None and len(expected) != len(actual):
        diverges = min(len(expected), len(actual))
    return GenerationCase(prompt=prompt, prompt_tokens=prompt_tokens, expected=expected, actual=actual,
                          first_divergence=diverges, reference=reference)


def validate_generation(req: ValidateRequest) -> ValidationReport:
    """Child side of an LLM's validation: every prompt through eager ``generate`` and the LLM runner."""
    import torch
    from executorch.extension.llm.runner import TextLLMRunner

    spec, bundle = req.spec, Path(req.bundle_dir)
    assert spec.llm is not None
    tokenizer = load_tokenizer(spec)
    model = load_causal_lm(spec)
    check_vocabulary(model, tokenizer)
    _check_lengths(spec, tokenizer)
    started = time.monotonic()
    runner = TextLLMRunner(str(bundle / req.program), str(bundle / TOKENIZER_FILE))
    load_seconds = time.monotonic() - started
    cases, timings = [], []
    with torch.no_grad():
        for prompt in spec.llm.prompts:
            prompt_tokens, expected = eager_greedy(model, tokenizer, prompt, spec.llm.new_tokens)
            actual, timing = runner_greedy(runner, prompt, spec.llm.new_tokens)
            cases.append(compare_generation(prompt, prompt_tokens, expected, actual))
            timings.append(timing)
    report = GenerationReport(new_tokens=spec.llm.new_tokens, cases=cases, stats=timings)
    if req.bundled_out and report.passed:
        Path(req.bundled_out).write_text(GenerationCases(
            new_tokens=spec.llm.new_tokens, prompts=spec.llm.prompts, expected=[case.expected for case in cases],
        ).model_dump_json(indent=1))
    return ValidationReport(
        passed=report.passed, cases=[], delegates={}, load_seconds=load_seconds, used_data_file=False,
        delegation=req.delegation, generation=report,
        file_sizes={f: (bundle / f).stat().st_size for f in [req.program, TOKENIZER_FILE]},
    )


def _check_lengths(spec: BuildSpec, tokenizer: Tokenizer) -> None:
    assert spec.llm is not None
    for index, prompt in enumerate(spec.llm.prompts):
        length = len(tokenizer.encode(prompt, add_special_tokens=False).ids)
        if length + spec.llm.new_tokens > spec.llm.max_seq_len:
            raise SpecError(f"llm.prompts[{index}]: {length} tokens plus new_tokens ({spec.llm.new_tokens}) exceed "
                            f"max_seq_len ({spec.llm.max_seq_len}); shorten the prompt or raise max_seq_len")
