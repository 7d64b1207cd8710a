"""Child side of an LLM export: transformers' ExecuTorch wrapper, lowered with the metadata the LLM runner reads."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect_executorch.errors import ExportFailed
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
from prefect_executorch.spec.llm import TOKENIZER_FILE
from prefect_executorch.targets.base import Lowered, Target

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def runner_metadata(spec: BuildSpec, model: PreTrainedModel) -> dict[str, Any]:
    """The constant methods ExecuTorch's LLM runner reads from a program (extension/llm/runner/constants.h)."""
    assert spec.llm is not None
    config = model.config.get_text_config()
    metadata: dict[str, Any] = {
        "get_max_seq_len": spec.llm.max_seq_len,
        "get_max_context_len": spec.llm.max_seq_len,
        "get_vocab_size": config.vocab_size,
        "use_kv_cache": True,
        # One token per call: transformers' static-cache program is exported for a single position.
        "enable_dynamic_shape": False,
        "use_sdpa_with_kv_cache": False,
    }
    if config.bos_token_id is not None:
        metadata["get_bos_id"] = config.bos_token_id
    if eos_ids(model):
        metadata["get_eos_ids"] = eos_ids(model)
    return metadata


def lower_llm(spec: BuildSpec, target: Target, out_dir: Path) -> tuple[Lowered, QuantizationFacts | None]:
    """Export the spec's decoder LM (quantized, if the spec says so) with a static KV cache and lower it, with its
    metadata and tokenizer, into ``out_dir``."""
    import torch
    from transformers import GenerationConfig
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    assert spec.llm is not None
    tokenizer = load_tokenizer(spec)
    loaded = load_causal_lm(spec)
    check_vocabulary(loaded, tokenizer)
    check_prompt_lengths(spec, tokenizer)
    metadata = runner_metadata(spec, loaded)
    facts = build_facts(spec, loaded, None, 0) if spec.quantization else None
    # torchao's int8da4w linears, as ExecuTorch's LLM recipes quantize them; a float build: the model itself,
    # on the target's device in its compute type.
    model: Any = target.llm_module(quantize_model(loaded, spec), spec)
    length = spec.llm.max_seq_len
    # What transformers' wrapper exports: a static cache of max_seq_len positions (a hybrid one for sliding windows).
    model.generation_config = GenerationConfig(use_cache=True, cache_implementation="static", max_length=length,
                                               cache_config={"batch_size": 1, "max_cache_len": length})
    with torch.no_grad():
        try:
            exportable = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=length)
            program = exportable.export(input_ids=torch.zeros((1, 1), dtype=torch.long, device=model.device),
                                        cache_position=torch.zeros(1, dtype=torch.long, device=model.device))
        except Exception as exc:  # transformers and torch.export raise many types
            raise ExportFailed(f"stage torch.export: the {model.config.model_type} model in {spec.model} does not "
                               f"export with a static KV cache of {length} positions: {summary(exc)}") from exc
        lowered = run_lowering(lambda: target.lower({"forward": program}, spec, out_dir, constant_methods=metadata),
                               target.name)
    shutil.copyfile(spec.llm.tokenizer_path(spec.model), out_dir / TOKENIZER_FILE)
    return lowered, facts
