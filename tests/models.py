"""Model factories the tests' specs point at (``tests/models.py:<factory>``)."""

from __future__ import annotations

import os

import torch
from torch import nn


class ConvNet(nn.Module):
    # Named children: executorch 1.4.1's FuseBatchNormPass fails on a conv whose parameter is a
    # bare index ("0.weight"), as in a top-level nn.Sequential.
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def convnet() -> nn.Module:
    """Conv + batch norm with non-trivial running statistics."""
    torch.manual_seed(0)
    model = ConvNet()
    model.bn.running_mean.uniform_(-0.5, 0.5)
    model.bn.running_var.uniform_(0.5, 1.5)
    return model


class TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.proj(x)
        return torch.relu(y), y.sum(dim=-1)


def two_outputs() -> nn.Module:
    torch.manual_seed(1)
    return TwoOutputs()


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc1(x))


def mlp() -> nn.Module:
    torch.manual_seed(2)
    return Mlp()


class SlowMlp(Mlp):
    """``mlp``'s outputs after far more work: a deep detour whose result is added times zero."""

    def __init__(self) -> None:
        super().__init__()
        self.detour = nn.Sequential(nn.Linear(64, 512), *(nn.Linear(512, 512) for _ in range(6)), nn.Linear(512, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.fc1(x))
        # Nothing folds a multiply by zero away, so the detour is really run.
        return self.fc2(hidden + 0.0 * torch.tanh(self.detour(hidden)))


def mlp_slow() -> nn.Module:
    """Same weights (seed) and outputs as ``mlp``, several times slower."""
    torch.manual_seed(2)
    return SlowMlp()


def mlp_other() -> nn.Module:
    """``mlp``'s architecture with other weights: same shapes, different outputs."""
    torch.manual_seed(7)
    return Mlp()


class Wide(nn.Module):
    """Two square layers: weights of 8 * width**2 bytes (float32)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def wide_24mb() -> nn.Module:
    torch.manual_seed(3)
    return Wide(1774)


def wide_200mb() -> nn.Module:
    torch.manual_seed(4)
    return Wide(5120)


def wide_1024() -> nn.Module:
    """8 MiB of float32 weights in widths int8da4w's groups of 32 divide (the quantization benchmark)."""
    torch.manual_seed(0)
    return Wide(1024)


def wide_256() -> nn.Module:
    """The quantization benchmark's smoke size: 0.5 MiB of weights."""
    torch.manual_seed(0)
    return Wide(256)


def not_a_module() -> object:
    return {"weights": [1, 2, 3]}


def aborts() -> nn.Module:
    os.abort()


def raises() -> nn.Module:
    raise RuntimeError("factory exploded on purpose")


def kills_itself() -> nn.Module:
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")


def hangs() -> nn.Module:
    import time

    time.sleep(3600)
    raise AssertionError("unreachable")


def allocates_too_much() -> nn.Module:
    torch.empty(64 * 2**30, dtype=torch.uint8).fill_(1)  # 64 GiB
    return Mlp()


def grows_slowly() -> nn.Module:
    """Touches 256 MiB more every 50 ms up to 8 GiB: a resident-memory watch must stop it early."""
    import time

    held = []
    for _ in range(32):
        held.append(torch.ones(256 * 2**20, dtype=torch.uint8))
        time.sleep(0.05)
    return Mlp()


class NeedsPickle:
    """Not a tensor: saving one of these makes a file weights_only=True must refuse."""

    def __init__(self) -> None:
        self.payload = [1, 2, 3]


class Mixed(nn.Module):
    """XNNPACK takes the linears and the sigmoid, not topk, cumsum or the comparison."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(16, 16)
        self.l2 = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        s = torch.sigmoid(self.l1(x))
        values, indices = torch.topk(s, 4, dim=-1)
        return {"logits": self.l2(torch.cumsum(s, dim=-1)), "top": [indices, values > 0.5]}


def mixed() -> nn.Module:
    """Nested dict output with float, int64 and bool leaves; two operators XNNPACK leaves to portable."""
    torch.manual_seed(3)
    return Mixed()


def mixed_dataset() -> object:
    """Three real-looking samples of different batch sizes for ``mixed``."""
    generator = torch.Generator().manual_seed(7)
    return ((torch.rand(batch, 16, generator=generator) * 4 - 2,) for batch in (1, 4, 6))


def sleepy_dataset() -> object:
    """A dataset that never yields: validation must time out, not hang."""
    import time

    time.sleep(3600)
    return []


class AddOne(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def add_one() -> nn.Module:
    """The backend page's first model."""
    return AddOne()


class ErfinvChain(nn.Module):
    # TensorRT has no converter for erfinv; tanh keeps its input inside (-1, 1).
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cos(torch.erfinv(torch.tanh(x)))


def erfinv_chain() -> nn.Module:
    """cos(erfinv(tanh(x))): TensorRT, the CUDA backend, TensorRT again when coalesced."""
    return ErfinvChain()


class WeightedMm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(64, 64) / 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cos(torch.tanh(torch.mm(x, self.w)))


def weighted_mm() -> nn.Module:
    """A weight for the CUDA backend when mm is kept out of TensorRT (its weights go to the .ptd)."""
    torch.manual_seed(3)
    return WeightedMm()


def tiny_bert() -> nn.Module:
    """A Hugging Face BertModel built from a small config (no hub access), returning tensors only."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(5)
    config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32)
    return BertModel(config, add_pooling_layer=False).eval()


class ReturnsCache(nn.Module):
    """Returns a transformers DynamicCache beside a tensor, as a decoder with use_cache=True does."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, object]:
        from transformers import DynamicCache

        cache = DynamicCache()
        cache.update(x, x * 2, 0)
        return x + 1, cache


def returns_cache() -> nn.Module:
    return ReturnsCache()


class Sorts(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sort(x, dim=-1).values


def sorts() -> nn.Module:
    """Calls aten::sort, which ExecuTorch's portable runtime has no kernel for."""
    return Sorts()


class BranchesOnValues(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        if y.sum().item() > 0:  # the line the export failure must name
            return y + 1
        return y - 1


def branches_on_values() -> nn.Module:
    """Data-dependent control flow: torch.export cannot trace the branch."""
    return BranchesOnValues()


class Spectrum(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.rfft(x).abs()


def spectrum() -> nn.Module:
    """torch.fft.rfft: complex intermediates, which ExecuTorch's lowering does not take."""
    return Spectrum()


class Conv1dNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def conv1d() -> nn.Module:
    """A 1-D convolution: with a dynamic batch its program cannot run the largest batch (ExecuTorch 1.4.1)."""
    torch.manual_seed(6)
    return Conv1dNet()
