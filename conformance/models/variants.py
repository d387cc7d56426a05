"""One small model and its variants, each differing from the base in exactly one thing a cache key can miss.

``build_variant(kind)`` returns the ``lower`` argument (``{"forward": (module, inputs, dynamic_shapes)}``)
for the base (``kind="base"``) or a variant that changes only:

* ``weight`` — one parameter's values;
* ``buffer`` — a non-persistent buffer's values (not in the ``state_dict``);
* ``submodule`` — a submodule's class (same signature, another function);
* ``attribute`` — a plain Python attribute the forward reads (a float: no tensor, no ``state_dict``);
* ``dim-bound`` — the upper bound of the dynamic batch dimension (``Dim("rows", max=...)``).

Every variant computes something else than the base on some input (``dim-bound``: on a batch the base
rejects), so a program served from a stale cache entry gives wrong values or a wrong verdict.
"""

from __future__ import annotations

import torch
from torch import nn

from conformance.models._seeded import seeded_init

__all__ = ["BASE_MAX_ROWS", "VARIANTS", "VariantModel", "build_variant", "variant_inputs"]

VARIANTS: tuple[str, ...] = ("weight", "buffer", "submodule", "attribute", "dim-bound")
BASE_MAX_ROWS, WIDE_MAX_ROWS, FEATURES = 8, 16, 16


class Shifted(nn.Module):
    """Like ReLU in signature, another function: x + 1 where x > 0, else 0."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, x + 1.0, torch.zeros_like(x))


class VariantModel(nn.Module):
    def __init__(self, activation: nn.Module, alpha: float, scale: torch.Tensor) -> None:
        super().__init__()
        self.linear = seeded_init(nn.Linear(FEATURES, 8), seed=71)
        self.activation = activation
        self.alpha = alpha
        self.register_buffer("scale", scale, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.linear(x) * self.scale + self.alpha)


def build_variant(kind: str, device: str | torch.device = "cpu") -> dict[str, tuple]:
    """The ``lower`` argument of the base (``"base"``) or of one variant (``VARIANTS``)."""
    if kind != "base" and kind not in VARIANTS:
        raise ValueError(f"unknown variant {kind!r}; variants: {VARIANTS}")
    scale = torch.linspace(0.5, 1.5, 8)
    if kind == "buffer":
        scale = scale.flip(0) * 2.0
    activation: nn.Module = Shifted() if kind == "submodule" else nn.ReLU()
    module = VariantModel(activation, 1.5 if kind == "attribute" else 0.25, scale)
    if kind == "weight":
        with torch.no_grad():
            module.linear.weight.mul_(-1.0)
    module = module.to(device).eval()
    rows = torch.export.Dim("rows", min=2, max=WIDE_MAX_ROWS if kind == "dim-bound" else BASE_MAX_ROWS)
    example = variant_inputs(4, device)
    return {"forward": (module, example, ({0: rows},))}


def variant_inputs(rows: int, device: str | torch.device = "cpu", seed: int = 5) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, FEATURES, generator=gen).to(device),)
