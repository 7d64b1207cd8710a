"""Child side of an LLM export: the decoder with a static KV cache (ExecuTorch's custom SDPA and cache ops on CPU
targets, else transformers' ExecuTorch wrapper), the prompt in one call, lowered with the metadata the LLM runner reads."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_executorch.errors import ExportFailed, SpecError
from prefect_executorch.export.llm_attention import custom_ops_module, custom_ops_problem, ring_window
from prefect_executorch.export.quantize import QuantizationFacts, build_facts, quantize_model
from prefect_executorch.export.stages import run_lowering, summary
from prefect_executorch.spec.buildspec import BuildSpec
from prefect_executorch.spec.causal_lm import (
    check_prompt_lengths,
    check_vocabulary,
    eos_ids,
    load_causal_lm,
    load_tokenizer,
)
from prefect_executorch.spec.llm import TOKENIZER_FILE, tokenizer_files
from prefect_executorch.targets.base import Lowered, Target

if TYPE_CHECKING:
    from torch.export import ExportedProgram
    from transformers import PreTrainedModel


#: The example prompt length of the export: above 1, so that torch.export keeps the sequence dimension dynamic.
EXAMPLE_TOKENS = 2


def call_tokens(spec: BuildSpec, model: PreTrainedModel, custom_ops: bool) -> int:
    """The most tokens a call of a sequence program takes: ``max_seq_len - 1``, or a ring cache's window (a longer
    call would overwrite positions its first tokens attend to)."""
    assert spec.llm is not None
    window = ring_window(model, spec.llm.max_seq_len) if custom_ops else None
    return min(spec.llm.max_seq_len - 1, window) if window is not None else spec.llm.max_seq_len - 1


def runner_metadata(spec: BuildSpec, model: PreTrainedModel, custom_ops: bool, per_call: int | None) -> dict[str, Any]:
    """The constant methods ExecuTorch's LLM runner reads from a program (extension/llm/runner/constants.h).

    A sequence program takes up to ``per_call`` tokens a call (the runner prefills a prompt in one call, chunked at
    that); None: one token a call; either into a cache of ``max_seq_len`` positions.
    """
    assert spec.llm is not None
    config = model.config.get_text_config()
    metadata: dict[str, Any] = {
        "get_max_seq_len": per_call or spec.llm.max_seq_len,
        "get_max_context_len": spec.llm.max_seq_len,
        "get_vocab_size": config.vocab_size,
        "use_kv_cache": True,
        "enable_dynamic_shape": per_call is not None,
        "use_sdpa_with_kv_cache": custom_ops,
    }
    if config.bos_token_id is not None:
        metadata["get_bos_id"] = config.bos_token_id
    if eos_ids(model):
        metadata["get_eos_ids"] = eos_ids(model)
    return metadata


def attention_choice(spec: BuildSpec, target: Target, model: PreTrainedModel) -> tuple[bool, str | None]:
    """Whether the export uses ExecuTorch's custom SDPA and KV-cache ops, and a note when ``auto`` could not."""
    assert spec.llm is not None
    asked = spec.llm.attention
    if asked == "transformers":
        return False, None
    if target.device != "cpu":
        if asked == "executorch":
            raise SpecError(f"llm.attention: executorch: ExecuTorch's custom SDPA and KV-cache ops run on its CPU "
                            f"runtime, not in target {target.name}'s backend; use attention: auto or transformers")
        return False, None
    problem = custom_ops_problem(model)
    if problem is None:
        return True, None
    if asked == "executorch":
        raise SpecError(f"llm.attention: executorch: {problem}; use attention: auto or transformers")
    return False, f"attention: the model's own (transformers'), not ExecuTorch's custom ops: {problem}"


def _export(model: Any, custom_ops: bool, length: int, per_call: int | None) -> ExportedProgram:
    """The decoder over a cache of ``length`` positions, exported for ``1..per_call`` tokens a call (None: one) from
    ``cache_position[0]``."""
    import torch
    from torch.export import Dim

    count = EXAMPLE_TOKENS if per_call is not None else 1
    dynamic = None
    if per_call is not None:
        tokens = Dim("seq_length", min=1, max=per_call)
        dynamic = {"input_ids": {1: tokens}, "cache_position": {0: tokens}}
    example = {"input_ids": torch.zeros((1, count), dtype=torch.long, device=model.device),
               "cache_position": torch.arange(count, dtype=torch.long, device=model.device)}
    if not custom_ops:
        from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

        # strict: the non-strict export of this wrapper fails in ExecuTorch's lowering (run_decompositions:
        # "expected compiled_fn to be GraphModule").
        return TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=length).export(
            **example, dynamic_shapes=dynamic, strict=True)
    from executorch.extension.llm.export.export_passes import RemoveRedundantTransposes

    program = torch.export.export(custom_ops_module(model, length), (), example, dynamic_shapes=dynamic, strict=True)
    # The cache's transposes into transformers' layout and the attention's back cancel out: removed, and exported again.
    untransposed = RemoveRedundantTransposes()(program.module())[0]
    return torch.export.export(untransposed, (), example, dynamic_shapes=dynamic, strict=True)


def lower_llm(spec: BuildSpec, target: Target, out_dir: Path) -> tuple[Lowered, QuantizationFacts | None]:
    """Export the spec's decoder LM (quantized, if the spec says so) with a static KV cache, the prompt in one call,
    and lower it, with its metadata and tokenizer, into ``out_dir``."""
    import torch
    from transformers import GenerationConfig

    assert spec.llm is not None
    tokenizer = load_tokenizer(spec)
    loaded = load_causal_lm(spec)
    check_vocabulary(loaded, tokenizer)
    check_prompt_lengths(spec, tokenizer)
    custom_ops, note = attention_choice(spec, target, loaded)
    per_call = None if target.token_per_call(spec) else call_tokens(spec, loaded, custom_ops)
    metadata = runner_metadata(spec, loaded, custom_ops, per_call)
    facts = build_facts(spec, loaded, None, 0) if spec.quantization else None
    # torchao's int8da4w linears, as ExecuTorch's LLM recipes quantize them; a float build: the model itself,
    # on the target's device in its compute type.
    model: Any = target.placed_model(quantize_model(loaded, spec), spec)
    length = spec.llm.max_seq_len
    # What transformers' wrapper exports: a static cache of max_seq_len positions (a hybrid one for sliding windows).
    model.generation_config = GenerationConfig(use_cache=True, cache_implementation="static", max_length=length,
                                               cache_config={"batch_size": 1, "max_cache_len": length})
    with torch.no_grad():
        try:
            program = _export(model, custom_ops, length, per_call)
        except Exception as exc:  # transformers and torch.export raise many types
            raise ExportFailed(f"stage torch.export: the {model.config.model_type} model in {spec.model} does not "
                               f"export with a static KV cache of {length} positions: {summary(exc)}") from exc
        lowered = run_lowering(lambda: target.lower({"forward": program}, spec, out_dir, constant_methods=metadata),
                               target.name)
    tokenizer_file, *configs = tokenizer_files(spec.llm.tokenizer_path(spec.model))
    shutil.copyfile(tokenizer_file, out_dir / TOKENIZER_FILE)
    for config_file in configs:
        shutil.copyfile(config_file, out_dir / config_file.name)
    notes = [*lowered.notes, *([note] if note else [])]
    return lowered.model_copy(update={"notes": notes}), facts
