"""Run a candidate program beside the one an alias serves now: same inputs, same timing.

The child loads both programs, feeds both the same seeded inputs at every declared shape, compares
the candidate's outputs with the current program's at the spec's tolerances, and times both with
their latency windows interleaved (``latency.measure_together``), so the load of a shared machine
falls on both alike. Programs of a target that cannot hold two in one process (``Target.
one_program_per_process``) run in two children instead: the first writes the current program's
outputs and times it, the second compares the candidate with them and times it.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from prefect_executorch.errors import ValidationFailed
from prefect_executorch.runtime.loaded_program import LoadedProgram
from prefect_executorch.spec.inputs import random_inputs, shape_points
from prefect_executorch.spec.methods import MethodSpec
from prefect_executorch.spec.validation import ValidationSpec
from prefect_executorch.targets import get_target, needs_cuda
from prefect_executorch.validate.compare import compare_outputs
from prefect_executorch.validate.latency import LatencyStats, measure_together, paired_ratio
from prefect_executorch.validate.validator import synchronized


class ProgramFiles(BaseModel):
    """A local bundle directory: its program and the .ptd files it loads with."""

    dir: str
    program: str
    data_files: list[str] = Field(default_factory=list)
    runtime_hints: dict[str, Any] = Field(default_factory=dict, description="Its manifest's runtime hints.")

    def load(self) -> LoadedProgram:
        """The loaded program (with its first .ptd, as validation loads it)."""
        bundle = Path(self.dir)
        return LoadedProgram(bundle / self.program, bundle / self.data_files[0] if self.data_files else None)


class SideBySideRequest(BaseModel):
    """What the side-by-side child gets."""

    current: ProgramFiles
    candidate: ProgramFiles
    methods: dict[str, MethodSpec] = Field(description="The candidate's methods and inputs.")
    validation: ValidationSpec
    target: str = Field("xnnpack", description="The bundles' target: its runtime is set up before either loads.")
    input_device: str = Field("cpu", description="Where the programs want their inputs (the manifest's runtime hint).")
    alone: Literal["current", "candidate"] | None = Field(
        None, description="Run only this program (None: both in this child); the current one writes ``reference``, "
        "the candidate is compared with it.")
    reference: str | None = Field(None, description="The current program's outputs (torch.save) when they run apart.")
    generation: bool = Field(False, description="Decoder LMs: the candidate's prompts through both programs' LLM "
                             "runners instead of methods.")
    speech: bool = Field(False, description="Speech models: the default clips through both programs' encoder and "
                         "decoder instead of methods.")


class MethodComparison(BaseModel):
    """One method, candidate against current: output agreement and latency of both."""

    method: str
    cases: int
    disagreeing: int
    worst: str | None = Field(default=None, description="The first disagreement, in words.")
    shape_label: str | None = Field(default=None, description="The shape the latency was measured at.")
    current: LatencyStats | None = None
    candidate: LatencyStats | None = None
    interleaved: bool = Field(True, description="Whether both were timed in one process, their windows interleaved "
                              "(else in two children, one after the other).")

    @property
    def paired(self) -> bool:
        """Whether ``regression`` pairs the two programs' windows (timed interleaved in one process)."""
        # A record written before window medians were kept has none to pair.
        return bool(self.interleaved and self.current and self.candidate
                    and len(self.candidate.window_medians_ms) == len(self.current.window_medians_ms) > 0)

    @property
    def regression(self) -> float | None:
        """How much slower the candidate is (0.25: 25%): its windows' medians over the current one's, window by window,
        where they were interleaved, else p50 over p50; None if not timed."""
        if self.current is None or self.candidate is None or self.current.p50_ms <= 0:
            return None
        if self.paired:
            return paired_ratio(self.candidate, self.current) - 1
        return self.candidate.p50_ms / self.current.p50_ms - 1


class ComparisonRow(BaseModel):
    """One method of a side-by-side (a row of the Prefect table artifact and of the CLI's table)."""

    method: str
    inputs: int
    disagreeing: int
    current_p50_ms: float | None
    candidate_p50_ms: float | None
    current_p99_ms: float | None
    candidate_p99_ms: float | None
    regression: float | None = Field(description="How much slower the candidate is (MethodComparison.regression).")
    stable: bool = Field(description="Whether both latency figures settled before the time cap.")
    worst: str


