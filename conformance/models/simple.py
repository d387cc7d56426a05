"""Single-method models: one op or a small block each."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from conformance.models._seeded import finish, seeded_init, seeded_normal

__all__ = [
    "Add",
    "AddMul",
    "ResidualBlock",
    "Sdpa",
    "build_add",
    "build_add_mul",
    "build_conv1d",
    "build_linear",
    "build_residual_block",
    "build_sdpa",
]

Methods = dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]


class Add(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class AddMul(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return x * y + z


class Sdpa(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


class ResidualBlock(nn.Module):
    """conv → GroupNorm → ReLU → conv → GroupNorm, plus the input; GroupNorm keeps no running statistics."""

    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(channels, channels, kernel_size=3, padding=1)
        self.norm1 = nn.GroupNorm(groups, channels)
        self.conv2 = nn.Conv1d(channels, channels, kernel_size=3, padding=1)
        self.norm2 = nn.GroupNorm(groups, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(h)) + x)


def build_linear(dtype: torch.dtype, device: torch.device | str) -> Methods:
    module = finish(seeded_init(nn.Linear(32, 16), seed=11), dtype, device)
    return {"forward": (module, (seeded_normal((4, 32), 12, dtype, device),))}


def build_add(dtype: torch.dtype, device: torch.device | str) -> Methods:
    inputs = tuple(seeded_normal((4, 32), seed, dtype, device) for seed in (21, 22))
    return {"forward": (finish(Add(), dtype, device), inputs)}


def build_add_mul(dtype: torch.dtype, device: torch.device | str) -> Methods:
    inputs = tuple(seeded_normal((4, 32), seed, dtype, device) for seed in (31, 32, 33))
    return {"forward": (finish(AddMul(), dtype, device), inputs)}


def build_conv1d(dtype: torch.dtype, device: torch.device | str) -> Methods:
    module = finish(seeded_init(nn.Conv1d(4, 8, kernel_size=3, padding=1), seed=41), dtype, device)
    return {"forward": (module, (seeded_normal((2, 4, 16), 42, dtype, device),))}


def build_sdpa(dtype: torch.dtype, device: torch.device | str) -> Methods:
    inputs = tuple(seeded_normal((2, 4, 8, 16), seed, dtype, device) for seed in (51, 52, 53))
    return {"forward": (finish(Sdpa(), dtype, device), inputs)}


def build_residual_block(dtype: torch.dtype, device: torch.device | str) -> Methods:
    module = finish(seeded_init(ResidualBlock(channels=16, groups=4), seed=61), dtype, device)
    return {"forward": (module, (seeded_normal((2, 16, 12), 62, dtype, device),))}
