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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_executorch.errors import ValidationFailed
from prefect_executorch.export.quantize import build_facts
from prefect_executorch.isolation import StartMethod
from prefect_executorch.runtime.decoding import ForwardCalls, GenerationCases, open_generator
from prefect_executorch.runtime.llm_runner import RunnerRequest, in_runner_child
from prefect_executorch.runtime.loaded_program import LoadedProgram
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.causal_lm import (
    check_prompt_lengths,
    check_vocabulary,
    eos_ids,
    load_causal_lm,
    load_tokenizer,
    prompt_ids,
    token_texts,
)
from prefect_executorch.spec.llm import GENERATION_CASES_FILE, TOKENIZER_FILE
from prefect_executorch.targets import get_target
from prefect_executorch.validate.replay import check_replay
from prefect_executorch.validate.report import (
    GateResult,
    GenerationCase,
    GenerationReport,
    TeacherForced,
    ValidationReport,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from prefect_executorch.validate.validator import ValidateRequest


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


def verify_generation_in_child(request: dict[str, Any]) -> GenerationReport:
    """Child side: every prompt of the bundle's generation cases through the runner, compared with eager's tokens."""
    from tokenizers import Tokenizer

    req = RunnerRequest.model_validate(request)
    bundle = Path(req.bundle_dir)
    cases = GenerationCases.model_validate_json((bundle / GENERATION_CASES_FILE).read_text())
    tokenizer, generator = Tokenizer.from_file(str(bundle / TOKENIZER_FILE)), req.open()
    results, timings = [], []
    for prompt, expected in zip(cases.prompts, cases.expected, strict=True):
        actual, timing = generator.greedy(prompt, cases.new_tokens)
        tokens = len(prompt_ids(tokenizer, prompt))
        results.append(compare_generation(prompt, tokens, expected, actual, reference="its validated run"))
        timings.append(timing)
    return GenerationReport(new_tokens=cases.new_tokens, cases=results, stats=timings, generated_by=generator.name)


def run_generation_cases(bundle_dir: Path, target: str, data_files: list[str], *, scratch_dir: Path | None = None,
                         shown_as: Path | None = None, start: StartMethod | None = None,
                         runtime_hints: dict[str, Any] | None = None) -> GenerationReport:
    """Run a decoder-LM bundle's prompts on this machine (its runtime set up as ``runtime_hints`` say);
    ``ValidationFailed`` naming the first that departs."""
    where = shown_as or bundle_dir
    if not (bundle_dir / GENERATION_CASES_FILE).is_file():
        raise ValidationFailed(f"{where} has no {GENERATION_CASES_FILE} to run (a decoder-LM bundle's own prompts and "
                               "tokens); nothing was verified: revalidate it against the model with "
                               "`prefect-executorch validate` instead")
    request = RunnerRequest(bundle_dir=str(bundle_dir), target=target, data_files=data_files,
                            runtime_hints=runtime_hints or {})
    report = in_runner_child("verify-generation", request, GenerationReport,
                       f"the generation cases of {where}", scratch_dir, start)
    failed = [case for case in report.cases if not case.passed]
    if failed:
        raise ValidationFailed(f"{len(failed)} of {len(report.cases)} prompts of {where / GENERATION_CASES_FILE} "
                               f"generate other tokens on this machine: {failed[0].describe()}; do not deploy it on "
                               "this machine")
    return report