class SideBySide(BaseModel):
    """Every method of the candidate, compared with the current program."""

    methods: list[MethodComparison]

    def disagreements(self) -> list[str]:
        """One line per method whose outputs differ from the current program's."""
        return [f"{m.method}: {m.disagreeing} of {m.cases} inputs disagree; {m.worst}" for m in self.methods
                if m.disagreeing]

    def regressions(self, limit: float) -> list[str]:
        """One line per method whose candidate is more than ``limit`` slower than the current one, saying how that
        was judged: paired windows can differ from the pooled p50s printed beside them."""
        lines = []
        for m in self.methods:
            regression = m.regression
            if regression is not None and regression > limit and m.current and m.candidate:
                judged = "window by window" if m.paired else "p50 over p50"
                lines.append(f"{m.method}: +{regression:.0%} slower {judged}, limit +{limit:.0%} (p50 "
                             f"{m.candidate.p50_ms:.3g} ms vs {m.current.p50_ms:.3g} ms now; candidate "
                             f"{m.candidate.describe()})")
        return lines

    def rows(self) -> list[ComparisonRow]:
        """One table row per method."""
        return [ComparisonRow(
            method=m.method, inputs=m.cases, disagreeing=m.disagreeing,
            current_p50_ms=m.current.p50_ms if m.current else None,
            candidate_p50_ms=m.candidate.p50_ms if m.candidate else None,
            current_p99_ms=m.current.p99_ms if m.current else None,
            candidate_p99_ms=m.candidate.p99_ms if m.candidate else None,
            regression=m.regression,
            stable=bool(m.current and m.candidate and m.current.stable and m.candidate.stable),
            worst=m.worst or "-",
        ) for m in self.methods]


#: One case's outputs (a list of tensors), or why the program could not run it.
Outcome = list[Any] | str


def _cases(req: SideBySideRequest, name: str) -> list[tuple[str, list[list[int]], tuple[Any, ...]]]:
    """The method's seeded inputs at every declared shape, the same on both sides (and in both children)."""
    import torch

    method = req.methods[name]
    generator = torch.Generator().manual_seed(req.validation.seed)
    extra = req.validation.methods[name].extra_shapes if name in req.validation.methods else None
    return [(label, shapes, tuple(t.to(req.input_device) for t in random_inputs(method, shapes, generator)))
            for label, shapes in shape_points(method, extra) for _ in range(req.validation.samples)]


def _run(program: LoadedProgram, name: str, inputs: tuple[Any, ...], method: MethodSpec) -> Outcome:
    try:
        return program.run(name, inputs, method.inputs)
    except ValidationFailed as exc:
        return str(exc)


def _timing_inputs(cases: list[tuple[str, list[list[int]], tuple[Any, ...]]]) -> tuple[str, tuple[Any, ...]] | None:
    """The inputs latency is measured on: the first case at 'opt', else the first case."""
    chosen = next((case for case in cases if case[0] == "opt"), cases[0] if cases else None)
    return (chosen[0], chosen[2]) if chosen else None


def _time(req: SideBySideRequest, name: str, programs: list[LoadedProgram],
          timing: tuple[str, tuple[Any, ...]] | None) -> list[LatencyStats | None]:
    if timing is None or not req.validation.latency_runs:
        return [None] * len(programs)
    # GPU programs return before the device is done: every side waits for it, as in validation.
    device = "cuda" if needs_cuda(req.target) else "cpu"
    return list(measure_together([synchronized(partial(p.execute, name, timing[1]), device) for p in programs],
                                 min_runs=req.validation.latency_runs, warmup=req.validation.latency_warmup,
                                 max_seconds=req.validation.latency_max_s))


