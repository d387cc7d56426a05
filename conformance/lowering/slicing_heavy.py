"""The slicing-heavy graph of the lowering chapter's view-pass section: one attention step of an LLM decode
over a KV cache, in edge form (``conformance/common/edge_form.py``).

Heads are split with select/permute/view, half of each query is rotated with slices, the new keys and values
are written into the caches in place (buffers the program writes back), and attention reads the valid prefix
of the caches head by head: most of its ``*_copy`` nodes can safely become views, a few must not. The
catalogue of one graph per situation is ``conformance/lowering/view_pass_cases.py``.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.fx import GraphModule

from conformance.common.edge_form import edge_graph

__all__ = ["CachedAttention", "kv_cache_attention"]


class CachedAttention(nn.Module):
    """Two-head attention over a KV cache held in buffers: the slicing-heavy block of an LLM decode step.

    Splits heads with select/permute/view, rotates half of each query with slices, writes the new keys and
    values into the caches in place, and attends over the valid prefix of the caches, head by head.
    """

    def __init__(
        self, dim: int = 8, heads: int = 2, cache_len: int = 8, pos: int = 3, batch: int = 2
    ) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(2024)
        self.heads, self.head_dim, self.pos = heads, dim // heads, pos
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(dim))
        cache = (batch, heads, cache_len, self.head_dim)
        self.register_buffer("k_cache", torch.randn(cache, generator=gen))
        self.register_buffer("v_cache", torch.randn(cache, generator=gen))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        past = self.k_cache[:, :, : self.pos].mean()
        qkv = self.qkv(x).view(batch, length, 3, self.heads, self.head_dim)
        q = qkv.select(2, 0).transpose(1, 2)
        k = qkv[:, :, 1].permute(0, 2, 1, 3)
        v = qkv[:, :, 2].transpose(1, 2)
        half = self.head_dim // 2
        q = q + torch.cat([-q[..., half:], q[..., :half]], dim=-1)
        end = self.pos + length
        self.k_cache[:, :, self.pos : end] = k
        self.v_cache[:, :, self.pos : end] = v
        keys, values = self.k_cache[:, :, :end], self.v_cache[:, :, :end]
        heads = []
        for h in range(self.heads):
            scores = (q[:, h] @ keys[:, h].transpose(-1, -2)) / math.sqrt(self.head_dim)
            heads.append(scores.softmax(-1) @ values[:, h])
        out = torch.stack(heads, 1).transpose(1, 2).reshape(batch, length, dim)
        return self.proj(out) + x[:, -1:].expand(batch, length, dim) + past


def kv_cache_attention() -> tuple[GraphModule, tuple[torch.Tensor, ...]]:
    """The edge graph of one :class:`CachedAttention` step (two new tokens), with its inputs."""
    inputs = (torch.randn((2, 2, 8), generator=torch.Generator().manual_seed(14)),)
    return edge_graph(CachedAttention(), inputs)
