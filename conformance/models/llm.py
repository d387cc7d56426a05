"""A tiny LLM-like model: ``prefill`` fills a KV cache, ``decode`` extends it one token at a time.

The caches are plain inputs and outputs ([layers, B, H, S_max, Dh]) updated functionally with ``index_copy``,
so both methods export with static shapes and the caches can stay on the device between calls.
"""

from __future__ import annotations

import torch
from torch import nn

from conformance.models._seeded import finish, seeded_init, seeded_normal, seeded_tokens
from conformance.models.blocks import MLP, Attention

__all__ = ["LLM_MAX_SEQ", "LlmCore", "LlmDecode", "LlmPrefill", "build_llm"]

Methods = dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]

DIM, HEADS, LAYERS, VOCAB = 32, 4, 2, 128
LLM_MAX_SEQ = 16
"""S_max: cache length, so prompt length + generated tokens must stay within it."""


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(DIM), Attention(DIM, HEADS)
        self.norm2, self.mlp = nn.LayerNorm(DIM), MLP(DIM, 2 * DIM)


class LlmCore(nn.Module):
    """The weights both methods share."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(LLM_MAX_SEQ, DIM)
        self.layers = nn.ModuleList(_Layer() for _ in range(LAYERS))
        self.norm_out, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def prefill(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        length = tokens.shape[1]
        x = self.embed(tokens) + self.pos(torch.arange(length, device=tokens.device))
        ks, vs = [], []
        for layer in self.layers:
            h = layer.norm1(x)
            k, v = layer.attn.project_kv(h)
            x = x + layer.attn.attend(h, k, v, causal=True)
            x = x + layer.mlp(layer.norm2(x))
            ks.append(self._pad(k))
            vs.append(self._pad(v))
        return self.head(self.norm_out(x)), torch.stack(ks), torch.stack(vs)

    def decode(
        self, token: torch.Tensor, position: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.embed(token) + self.pos(position)
        # [1, S_max] bool: keys at or before ``position`` are visible; SDPA broadcasts it over batch, heads.
        visible = (torch.arange(LLM_MAX_SEQ, device=token.device) <= position).view(1, LLM_MAX_SEQ)
        ks, vs = [], []
        for index, layer in enumerate(self.layers):
            h = layer.norm1(x)
            k_new, v_new = layer.attn.project_kv(h)
            k = k_cache[index].index_copy(2, position, k_new)
            v = v_cache[index].index_copy(2, position, v_new)
            x = x + layer.attn.attend(h, k, v, mask=visible)
            x = x + layer.mlp(layer.norm2(x))
            ks.append(k)
            vs.append(v)
        return self.head(self.norm_out(x)), torch.stack(ks), torch.stack(vs)

    @staticmethod
    def _pad(kv: torch.Tensor) -> torch.Tensor:
        batch, heads, length, head_dim = kv.shape
        return torch.cat([kv, kv.new_zeros(batch, heads, LLM_MAX_SEQ - length, head_dim)], dim=2)


class LlmPrefill(nn.Module):
    """prompt tokens [B, P] → (logits [B, P, V], k/v caches [layers, B, H, S_max, Dh] filled up to P)."""

    def __init__(self, core: LlmCore) -> None:
        super().__init__()
        self.core = core

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.core.prefill(tokens)


class LlmDecode(nn.Module):
    """token [B, 1], position [1] int64, caches → (logits [B, 1, V], caches with ``position`` written)."""

    def __init__(self, core: LlmCore) -> None:
        super().__init__()
        self.core = core

    def forward(
        self, token: torch.Tensor, position: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.core.decode(token, position, k_cache, v_cache)


def build_llm(dtype: torch.dtype, device: torch.device | str) -> Methods:
    core = finish(seeded_init(LlmCore(), seed=91), dtype, device)
    batch, prompt = 2, 5
    cache_shape = (LAYERS, batch, HEADS, LLM_MAX_SEQ, DIM // HEADS)
    filled = torch.arange(LLM_MAX_SEQ, device=device).view(1, 1, 1, -1, 1) < prompt
    k_cache = seeded_normal(cache_shape, 93, dtype, device) * filled
    v_cache = seeded_normal(cache_shape, 94, dtype, device) * filled
    decode_inputs = (
        seeded_tokens((batch, 1), 95, VOCAB, device),
        torch.tensor([prompt], dtype=torch.int64, device=device),
        k_cache,
        v_cache,
    )
    return {
        "prefill": (LlmPrefill(core).eval(), (seeded_tokens((batch, prompt), 92, VOCAB, device),)),
        "decode": (LlmDecode(core).eval(), decode_inputs),
    }
