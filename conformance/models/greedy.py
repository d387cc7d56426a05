"""Greedy decoding loops for the multi-method models.

The methods are passed as plain callables, so the same loop drives eager modules (the oracle) and a backend's
loaded methods; comparing the token ids compares the whole multi-call pipeline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from conformance.models.asr import ASR_BOS, ASR_MAX_TOKENS
from conformance.models.llm import LLM_MAX_SEQ

__all__ = ["asr_greedy", "llm_greedy"]

Method = Callable[..., Any]


def _outputs(result: Any) -> Sequence[torch.Tensor]:
    # Eager modules return a tensor or a tuple; a backend may hand back a list.
    return result if isinstance(result, (list, tuple)) else (result,)


def _next_token(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1].argmax(dim=-1, keepdim=True).to(torch.int64)


@torch.no_grad()
def asr_greedy(encoder: Method, decoder: Method, features: torch.Tensor, steps: int) -> torch.Tensor:
    """Encode once, then run the decoder ``steps`` times on the growing sequence; returns ids [B, steps]."""
    if not 0 < steps < ASR_MAX_TOKENS:
        raise ValueError(f"steps must be in 1..{ASR_MAX_TOKENS - 1}, got {steps}")
    hidden = _outputs(encoder(features))[0]
    tokens = torch.full((features.shape[0], 1), ASR_BOS, dtype=torch.int64, device=features.device)
    for _ in range(steps):
        logits = _outputs(decoder(tokens, hidden))[0]
        tokens = torch.cat([tokens, _next_token(logits).to(tokens.device)], dim=1)
    return tokens[:, 1:].cpu()


@torch.no_grad()
def llm_greedy(prefill: Method, decode: Method, prompt: torch.Tensor, steps: int) -> torch.Tensor:
    """Prefill the prompt, then decode ``steps - 1`` tokens through the KV cache; returns ids [B, steps]."""
    if not 0 < steps <= LLM_MAX_SEQ - prompt.shape[1] + 1:
        raise ValueError(
            f"steps must be in 1..{LLM_MAX_SEQ - prompt.shape[1] + 1} for this prompt, got {steps}"
        )
    logits, k_cache, v_cache = _outputs(prefill(prompt))
    token = _next_token(logits).to(prompt.device)
    generated = [token.cpu()]
    for position in range(prompt.shape[1], prompt.shape[1] + steps - 1):
        where = torch.tensor([position], dtype=torch.int64, device=prompt.device)
        logits, k_cache, v_cache = _outputs(decode(token, where, k_cache, v_cache))
        token = _next_token(logits).to(prompt.device)
        generated.append(token.cpu())
    return torch.cat(generated, dim=1)
