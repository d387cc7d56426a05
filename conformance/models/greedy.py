"""Greedy decoding loops for the multi-method models.

The methods are passed as plain callables, so the same loop drives eager modules (the oracle) and a backend's
loaded methods; comparing the token ids compares the whole multi-call pipeline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from conformance.models.asr import ASR_BOS, ASR_MAX_TOKENS
from conformance.models.llm import LLM_MAX_SEQ

if TYPE_CHECKING:
    from conformance.models.zoo import Greedy

__all__ = ["asr_greedy", "greedy", "llm_greedy"]

Method = Callable[..., Any]


def _outputs(result: Any) -> Sequence[torch.Tensor]:
    # Eager modules return a tensor or a tuple; a backend may hand back a list.
    return result if isinstance(result, (list, tuple)) else (result,)


def _next_token(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1].argmax(dim=-1, keepdim=True).to(torch.int64)


@torch.no_grad()
def asr_greedy(
    encoder: Method,
    decoder: Method,
    features: torch.Tensor,
    steps: int,
    *,
    bos: int = ASR_BOS,
    max_tokens: int = ASR_MAX_TOKENS,
) -> torch.Tensor:
    """Encode once, then run the decoder ``steps`` times on the growing sequence that starts with ``bos``
    (at most ``max_tokens`` long, the decoder's positional table); returns ids [B, steps]."""
    if not 0 < steps < max_tokens:
        raise ValueError(f"steps must be in 1..{max_tokens - 1}, got {steps}")
    hidden = _outputs(encoder(features))[0]
    tokens = torch.full((features.shape[0], 1), bos, dtype=torch.int64, device=features.device)
    for _ in range(steps):
        logits = _outputs(decoder(tokens, hidden))[0]
        tokens = torch.cat([tokens, _next_token(logits).to(tokens.device)], dim=1)
    return tokens[:, 1:].cpu()


@torch.no_grad()
def llm_greedy(
    prefill: Method, decode: Method, prompt: torch.Tensor, steps: int, *, max_seq: int = LLM_MAX_SEQ
) -> torch.Tensor:
    """Prefill the prompt, then decode ``steps - 1`` tokens through the KV cache (``max_seq`` long);
    returns ids [B, steps]."""
    if not 0 < steps <= max_seq - prompt.shape[1] + 1:
        raise ValueError(f"steps must be in 1..{max_seq - prompt.shape[1] + 1} for this prompt, got {steps}")
    logits, k_cache, v_cache = _outputs(prefill(prompt))
    token = _next_token(logits).to(prompt.device)
    generated = [token.cpu()]
    for position in range(prompt.shape[1], prompt.shape[1] + steps - 1):
        where = torch.tensor([position], dtype=torch.int64, device=prompt.device)
        logits, k_cache, v_cache = _outputs(decode(token, where, k_cache, v_cache))
        token = _next_token(logits).to(prompt.device)
        generated.append(token.cpu())
    return torch.cat(generated, dim=1)


def greedy(how: Greedy, first: Method, second: Method, first_input: torch.Tensor, steps: int) -> torch.Tensor:
    """The loop a zoo entry's ``greedy`` names, with its constants: ``asr_greedy`` or ``llm_greedy``."""
    if how.kind == "asr":
        return asr_greedy(first, second, first_input, steps, bos=how.bos, max_tokens=how.max_len)
    if how.kind == "llm":
        return llm_greedy(first, second, first_input, steps, max_seq=how.max_len)
    raise ValueError(f"unknown greedy kind {how.kind!r}: 'asr' or 'llm'")
