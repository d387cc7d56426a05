"""Seeded, download-free weights and inputs, identical on every build and every machine."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["finish", "seeded_init", "seeded_normal", "seeded_tokens"]


def seeded_init(module: nn.Module, seed: int) -> nn.Module:
    """Overwrite every parameter from one generator, in name order, scaled so activations stay O(1)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(module.named_parameters(), key=lambda item: item[0]):
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if param.dim() >= 2:
                value = noise / math.sqrt(math.prod(param.shape[1:]))
            elif name.endswith("weight"):  # norm scales: around one
                value = 1.0 + 0.1 * noise
            else:
                value = 0.1 * noise
            param.copy_(value)
    return module


def finish(module: nn.Module, dtype: torch.dtype, device: torch.device | str) -> nn.Module:
    """Eval mode (no dropout, no running-stat updates), then the requested dtype and device."""
    return module.eval().to(device=device, dtype=dtype)


def seeded_normal(
    shape: tuple[int, ...], seed: int, dtype: torch.dtype, device: torch.device | str, scale: float = 1.0
) -> torch.Tensor:
    # Drawn in fp32 on the CPU so every dtype and device sees the same numbers, rounded once.
    generator = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(shape, generator=generator)).to(device=device, dtype=dtype)


def seeded_tokens(shape: tuple[int, ...], seed: int, vocab: int, device: torch.device | str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=generator, dtype=torch.int64).to(device)
