"""The model kinds' seam: what a tensor model, a decoder LM (``llm:``) and a speech model (``asr:``) each need of a
build, decided here from generic facts a target gives (``FixedShapes``), so that a target knows only how to lower
and load programs."""

from __future__ import annotations

from typing import NamedTuple

from prefect_executorch.errors import SpecError
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.causal_lm import check_positions, require_llm_stack


class FixedShapes(NamedTuple):
    """A target setting under which programs run only at the sizes they were exported with."""

    setting: str  #: the spec field that asks for it, e.g. ``target.cuda_graphs``
    why: str  #: what it does, in words (what is replayed)


def check_kind_stack(spec: BuildSpec) -> None:
    """Refuse, before any export, a Hugging Face model's build where its stack (the ``llm`` extra) is missing, and a
    decoder LM's cache longer than the model's positions."""
    if spec.llm is None and spec.asr is None:
        return
    require_llm_stack("llm" if spec.llm is not None else "asr")
    if spec.llm is not None:
        check_positions(spec)


def check_kind_shapes(spec: BuildSpec, fixed: FixedShapes | None) -> None:
    """Refuse a kind whose calls change size on a target that runs ``fixed`` shapes only."""
    if fixed is None:
        return
    if spec.asr is not None:
        raise SpecError(f"{fixed.setting} with asr: a speech program's decoder is not run at fixed sizes yet "
                        f"({fixed.why}); set {fixed.setting}: false")
    if spec.llm is not None and spec.llm.prefill == "one_call":
        raise SpecError(f"{fixed.setting} with llm.prefill: one_call: {fixed.why}, and the prompt comes in calls of "
                        f"other sizes; set llm.prefill: auto (a token a call, each replayed) or {fixed.setting}: false")
    dynamic = [f"{method}.{spec_input.name}" for method, entry in spec.methods.items() for spec_input in entry.inputs
               if spec_input.dynamic]
    if dynamic:
        raise SpecError(f"{fixed.setting}: {fixed.why}, and these inputs are dynamic: {', '.join(dynamic)}; remove "
                        f"their dynamic dims (one program per size that serves) or set {fixed.setting}: false")


def token_per_call(spec: BuildSpec, fixed: FixedShapes | None) -> bool:
    """Whether a decoder LM's program takes one token a call (else any number: the prompt in one call), as
    ``llm.prefill`` says; ``auto``: one token a call only where the target runs ``fixed`` shapes."""
    assert spec.llm is not None
    return spec.llm.prefill == "token_by_token" or (spec.llm.prefill == "auto" and fixed is not None)


def replayable_methods(spec: BuildSpec) -> list[str]:
    """The methods a fixed-shape runtime replays: a decoder LM's one-token ``forward``, else the spec's methods."""
    return ["forward"] if spec.llm is not None else sorted(spec.methods)


def inputs_planned(spec: BuildSpec) -> bool:
    """Whether the memory plan holds the program's inputs (copied in on each call); not for a speech decoder, which
    takes every layer's cross-attention keys and values on every token (18 MB at whisper-tiny's size): unplanned
    inputs are read where the caller holds them."""
    return spec.asr is None
