"""Factories and a calibration dataset for the quantization tests (``tests/quantized_models.py:<name>``)."""

from __future__ import annotations

import torch
from torch import nn


class TwoLinears(nn.Module):
    """fc1 takes 64 features (two groups of 32); fc2 takes 40, which no group of 32 divides."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 40)
        self.fc2 = nn.Linear(40, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def two_linears() -> nn.Module:
    """Seeded, so the export child and the validation child build the same weights."""
    torch.manual_seed(4)
    return TwoLinears()


def calibration() -> list[tuple[torch.Tensor]]:
    """Five seeded batches in the range the validation draws from."""
    generator = torch.Generator().manual_seed(5)
    return [(torch.rand(4, 64, generator=generator) * 2 - 1,) for _ in range(5)]
