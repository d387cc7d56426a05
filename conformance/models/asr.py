"""A tiny ASR-like encoder/decoder: two methods, the encoder's output feeds every decoder step."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from conformance.models._seeded import finish, seeded_init, seeded_normal, seeded_tokens
from conformance.models.blocks import MLP, Attention

__all__ = ["ASR_BOS", "ASR_MAX_TOKENS", "AsrDecoder", "AsrEncoder", "build_asr"]

Methods = dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]

FEATURES, DIM, HEADS, VOCAB, FRAMES = 16, 32, 4, 96, 20
ASR_MAX_TOKENS = 32
"""Longest token sequence the decoder's positional table covers."""
ASR_BOS = 1


class AsrEncoder(nn.Module):
    """features [B, T, F] → hidden [B, ceil(T/2), D]: strided conv1d subsampling, one transformer layer."""

    def __init__(self, max_frames: int = 64) -> None:
        super().__init__()
        self.subsample = nn.Conv1d(FEATURES, DIM, kernel_size=3, stride=2, padding=1)
        self.pos = nn.Parameter(torch.zeros(max_frames, DIM))
        self.norm1, self.attn = nn.LayerNorm(DIM), Attention(DIM, HEADS)
        self.norm2, self.mlp = nn.LayerNorm(DIM), MLP(DIM, 2 * DIM)
        self.norm_out = nn.LayerNorm(DIM)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.subsample(features.transpose(1, 2))).transpose(1, 2)
        x = x + self.pos[: x.shape[1]]
        x = x + self.attn(self.norm1(x))
        x = x + self.mlp(self.norm2(x))
        return self.norm_out(x)


class AsrDecoder(nn.Module):
    """tokens [B, L] int64 + encoder hidden [B, T', D] → logits [B, L, V]; causal self-, cross-attention."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.zeros(ASR_MAX_TOKENS, DIM))
        self.norm1, self.self_attn = nn.LayerNorm(DIM), Attention(DIM, HEADS)
        self.norm2, self.cross_attn = nn.LayerNorm(DIM), Attention(DIM, HEADS)
        self.norm3, self.mlp = nn.LayerNorm(DIM), MLP(DIM, 2 * DIM)
        self.norm_out, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        x = x + self.self_attn(self.norm1(x), causal=True)
        x = x + self.cross_attn(self.norm2(x), source=hidden)
        x = x + self.mlp(self.norm3(x))
        return self.head(self.norm_out(x))


def build_asr(dtype: torch.dtype, device: torch.device | str) -> Methods:
    encoder = finish(seeded_init(AsrEncoder(), seed=81), dtype, device)
    decoder = finish(seeded_init(AsrDecoder(), seed=82), dtype, device)
    batch, tokens = 2, 4
    features = seeded_normal((batch, FRAMES, FEATURES), 83, dtype, device)
    hidden = seeded_normal((batch, (FRAMES + 1) // 2, DIM), 84, dtype, device)
    return {
        "encoder": (encoder, (features,)),
        "decoder": (decoder, (seeded_tokens((batch, tokens), 85, VOCAB, device), hidden)),
    }
