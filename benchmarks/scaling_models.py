"""Model factories for the scaling benchmark: ``mb_<N>`` is an MLP whose weights weigh about N MB.

The size is in the factory's name (``mb_1``, ``mb_50``, ``mb_0p5``), not in the environment: export
children fork from a server started once, so they would not see a variable set later.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

LAYERS = 4


def factory_name(megabytes: float) -> str:
    """The factory of a model of ``megabytes`` of float32 weights."""
    return "mb_" + f"{megabytes:g}".replace(".", "p")


def width(megabytes: float) -> int:
    """Width of the LAYERS square layers that hold ``megabytes`` of float32 weights."""
    return int(math.sqrt(megabytes * 2**20 / 4 / LAYERS))


def __getattr__(name: str) -> Callable[[], nn.Module]:
    if not name.startswith("mb_"):
        raise AttributeError(name)
    size = width(float(name.removeprefix("mb_").replace("p", ".")))

    def build() -> nn.Module:
        torch.manual_seed(0)
        layers: list[nn.Module] = []
        for _ in range(LAYERS):
            layers += [nn.Linear(size, size), nn.ReLU()]
        return Mlp(nn.Sequential(*layers))

    return build


class Mlp(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)
