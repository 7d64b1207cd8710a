"""Model factories for the quantization benchmark: MLPs of two square linears, sized by their name.

``width_1024`` holds 2 x 1024 x 1024 float32 weights (8 MiB); widths are multiples of 32 so that
int8da4w's groups of 32 cover every layer. The width is in the factory's name, not in the
environment, because export children fork from a server started once.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn


class WeightHeavy(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def __getattr__(name: str) -> Callable[[], nn.Module]:
    if not name.startswith("width_"):
        raise AttributeError(name)
    width = int(name.removeprefix("width_"))

    def build() -> nn.Module:
        torch.manual_seed(0)
        return WeightHeavy(width)

    return build
