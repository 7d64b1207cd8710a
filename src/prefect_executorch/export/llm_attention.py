"""ExecuTorch's own attention and KV-cache ops inside a transformers decoder: what ExecuTorch's LLM export and
optimum-executorch's ``xnnpack`` recipe put there (``torch.ops.llama.custom_sdpa``, ``torch.ops.llama.update_cache``).

The cache holds keys and values as ``[batch, position, kv_head, head_dim]`` (the ops' layout), written in place
from the call's first position; attention runs causally from that position inside the op, so transformers builds
no mask. Each call takes any number of tokens up to the cache's length: the prompt in one call, then one token a call.

A sliding-window layer whose window is shorter than the cache (Gemma 3) keeps its keys and values in a ring of twice
its window, as ExecuTorch's ``CustomRingKVCache`` does: ``update_cache_with_indices`` writes each position at its
slot, the ring remembers which position each slot holds, and the op attends through a mask of the window. A call then
takes at most ``window`` tokens (a longer one would overwrite positions its first tokens attend to), so such a program
prefills in chunks of its window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

#: The name the attention function and its (absent) mask are registered under in transformers.
ATTENTION = "executorch_custom_sdpa"


def custom_ops_problem(model: PreTrainedModel) -> str | None:
    """Why the custom ops cannot compute what ``model`` does, or None: the op does not soft-cap attention logits."""
    if getattr(model.config.get_text_config(), "attn_logit_softcapping", None) is not None:
        return "its attention soft-caps the logits, which ExecuTorch's SDPA op does not"
    return None


def ring_window(model: PreTrainedModel, max_seq_len: int) -> int | None:
    """The window of ``model``'s sliding-window layers where it is shorter than the cache (they need a ring), else None."""
    config = model.config.get_text_config()
    window = getattr(config, "sliding_window", None)
    if window is not None and "sliding_attention" in (getattr(config, "layer_types", None) or []) \
            and max_seq_len > window:
        return int(window)
    return None


def custom_ops_module(model: PreTrainedModel, max_seq_len: int) -> torch.nn.Module:
    """``model`` as a module of ``(input_ids [1, n], cache_position [n]) -> logits [1, n, vocab]`` over a KV cache of
    ``max_seq_len`` positions that ExecuTorch's ops write and read, a ring for sliding-window layers (``n`` then at
    most the window: ``ring_window``; the caller checked ``custom_ops_problem``)."""
    import torch
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401 - registers torch.ops.llama
    from transformers.cache_utils import StaticCache, StaticLayer
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    config = model.config.get_text_config()
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    window = ring_window(model, max_seq_len)
    layer_types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers

    class OpsLayer(StaticLayer):  # type: ignore[misc]
        """One layer's keys and values, ``[1, position, kv_head, head_dim]``, written by ``update_cache``."""

        def __init__(self, length: int = max_seq_len) -> None:
            super().__init__(length)
            keys = torch.zeros(1, length, kv_heads, head_dim, dtype=model.dtype, device=model.device)
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

    class RingLayer(OpsLayer):
        """A sliding-window layer's keys and values in ``2 * window`` slots, and the position each slot holds (-1: none
        yet), as ExecuTorch's ``CustomRingKVCache`` keeps them; ``mask`` is this call's window over the slots."""

        def __init__(self, window: int) -> None:
            super().__init__(2 * window)
            self.window = window
            self.positions = torch.full((2 * window,), -1, dtype=torch.long, device=model.device)
            self.mask = torch.zeros(0)

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            keys, values = self.cache_tensors
            slots = self.positions.shape[0]
            written = torch.arange(key_states.shape[2], dtype=torch.long, device=keys.device) + decoder.start
            indices = written % slots
            # A call from position 0 starts a new sequence: every slot at or after the call's start is forgotten.
            kept = torch.arange(slots, device=keys.device) < decoder.start
            self.positions.copy_(torch.where(kept, self.positions, torch.full_like(self.positions, -1)))
            self.positions.index_copy_(0, indices, written)
            torch.ops.llama.update_cache_with_indices(key_states.transpose(1, 2), keys, decoder.start,
                                                      indices.unsqueeze(0))
            torch.ops.llama.update_cache_with_indices(value_states.transpose(1, 2), values, decoder.start,
                                                      indices.unsqueeze(0))
            distance = written.view(-1, 1) - self.positions
            allowed = (self.positions >= 0) & (distance >= 0) & (distance < self.window)
            self.mask = torch.where(allowed, 0.0, float("-inf")).to(keys.dtype)
            return keys.transpose(1, 2), values.transpose(1, 2)

    def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: Any, scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
        # custom_sdpa(q, k_cache, v_cache, start_pos, attn_mask, dropout_p, is_causal, scale); grouped KV heads in the op.
        # A ring layer's window is its mask over the slots (start_pos unused with a mask); else causal from start.
        layer = decoder.cache.layers[module.layer_idx]  # type: ignore[index]
        mask = layer.mask if isinstance(layer, RingLayer) else None
        output = torch.ops.llama.custom_sdpa(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                                             decoder.start if mask is None else 0, mask, 0.0, mask is None, scaling)
        return output, None

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.cache = StaticCache(config=config, max_cache_len=max_seq_len)
            layers = [RingLayer(window) if window is not None and kind == "sliding_attention" else OpsLayer()
                      for kind in layer_types[:config.num_hidden_layers]]
            self.cache.layers = list(layers)
            for index, layer in enumerate(layers):  # mutable buffers of the exported program
                self.register_buffer(f"key_cache_{index}", layer.cache_tensors[0], persistent=False)
                self.register_buffer(f"value_cache_{index}", layer.cache_tensors[1], persistent=False)
                if isinstance(layer, RingLayer):
                    self.register_buffer(f"ring_positions_{index}", layer.positions, persistent=False)
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
