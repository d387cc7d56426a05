"""Multi-method pipelines on delegate handles: the zoo's ASR-like and LLM-like greedy loops.

The loops themselves are the zoo's (``reference_impl.models.greedy``), driven here by handles instead of eager
modules, so the token ids of a backend and of eager PyTorch come from the very same code and input
conventions: ASR ``encoder(features)`` once, then ``decoder(tokens, hidden)`` on the growing sequence
(starting from ``ASR_BOS``); LLM ``prefill(prompt)`` then ``decode(token, position, k_cache, v_cache)``.

Where tensors live is decided by option ``skip_copy_output_to_cpu_for_method`` alone (these helpers never
change options). With ``encoder`` skipped the hidden states stay on the GPU and feed every decoder step
without a copy; with ``prefill`` and ``decode`` skipped the KV caches never leave the device — only the token
ids and the position cross PCIe (a few bytes per step). Without skipping, everything still works; the caches
just round-trip through the CPU (the traffic shows in ``stats``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from reference_impl.models.greedy import asr_greedy, llm_greedy
from reference_impl.runtime.delegate import DelegateHandle, execute, execute_stats
from reference_impl.runtime.errors import RuntimeArgumentError

__all__ = ["CallStats", "asr_transcribe", "llm_generate", "method_callable"]

CallStats = list[tuple[str, dict[str, int]]]
"""One ``(method name, execute_stats)`` row per execute, in call order."""


def method_callable(
    handle: DelegateHandle, stats: CallStats | None = None
) -> Callable[..., list[torch.Tensor]]:
    """``f(*tensors) -> outputs``: the handle as a plain function (what the greedy loops call)."""
    if not isinstance(handle, DelegateHandle):
        raise RuntimeArgumentError(f"handle must be a DelegateHandle, got {type(handle).__name__}")

    def call(*tensors: torch.Tensor) -> list[torch.Tensor]:
        outputs = execute(handle, list(tensors))
        if stats is not None:
            stats.append((handle.method_name, execute_stats(handle)))
        return outputs

    call.__name__ = f"execute_{handle.method_name}"
    return call


def _check_pair(first: Any, second: Any, names: tuple[str, str]) -> None:
    for handle, name in zip((first, second), names, strict=True):
        if not isinstance(handle, DelegateHandle):
            raise RuntimeArgumentError(f"{name} must be a DelegateHandle, got {type(handle).__name__}")
    if first.device != second.device:
        raise RuntimeArgumentError(
            f"{names[0]} runs on {first.device} but {names[1]} on {second.device}; a pipeline's methods must "
            "share one device so device-resident tensors can flow between them"
        )


def _check_kept(handles: tuple[DelegateHandle, ...], what: str) -> None:
    for handle in handles:
        if handle.device.type == "cuda" and not handle.options.should_skip_copy(handle.method_name):
            raise RuntimeArgumentError(
                f"{what}: method {handle.method_name!r} is not named in option "
                "skip_copy_output_to_cpu_for_method, so its outputs would be copied to the CPU"
            )


def asr_transcribe(
    encoder: DelegateHandle,
    decoder: DelegateHandle,
    features: torch.Tensor,
    steps: int,
    *,
    stats: CallStats | None = None,
    require_hidden_on_device: bool = False,
) -> torch.Tensor:
    """Greedy ASR: encoder once, decoder ``steps`` times; token ids ``[B, steps]`` (int64, CPU)."""
    _check_pair(encoder, decoder, ("encoder", "decoder"))
    if require_hidden_on_device:
        _check_kept((encoder,), "require_hidden_on_device")
    return asr_greedy(method_callable(encoder, stats), method_callable(decoder, stats), features, steps)


def llm_generate(
    prefill: DelegateHandle,
    decode: DelegateHandle,
    prompt: torch.Tensor,
    steps: int,
    *,
    stats: CallStats | None = None,
    require_cache_on_device: bool = False,
) -> torch.Tensor:
    """Greedy LLM: prefill the prompt, then ``steps - 1`` decode steps; token ids ``[B, steps]`` (CPU).

    ``require_cache_on_device``: refuse to run (``RuntimeArgumentError``) unless both methods keep their
    outputs — the KV caches — on the GPU.
    """
    _check_pair(prefill, decode, ("prefill", "decode"))
    if require_cache_on_device:
        _check_kept((prefill, decode), "require_cache_on_device")
    return llm_greedy(method_callable(prefill, stats), method_callable(decode, stats), prompt, steps)
