"""Models of the GPU benchmark (``benchmarks/gpu_latency.py``): an MLP and a tiny BERT; the ConvNet is the demo's."""

from __future__ import annotations

import torch
from torch import nn


class GeluMlp(nn.Module):
    """LayerNorm, a 4x GELU expansion and its projection: a transformer block's feed-forward half."""

    def __init__(self, width: int = 512) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return GeluMlp().eval()


class Bert(nn.Module):
    """A Hugging Face BertModel from a small config (no hub access) returning its last hidden state."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertModel

        config = BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=512, max_position_embeddings=64)
        self.bert = BertModel(config, add_pooling_layer=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids).last_hidden_state


def tiny_bert() -> nn.Module:
    torch.manual_seed(0)
    return Bert().eval()