def _compare_method(req: SideBySideRequest, name: str, current: list[Outcome], candidate: list[Outcome],
                    labels: list[tuple[str, list[list[int]]]]) -> MethodComparison:
    """Agreement of the candidate's outcomes with the current program's, case by case."""
    result = MethodComparison(method=name, cases=len(labels), disagreeing=0)
    for (label, shapes), expected, actual in zip(labels, current, candidate, strict=True):
        if isinstance(expected, str) or isinstance(actual, str):
            error: str | None = f"at {label} {shapes}: {expected if isinstance(expected, str) else actual}"
        else:
            failed = [o for o in compare_outputs(actual, expected, req.validation, name) if not o.passed]
            error = f"output {failed[0].path} at {label} {shapes}: {failed[0].reason}" if failed else None
        if error is not None:
            result.disagreeing += 1
            result.worst = result.worst or error
    return result


def _side_by_side(req: SideBySideRequest, name: str, programs: dict[str, LoadedProgram]) -> MethodComparison:
    """One method of the programs this child holds: both, or the one ``req.alone`` names."""
    import torch

    current = programs.get("current")
    if current is not None and name not in current.facts:
        missing = f"the current program has no method {name!r} (it has {sorted(current.facts)})"
        if req.alone == "current":
            _save_reference(req, name, missing)
        return MethodComparison(method=name, cases=1, disagreeing=1, worst=missing)
    reference = torch.load(req.reference, weights_only=True)[name] if req.alone == "candidate" and req.reference else None
    if isinstance(reference, str):
        return MethodComparison(method=name, cases=1, disagreeing=1, worst=reference)
    cases = _cases(req, name)
    outcomes = {role: [_run(program, name, inputs, req.methods[name]) for _, _, inputs in cases]
                for role, program in programs.items()}
    timing = _timing_inputs(cases)
    timed = dict(zip(programs, _time(req, name, list(programs.values()), timing), strict=True))
    if req.alone == "current":
        _save_reference(req, name, outcomes["current"])
        result = MethodComparison(method=name, cases=len(cases), disagreeing=0)
    else:
        result = _compare_method(req, name, outcomes.get("current", reference or []), outcomes["candidate"],
                                 [(label, shapes) for label, shapes, _ in cases])
    return result.model_copy(update={"shape_label": timing[0] if timing and req.validation.latency_runs else None,
                                     "current": timed.get("current"), "candidate": timed.get("candidate")})


def _save_reference(req: SideBySideRequest, name: str, outcomes: list[Outcome] | str) -> None:
    """Add one method's outcomes of the current program to ``req.reference`` (the candidate's child reads them)."""
    import torch

    assert req.reference is not None
    path = Path(req.reference)
    saved = torch.load(path, weights_only=True) if path.exists() else {}
    torch.save({**saved, name: outcomes}, path)


def side_by_side_in_child(request: dict[str, Any]) -> SideBySide:
    """Child side: load the programs, compare every method on the same inputs, time them alike."""
    import torch

    req = SideBySideRequest.model_validate(request)
    if req.generation:
        return SideBySide(methods=[_generation_side_by_side(req)])
    if req.speech:
        return SideBySide(methods=[_speech_side_by_side(req)])
    # TF32 off and the delegate runtime registered (with the program's runtime options: apart, each program has
    # its own process) before ExecuTorch's own runtime loads.
    get_target(req.target).runtime_setup(getattr(req, req.alone or "candidate").runtime_hints)
    roles = ("current", "candidate") if req.alone is None else (req.alone,)
    programs = {role: getattr(req, role).load() for role in roles}
    with torch.no_grad():
        return SideBySide(methods=[_side_by_side(req, name, programs) for name in req.methods])


def _require_one_process(req: SideBySideRequest, kind: str, kinds: str, doc: str) -> None:
    """Refuse a side-by-side of two ``kind`` bundles whose target's runtime holds one program a process."""
    if req.alone is not None:
        raise ValidationFailed(f"a side-by-side of two {kind} bundles of target {req.target} needs both programs in one "
                               f"process, which this target's runtime cannot hold: {kinds} are compared side by side on "
                               f"CPU targets only for now ({doc})")


