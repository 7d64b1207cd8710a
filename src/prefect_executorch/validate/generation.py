"""Validation by generation: eager greedy decoding against the program run by ExecuTorch's LLM runner
(or, where the target's runtime ships none, the program's forward called here through that runtime).

Both sides get the prompt as transformers' tokenizer encodes it by default: with the special tokens its
post-processor adds (a Llama-3 tokenizer's BOS; the runner is told how many, ``num_bos``/``num_eos``). Both
decode greedily, the argmax after each token (no logits processor on either side), up to ``llm.new_tokens``
tokens or an end-of-sequence token. The runner reports each token as its text, so the two sequences are
compared piece by piece: a float32 program must generate what eager PyTorch does, token for token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Field

from prefect_executorch.export.quantize import build_facts
from prefect_executorch.machine.runtime_extension import runtime_extension
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.causal_lm import (
    check_prompt_lengths,
    check_vocabulary,
    eos_ids,
    load_causal_lm,
    load_tokenizer,
    partial_utf8_tokens,
    prompt_ids,
    special_token_counts,
    token_texts,
)
from prefect_executorch.spec.llm import TOKENIZER_FILE, tokenizer_files
from prefect_executorch.targets import get_target
from prefect_executorch.validate.loaded_program import LoadedProgram, register_custom_op_kernels
from prefect_executorch.validate.replay import check_replay
from prefect_executorch.validate.report import (
    GateResult,
    GenerationCase,
    GenerationReport,
    GenerationStats,
    TeacherForced,
    ValidationReport,
)

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

    from prefect_executorch.validate.validator import ValidateRequest


class GenerationCases(BaseModel):
    """What ``generation_cases.json`` holds."""

    new_tokens: int
    prompts: list[str]
    expected: list[list[str]] = Field(description="The program's own tokens per prompt, each as its text: what it "
                                      "generated when validated, and what `verify` must reproduce.")
    eager: list[list[str]] | None = Field(None, description="fp32 eager's tokens per prompt, where a quantized or "
                                          "lower-precision program's differ from them (None: they are the same).")


def eager_greedy(model: PreTrainedModel, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """Eager PyTorch's plain greedy continuation of ``prompt_ids``: the argmax after each token, to ``new_tokens`` or an
    end-of-sequence id, with no logits processor (a model's ``generation_config.json`` may add a repetition penalty,
    say, which the runner does not apply: the rule is the runner's on both sides)."""
    import torch

    ends = set(eos_ids(model))
    output = model(torch.tensor([prompt_ids]), use_cache=True)
    tokens: list[int] = []
    while True:
        tokens.append(int(output.logits[0, -1].argmax()))
        if len(tokens) == new_tokens or tokens[-1] in ends:
            return tokens
        output = model(torch.tensor([[tokens[-1]]]), past_key_values=output.past_key_values, use_cache=True)


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
    if chosen.llm_runner and not partial:
        return LlmRunner(program, tokenizer)
    chosen.runtime_setup(hints)
    # The runner's Python binding hands each token's text to Python as str: a token that ends inside a character
    # fails it (UnicodeDecodeError), so such a tokenizer's bundles are driven here, decoding incrementally.
    why = (f"{partial} of its tokenizer's tokens are not whole UTF-8, which the LLM runner's Python binding cannot "
           "pass" if partial and chosen.llm_runner else "this runtime has no LLM runner")
    return ForwardCalls(LoadedProgram(program, data), tokenizer, why)


def teacher_forced(program: ForwardCalls, model: PreTrainedModel, prompt_ids: list[int],
                   continuation: list[int]) -> TeacherForced:
    """The program fed the prompt and ``continuation`` (in one call where it takes a sequence), against fp32 eager."""
    import torch

    tokens = prompt_ids + continuation
    start = len(prompt_ids) - 1  # the logits that predict the continuation
    program_logits = program.logits(tokens[:-1], 0)[start:].float()
    eager = model(torch.tensor([tokens])).logits[0, start:-1].float()
    target = torch.tensor(continuation)
    return TeacherForced(
        positions=len(continuation),
        top1_agreement=float((program_logits.argmax(-1) == eager.argmax(-1)).float().mean()),
        logit_rel_error=float((program_logits - eager).norm() / eager.norm()),
        nll=float(torch.nn.functional.cross_entropy(program_logits, target)),
        eager_nll=float(torch.nn.functional.cross_entropy(eager, target)),
    )


def compare_generation(prompt: str, prompt_tokens: int, expected: list[str], actual: list[str],
                       reference: str = "eager", subject: str = "prompt") -> GenerationCase:
    """Where the program's tokens first depart from ``reference``'s (None: they agree); ``subject``: what ``prompt``
    names (a speech model's clip)."""
    diverges = next((i for i, (e, a) in enumerate(zip(expected, actual, strict=False)) if e != a), None)
    if diverges is None and len(expected) != len(actual):
        diverges = min(len(expected), len(actual))
    return GenerationCase(prompt=prompt, prompt_tokens=prompt_tokens, expected=expected, actual=actual,
                          first_divergence=diverges, reference=reference, subject=subject)


def validate_generation(req: ValidateRequest) -> ValidationReport:
    """Child side of an LLM's validation: every prompt through eager ``generate``, the program's generator and,
    fed eager's tokens, the program itself; a float build must match token for token, a quantized or
    lower-precision one pass its gates."""
    import torch

    spec, bundle = req.spec, Path(req.bundle_dir)
    assert spec.llm is not None
    target = get_target(spec.target_name)
    program, data = bundle / req.program, bundle / req.data_files[0] if req.data_files else None
    started = time.monotonic()
    # First: a target's runtime (CUDA's wheel) must be in place before anything imports ExecuTorch's own.
    hints = target.runtime_hints(spec)
    generator = open_generator(program, bundle / TOKENIZER_FILE, spec.target_name, data, hints)
    load_seconds = time.monotonic() - started
    # A replayed forward must be shown equal to a direct one before the prompts run on the replays.
    replay = [check_replay("forward", lambda: [generator.next_logits(0, 0)])
              for _ in hints.get("cuda_graph_methods") or [] if isinstance(generator, ForwardCalls)]
    tokenizer = load_tokenizer(spec)
    model = load_causal_lm(spec)
    check_vocabulary(model, tokenizer)
    check_prompt_lengths(spec, tokenizer)
    cases, timings = [], []
    # The teacher-forced pass calls the program's forward itself: the generator where it does so, else one load for
    # every prompt (each call writes the cache from the positions it is given, so no prompt sees another's).
    forced_by = generator if isinstance(generator, ForwardCalls) else \
        ForwardCalls(LoadedProgram(program, data), bundle / TOKENIZER_FILE)
    with torch.no_grad():
        for prompt in spec.llm.prompts:
            ids = prompt_ids(tokenizer, prompt)
            tokens = eager_greedy(model, ids, spec.llm.new_tokens)
            expected = token_texts(tokenizer, tokens)
            actual, timing = generator.greedy(prompt, spec.llm.new_tokens)
            case = compare_generation(prompt, len(ids), expected, actual)
            cases.append(case.model_copy(update={"forced": teacher_forced(forced_by, model, ids, tokens)}))
            timings.append(timing)
    report = GenerationReport(new_tokens=spec.llm.new_tokens, cases=cases, stats=timings, generated_by=generator.name,
                              exact=spec.quantization is None and target.compute_dtype(spec) is None)
    gates = [] if report.exact else generation_gates(report, spec)
    passed = report.passed and all(gate.passed for gate in gates) and not any(check.problem for check in replay)
    if req.bundled_out and passed:
        Path(req.bundled_out).write_text(GenerationCases(
            new_tokens=spec.llm.new_tokens, prompts=spec.llm.prompts, expected=[case.actual for case in cases],
            eager=[case.expected for case in cases] if any(not case.passed for case in cases) else None,
        ).model_dump_json(indent=1))
    return ValidationReport(
        passed=passed, cases=[], delegates={}, load_seconds=load_seconds, used_data_file=data is not None, gates=gates,
        delegation=req.delegation, generation=report, replay=replay,
        quantization=build_facts(spec, model, None, 0) if spec.quantization else None,
        file_sizes={f: (bundle / f).stat().st_size for f in [req.program, *req.data_files, TOKENIZER_FILE]},
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
