"""The smallest real model, for the backend's own toolchain checks (preflight, load probe)."""

from __future__ import annotations

import torch


def trivial_linear(device: str | torch.device) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """A seeded ``nn.Linear(16, 8)`` and one non-zero input, on ``device``."""
    generator = torch.Generator().manual_seed(0)
    module = torch.nn.Linear(16, 8)
    with torch.no_grad():
        module.weight.copy_(torch.randn(8, 16, generator=generator))
        module.bias.copy_(torch.randn(8, generator=generator))
    x = torch.randn(4, 16, generator=generator)
    return module.to(device).eval(), (x.to(device),)