def _generation_side_by_side(req: SideBySideRequest) -> MethodComparison:
    """The candidate's prompts greedily through both bundles' LLM runners: the same tokens, and the time of a whole
    generation (the first prompt's) with their windows interleaved."""
    from prefect_executorch.runtime.decoding import GenerationCases
    from prefect_executorch.runtime.llm_runner import RunnerRequest
    from prefect_executorch.spec.llm import GENERATION_CASES_FILE
    from prefect_executorch.validate.generation import compare_generation

    _require_one_process(req, "decoder-LM", "decoder LMs", "docs/llm.md")
    cases = GenerationCases.model_validate_json((Path(req.candidate.dir) / GENERATION_CASES_FILE).read_text())
    current, candidate = (RunnerRequest(bundle_dir=files.dir, target=req.target, data_files=files.data_files).open()
                          for files in (req.current, req.candidate))
    compared = [compare_generation(prompt, 0, current.greedy(prompt, cases.new_tokens)[0],
                                   candidate.greedy(prompt, cases.new_tokens)[0], reference="the current bundle")
                for prompt in cases.prompts]
    differing = [case for case in compared if not case.passed]
    first = cases.prompts[0]
    timed = measure_together([partial(generator.greedy, first, cases.new_tokens) for generator in (current, candidate)],
                             min_runs=req.validation.latency_runs, warmup=req.validation.latency_warmup,
                             max_seconds=req.validation.latency_max_s)
    return MethodComparison(method="generate", cases=len(compared), disagreeing=len(differing),
                            worst=differing[0].describe() if differing else None,
                            shape_label=f"{cases.new_tokens} new tokens", current=timed[0], candidate=timed[1])


def _speech_side_by_side(req: SideBySideRequest) -> MethodComparison:
    """The default clips through both bundles' programs, as validation drives them (features by the candidate's
    front-end settings): the same transcripts, and the time of a whole transcription (the first clip's) with their
    windows interleaved."""
    from prefect_executorch.clips import DEFAULT_CLIPS, made_clip
    from prefect_executorch.runtime.speech import ProgramTranscriber
    from prefect_executorch.spec.speech_model import features_of, load_feature_extractor
    from prefect_executorch.validate.generation import compare_generation

    _require_one_process(req, "speech", "speech models", "docs/asr.md")
    heard, extractor = (load_feature_extractor(files.dir) for files in (req.current, req.candidate))
    if heard.to_json_string() != extractor.to_json_string():
        raise ValidationFailed("the current bundle's front end (its preprocessor_config.json) is not the candidate's, so "
                               "one clip would give the two programs different inputs: a side-by-side compares speech "
                               "models that take the same features; promote a candidate built with the current one's "
                               "front end")
    get_target(req.target).runtime_setup(req.candidate.runtime_hints)
    current, candidate = (ProgramTranscriber(files.load()) for files in (req.current, req.candidate))
    new_tokens = candidate.max_new_tokens
    clips = {name: features_of(extractor, made_clip(name, extractor.sampling_rate)) for name in DEFAULT_CLIPS}
    compared = [compare_generation(name, len(candidate.prompt), [str(t) for t in current.transcribe(features, new_tokens)[0]],
                                   [str(t) for t in candidate.transcribe(features, new_tokens)[0]],
                                   reference="the current bundle", subject="clip") for name, features in clips.items()]
    differing = [case for case in compared if not case.passed]
    first = clips[DEFAULT_CLIPS[0]]
    timed = measure_together([partial(program.transcribe, first, new_tokens) for program in (current, candidate)],
                             min_runs=req.validation.latency_runs, warmup=req.validation.latency_warmup,
                             max_seconds=req.validation.latency_max_s)
    return MethodComparison(method="transcribe", cases=len(compared), disagreeing=len(differing),
                            worst=differing[0].describe() if differing else None,
                            shape_label=f"{new_tokens} new tokens", current=timed[0], candidate=timed[1])


def merge_apart(current: SideBySide, candidate: SideBySide) -> SideBySide:
    """One comparison of two children's runs: the current program's timing from the first, the rest from the second."""
    timed = {m.method: m.current for m in current.methods}
    return SideBySide(methods=[m.model_copy(update={"current": timed.get(m.method), "interleaved": False})
                               for m in candidate.methods])
