"""ExecuTorch's own attention and KV-cache ops inside a transformers decoder: what ExecuTorch's LLM export and
optimum-executorch's ``xnnpack`` recipe put there (``torch.ops.llama.custom_sdpa``, ``torch.ops.llama.update_cache``).

The cache holds keys and values as ``[batch, position, kv_head, head_dim]`` (the ops' layout), written in place
from the call's first position; attention runs causally from that position inside the op, so transformers builds
no mask. Each call takes any number of tokens up to the cache's length: the prompt in one call, then one token a call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

#: The name the attention function and its (absent) mask are registered under in transformers.
ATTENTION = "executorch_custom_sdpa"


def custom_ops_problem(model: PreTrainedModel, max_seq_len: int) -> str | None:
    """Why the custom ops cannot compute what ``model`` does, or None.

    The op attends causally to every earlier position: a sliding-window layer is the same only while the cache is
    no longer than its window; a soft-capped attention is not.
    """
    config = model.config.get_text_config()
    window = getattr(config, "sliding_window", None)
    if window is not None and "sliding_attention" in (getattr(config, "layer_types", None) or []) \
            and max_seq_len > window:
        return (f"its sliding-window layers attend to the last {window} positions and the cache holds {max_seq_len}; "
                f"ExecuTorch's causal SDPA op attends to all of them (a max_seq_len of at most {window} uses it)")
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "its attention soft-caps the logits, which ExecuTorch's SDPA op does not"
    return None


def custom_ops_module(model: PreTrainedModel, max_seq_len: int) -> torch.nn.Module:
    """``model`` as a module of ``(input_ids [1, n], cache_position [n]) -> logits [1, n, vocab]`` over a KV cache of
    ``max_seq_len`` positions that ExecuTorch's ops write and read (the caller checked ``custom_ops_problem``)."""
    import torch
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401 - registers torch.ops.llama
    from transformers.cache_utils import StaticCache, StaticLayer
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    config = model.config.get_text_config()
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    class OpsLayer(StaticLayer):  # type: ignore[misc]
        """One layer's keys and values, ``[1, position, kv_head, head_dim]``, written by ``update_cache``."""

        def __init__(self) -> None:
            super().__init__(max_seq_len)
            keys = torch.zeros(1, max_seq_len, kv_heads, head_dim, dtype=model.dtype, device=model.device)
            self.cache_tensors = (keys, torch.zeros_like(keys))
            self.keys, self.values = self.cache_tensors
            self.is_initialized = True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            keys, values = self.cache_tensors
            torch.ops.llama.update_cache(key_states.transpose(1, 2), keys, decoder.start)
            torch.ops.llama.update_cache(value_states.transpose(1, 2), values, decoder.start)
            # transformers' layout for the attention function, which transposes back (the pair is removed later).
            return keys.transpose(1, 2), values.transpose(1, 2)

    def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: Any, scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
        # custom_sdpa(q, k_cache, v_cache, start_pos, attn_mask, dropout_p, is_causal, scale); grouped KV heads in the op.
        output = torch.ops.llama.custom_sdpa(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                             decoder.start, None, 0.0, True, scaling)
        return output, None

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.cache = StaticCache(config=config, max_cache_len=max_seq_len)
            layers = [OpsLayer() for _ in range(config.num_hidden_layers)]
            self.cache.layers = list(layers)
            for index, layer in enumerate(layers):  # mutable buffers of the exported program
                self.register_buffer(f"key_cache_{index}", layer.cache_tensors[0], persistent=False)
                self.register_buffer(f"value_cache_{index}", layer.cache_tensors[1], persistent=False)
            self.start: Any = 0

        def forward(self, input_ids: torch.Tensor, cache_position: torch.Tensor) -> torch.Tensor:
            start = cache_position[0].item()
            torch._check_is_size(start)
            torch._check(start < max_seq_len)
            self.start = start  # read by the cache layers and the attention of this call
            output = self.model(input_ids=input_ids, cache_position=cache_position,
                                position_ids=cache_position.unsqueeze(0), past_key_values=self.cache, use_cache=True)
            return output.logits

    AttentionInterface.register(ATTENTION, attention)
    AttentionMaskInterface.register(ATTENTION, lambda *args, **kwargs: None)  # the op is causal from its start
    for sub in model.modules():  # the inner model keeps its own config object in some architectures
        sub_config: Any = getattr(sub, "config", None)
        if getattr(sub_config, "_attn_implementation", None) is not None:
            sub_config._attn_implementation = ATTENTION
    decoder = Decoder().eval()
    return decoder
