"""Transformer pieces shared by the zoo's attention models."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MLP", "Attention", "merge_heads", "split_heads"]


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, L, D] → [B, H, L, D/H]."""
    batch, length, dim = x.shape
    return x.view(batch, length, heads, dim // heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """[B, H, L, Dh] → [B, L, H*Dh]."""
    batch, heads, length, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * head_dim)


class Attention(nn.Module):
    """Multi-head attention through ``F.scaled_dot_product_attention``; self- or cross-attention."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)

    def project_kv(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return split_heads(self.k(source), self.heads), split_heads(self.v(source), self.heads)

    def attend(
        self,
        x: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        causal: bool = False,
    ) -> torch.Tensor:
        q = split_heads(self.q(x), self.heads)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        return self.o(merge_heads(out))

    def forward(
        self, x: torch.Tensor, source: torch.Tensor | None = None, causal: bool = False
    ) -> torch.Tensor:
        k, v = self.project_kv(x if source is None else source)
        return self.attend(x, k, v, causal=causal)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))
