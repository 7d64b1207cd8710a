"""Validation by generation: eager greedy ``generate`` against the program run by ExecuTorch's LLM runner.

Both sides get the prompt as the bundle's tokenizer encodes it (no special tokens added: the runner adds
none) and generate greedily up to ``llm.new_tokens`` tokens or an end-of-sequence token. The runner reports
each token as its text, so the two sequences are compared piece by piece: a float32 program must generate
what eager PyTorch does, token for token.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from prefect_executorch.export.quantize import build_facts
from prefect_executorch.machine.runtimes import runtime_extension
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.causal_lm import (
    check_prompt_lengths,
    check_vocabulary,
    eos_ids,
    load_causal_lm,
    load_tokenizer,
)
from prefect_executorch.spec.llm import TOKENIZER_FILE
from prefect_executorch.validate.report import (
    GateResult,
    GenerationCase,
    GenerationReport,
    GenerationStats,
    TeacherForced,
    ValidationReport,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from prefect_executorch.validate.validator import ValidateRequest


class GenerationCases(BaseModel):
    """What ``generation_cases.json`` holds."""

    new_tokens: int
    prompts: list[str]
    expected: list[list[str]] = Field(description="Eager's tokens per prompt, each as its text.")


def eager_greedy(model: PreTrainedModel, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """Eager PyTorch's greedy continuation of ``prompt_ids`` (its default dynamic cache)."""
    import torch

    ends = eos_ids(model)
    generated = model.generate(  # type: ignore[operator]
        torch.tensor([prompt_ids]), max_new_tokens=new_tokens, do_sample=False, num_beams=1, eos_token_id=ends or None,
        pad_token_id=ends[0] if ends else 0)
    return [int(token) for token in generated[0, len(prompt_ids):]]


def teacher_forced(method: Any, model: PreTrainedModel, prompt_ids: list[int], continuation: list[int]) -> TeacherForced:
    """The program's ``forward`` fed the prompt and ``continuation`` one token per call, against fp32 eager."""
    import torch

    tokens = prompt_ids + continuation
    start = len(prompt_ids) - 1  # the logits that predict the continuation
    logits = [method.execute([torch.tensor([[token]]), torch.tensor([position])])[0][0, -1]
              for position, token in enumerate(tokens[:-1])][start:]
    program = torch.stack(logits).float()
    eager = model(torch.tensor([tokens])).logits[0, start:-1].float()
    target = torch.tensor(continuation)
    return TeacherForced(
        positions=len(continuation),
        top1_agreement=float((program.argmax(-1) == eager.argmax(-1)).float().mean()),
        logit_rel_error=float((program - eager).norm() / eager.norm()),
        nll=float(torch.nn.functional.cross_entropy(program, target)),
        eager_nll=float(torch.nn.functional.cross_entropy(eager, target)),
    )


def load_runner(program: Path, tokenizer: Path) -> Any:
    """ExecuTorch's ``TextLLMRunner`` over a program and its tokenizer, with the runtime's quantized kernels."""
    from executorch.extension.llm.runner import TextLLMRunner

    runtime_extension()  # registers the quantized kernels (a program with quantized embeddings needs them)
    return TextLLMRunner(str(program), str(tokenizer))


def runner_greedy(runner: Any, prompt: str, new_tokens: int,
                  on_piece: Callable[[str], None] | None = None) -> tuple[list[str], GenerationStats]:
    """The runner's greedy continuation of ``prompt`` from an empty cache, and its timing; ``on_piece`` gets each
    token's text as the runner makes it."""
    from executorch.extension.llm.runner import GenerationConfig

    pieces: list[str] = []
    stats: list[Any] = []

    def take(piece: str) -> None:
        pieces.append(piece)
        if on_piece is not None:
            on_piece(piece)

    runner.reset()
    runner.generate(prompt, GenerationConfig(echo=False, max_new_tokens=new_tokens, temperature=0.0),
                    token_callback=take, stats_callback=stats.append)
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
    """Child side of an LLM's validation: every prompt through eager ``generate``, the LLM runner and, fed eager's
    tokens, the program itself; a float build must match token for token, a quantized one pass its gates."""
    import torch
    from executorch.runtime import Runtime

    spec, bundle = req.spec, Path(req.bundle_dir)
    assert spec.llm is not None
    tokenizer = load_tokenizer(spec)
    model = load_causal_lm(spec)
    check_vocabulary(model, tokenizer)
    check_prompt_lengths(spec, tokenizer)
    started = time.monotonic()
    runner = load_runner(bundle / req.program, bundle / TOKENIZER_FILE)
    load_seconds = time.monotonic() - started
    cases, timings = [], []
    with torch.no_grad():
        for prompt in spec.llm.prompts:
            prompt_ids = tokenizer.encode(prompt, add_special_tokens=False).ids
            tokens = eager_greedy(model, prompt_ids, spec.llm.new_tokens)
            expected = [tokenizer.decode([token], skip_special_tokens=False) for token in tokens]
            actual, timing = runner_greedy(runner, prompt, spec.llm.new_tokens)
            # A fresh load per prompt: the program's cache state starts empty.
            method = Runtime.get().load_program(str(bundle / req.program)).load_method("forward")
            case = compare_generation(prompt, len(prompt_ids), expected, actual)
            cases.append(case.model_copy(update={"forced": teacher_forced(method, model, prompt_ids, tokens)}))
            timings.append(timing)
    report = GenerationReport(new_tokens=spec.llm.new_tokens, cases=cases, stats=timings,
                              exact=spec.quantization is None)
    gates = [] if report.exact else generation_gates(report, spec)
    passed = report.passed and all(gate.passed for gate in gates)
    if req.bundled_out and passed:
        Path(req.bundled_out).write_text(GenerationCases(
            new_tokens=spec.llm.new_tokens, prompts=spec.llm.prompts, expected=[case.actual for case in cases],
        ).model_dump_json(indent=1))
    return ValidationReport(
        passed=passed, cases=[], delegates={}, load_seconds=load_seconds, used_data_file=False, gates=gates,
        delegation=req.delegation, generation=report,
        quantization=build_facts(spec, model, None, 0) if spec.quantization else None,
        file_sizes={f: (bundle / f).stat().st_size for f in [req.program, TOKENIZER_FILE]},
    )


def generation_gates(report: GenerationReport, spec: BuildSpec) -> list[GateResult]:
    """A quantized build's gates: teacher-forced top-1 agreement and perplexity against fp32 eager."""
    assert spec.llm is not None
    agreement, ratio = report.top1_agreement(), report.perplexity_ratio()
    minimum, maximum = spec.llm.min_top1_agreement, spec.llm.max_perplexity_ratio
    return [
        GateResult(gate="min_top1_agreement", section="llm", method="forward", measured=agreement, limit=minimum,
                   passed=agreement is not None and agreement >= minimum,
                   detail=f"teacher-forced top-1 agreement with fp32 eager {agreement:.1%}, at least {minimum:.1%} "
                   "required" if agreement is not None else "not measured"),
        GateResult(gate="max_perplexity_ratio", section="llm", method="forward", measured=ratio, limit=maximum,
                   passed=ratio is not None and ratio <= maximum,
                   detail=f"perplexity of eager's continuations {ratio:.3f}x fp32 eager's, at most {maximum:g}x "
                   "allowed" if ratio is not None else "not measured"),
    ]
