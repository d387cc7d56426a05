"""Multi-method pipelines through the protocol: the zoo's greedy loops, driven by a backend's handles.

The loops are the zoo's own (``conformance.models.greedy``), so a backend's tokens and eager PyTorch's come
from the very same code and input conventions: ASR ``encoder(features)`` once, then ``decoder(tokens,
hidden)`` on the growing sequence; LLM ``prefill(prompt)`` then ``decode(token, position, k_cache,
v_cache)``. Where tensors live is up to the backend's skip-copy option alone: these helpers never set it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from conformance.models import asr_greedy, llm_greedy
from conformance.protocol import Backend

#: One ``(method name, execute_stats)`` row per execute, in call order.
CallStats = list[tuple[str, dict[str, int]]]


def method_callable(
    backend: Backend, handle: object, method: str, stats: CallStats | None = None
) -> Callable[..., list[torch.Tensor]]:
    """``f(*tensors) -> outputs``: one method of a backend as a plain function (what the loops call)."""

    def call(*tensors: torch.Tensor) -> list[torch.Tensor]:
        outputs = backend.execute(handle, list(tensors))  # type: ignore[attr-defined]
        if stats is not None:
            stats.append((method, dict(backend.execute_stats(handle))))  # type: ignore[attr-defined]
        return outputs

    call.__name__ = f"execute_{method}"
    return call


def asr_transcribe(
    backend: Backend,
    encoder: object,
    decoder: object,
    features: torch.Tensor,
    steps: int,
    stats: CallStats | None = None,
) -> torch.Tensor:
    """Greedy ASR: encoder once, decoder ``steps`` times; token ids ``[B, steps]`` (int64, CPU)."""
    return asr_greedy(
        method_callable(backend, encoder, "encoder", stats),
        method_callable(backend, decoder, "decoder", stats),
        features,
        steps,
    )


def llm_generate(
    backend: Backend,
    prefill: object,
    decode: object,
    prompt: torch.Tensor,
    steps: int,
    stats: CallStats | None = None,
) -> torch.Tensor:
    """Greedy LLM: prefill the prompt, then decode steps; token ids ``[B, steps]`` (int64, CPU)."""
    return llm_greedy(
        method_callable(backend, prefill, "prefill", stats),
        method_callable(backend, decode, "decode", stats),
        prompt,
        steps,
    )
