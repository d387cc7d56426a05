"""An attention step over a KV cache, written with the slicing idioms that become ``*_copy`` ops on the edge.

Every ``cache[:, :, :pos]``, per-head ``select``, ``view``/``permute``/``transpose`` of q/k/v, ``narrow`` and
``split`` here is a view in eager mode and a copy after edge functionalization: the raw material of
``ReplaceViewCopyWithViewPass``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from conformance.models._seeded import finish, seeded_init, seeded_normal

__all__ = ["SlicingBlock", "build_slicing_block"]

Methods = dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]


class SlicingBlock(nn.Module):
    """x [B, L, D], caches [B, H, S, Dh] holding ``pos`` valid entries → (out [B, L, D], updated k cache)."""

    def __init__(self, dim: int, heads: int, pos: int) -> None:
        super().__init__()
        self.heads, self.head_dim, self.pos = heads, dim // heads, pos
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(
        self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, length, dim = x.shape
        qkv = self.qkv(x).view(batch, length, 3, self.heads, self.head_dim)
        q = qkv.select(2, 0).transpose(1, 2)
        k = qkv[:, :, 1].permute(0, 2, 1, 3)
        v = qkv.narrow(2, 2, 1).squeeze(2).transpose(1, 2)
        keys = torch.cat([k_cache[:, :, : self.pos], k], dim=2)
        values = torch.cat([v_cache[:, :, : self.pos], v], dim=2)
        scale = 1.0 / math.sqrt(self.head_dim)
        per_head = []
        for h in range(self.heads):
            scores = (q[:, h] @ keys[:, h].transpose(-1, -2)) * scale
            per_head.append(scores.softmax(dim=-1) @ values[:, h])
        out = torch.stack(per_head, dim=1).transpose(1, 2).reshape(batch, length, dim)
        first, second = out.split(dim // 2, dim=-1)
        mixed = torch.cat([second, first.flip(-1)], dim=-1)
        new_k_cache = k_cache.slice_scatter(k, dim=2, start=self.pos, end=self.pos + length)
        return self.proj(mixed) + x[:, -length:], new_k_cache


def build_slicing_block(dtype: torch.dtype, device: torch.device | str) -> Methods:
    batch, length, dim, heads, cache_len, pos = 2, 3, 32, 4, 12, 5
    module = finish(seeded_init(SlicingBlock(dim, heads, pos), seed=71), dtype, device)
    cache_shape = (batch, heads, cache_len, dim // heads)
    inputs = (
        seeded_normal((batch, length, dim), 72, dtype, device),
        seeded_normal(cache_shape, 73, dtype, device),
        seeded_normal(cache_shape, 74, dtype, device),
    )
    return {"forward": (module, inputs)}
