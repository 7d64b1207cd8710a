"""Model factories for the scaling benchmark: MLPs whose weights weigh about N MB."""

from __future__ import annotations

import math
import os

import torch
from torch import nn

LAYERS = 4


def build() -> nn.Module:
    """An MLP of LAYERS square layers sized by $SCALING_MB (float32 weights)."""
    megabytes = float(os.environ["SCALING_MB"])
    width = int(math.sqrt(megabytes * 2**20 / 4 / LAYERS))
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return Mlp(nn.Sequential(*layers), width)


class Mlp(nn.Module):
    def __init__(self, body: nn.Module, width: int) -> None:
        super().__init__()
        self.body = body
        self.width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)
