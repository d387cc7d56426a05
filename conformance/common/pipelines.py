"""Multi-method pipelines through the protocol: the zoo's greedy loops, driven by a backend's handles.

The loops are the zoo's own (``conformance.models.greedy``), so a backend's tokens and eager PyTorch's come
from the very same code and input conventions: ASR-kind ``encoder(features)`` once, then ``decoder(tokens,
hidden)`` on the growing sequence; LLM-kind ``prefill(prompt)`` then ``decode(token, position, k_cache,
v_cache)``. Where tensors live is up to the backend's options alone: these helpers never set them.

**Pipeline models** (``PIPELINE_MODELS``): every zoo entry with a ``greedy`` description — the zoo's own
``asr`` and ``llm`` and, with ``transformers`` installed (extra ``hf``), the Hugging Face architectures
``hf_whisper`` (ASR kind) and ``hf_llm`` (Qwen3, LLM kind). Chapters parametrize over ``pipeline_params()``
so an unavailable model is a skipped case with the reason rather than a missing one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pytest
import torch

from conformance.models import HF_KINDS, HF_UNAVAILABLE, ZOO, Greedy, greedy
from conformance.protocol import RuntimeBackend

__all__ = [
    "PIPELINE_MODELS",
    "CallStats",
    "PipelineModel",
    "asr_transcribe",
    "llm_generate",
    "method_callable",
    "pipeline_names",
    "pipeline_params",
    "run_greedy",
]

#: One ``(method name, execute_stats)`` row per execute, in call order.
CallStats = list[tuple[str, dict[str, int]]]

#: Greedy steps per kind: ASR decoder steps on the growing sequence; LLM tokens (prefill's + decodes').
STEPS_BY_KIND = {"asr": 6, "llm": 8}


@dataclass(frozen=True)
class PipelineModel:
    """A zoo model run as a two-method greedy pipeline, and how its methods feed each other."""

    name: str
    greedy: Greedy
    methods: tuple[str, str]
    steps: int
    #: second method's input index → (source method, output index): how one call's outputs feed the next.
    feeds: Mapping[int, tuple[str, int]] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.greedy.kind


def _pipeline(name: str) -> PipelineModel:
    entry = ZOO[name]
    assert entry.greedy is not None, name
    first, second = entry.methods
    # ASR kind: hidden states ← encoder output; LLM kind: k/v caches ← prefill's caches.
    feeds = {1: (first, 0)} if entry.greedy.kind == "asr" else {2: (first, 1), 3: (first, 2)}
    return PipelineModel(name, entry.greedy, (first, second), STEPS_BY_KIND[entry.greedy.kind], feeds)


PIPELINE_MODELS: Mapping[str, PipelineModel] = {
    name: _pipeline(name) for name, entry in ZOO.items() if entry.greedy is not None
}
"""The pipeline models present in this installation (``hf_*`` only with ``transformers``)."""


def pipeline_names(kind: str | None = None) -> list[str]:
    """Names of the available pipeline models (of one kind, ``"asr"`` or ``"llm"``, if given)."""
    return [name for name, p in PIPELINE_MODELS.items() if kind is None or p.kind == kind]


def pipeline_params(kind: str | None = None) -> list:
    """``pytest.param`` per pipeline model, the Hugging Face ones skipped with the reason when absent."""
    params: list = [pytest.param(name, id=name) for name in pipeline_names(kind)]
    if HF_UNAVAILABLE is not None:
        params += [
            pytest.param(name, id=name, marks=pytest.mark.skip(reason=HF_UNAVAILABLE))
            for name, model_kind in HF_KINDS.items()
            if kind is None or model_kind == kind
        ]
    return params


def method_callable(
    backend: RuntimeBackend, handle: object, method: str, stats: CallStats | None = None
) -> Callable[..., list[torch.Tensor]]:
    """``f(*tensors) -> outputs``: one method of a backend as a plain function (what the loops call)."""

    def call(*tensors: torch.Tensor) -> list[torch.Tensor]:
        outputs = backend.execute(handle, list(tensors))
        if stats is not None:
            stats.append((method, dict(backend.execute_stats(handle))))
        return outputs

    call.__name__ = f"execute_{method}"
    return call


def run_greedy(
    backend: RuntimeBackend,
    model: str,
    first: object,
    second: object,
    first_input: torch.Tensor,
    steps: int | None = None,
    stats: CallStats | None = None,
) -> torch.Tensor:
    """The pipeline model ``model``'s greedy loop on a backend's two handles; token ids ``[B, steps]``
    (int64, CPU). ``steps`` defaults to the model's ``PipelineModel.steps``."""
    p = PIPELINE_MODELS[model]
    return greedy(
        p.greedy,
        method_callable(backend, first, p.methods[0], stats),
        method_callable(backend, second, p.methods[1], stats),
        first_input,
        p.steps if steps is None else steps,
    )


def asr_transcribe(
    backend: RuntimeBackend,
    encoder: object,
    decoder: object,
    features: torch.Tensor,
    steps: int,
    stats: CallStats | None = None,
    model: str = "asr",
) -> torch.Tensor:
    """Greedy ASR: encoder once, decoder ``steps`` times; token ids ``[B, steps]`` (int64, CPU)."""
    return run_greedy(backend, model, encoder, decoder, features, steps, stats)


def llm_generate(
    backend: RuntimeBackend,
    prefill: object,
    decode: object,
    prompt: torch.Tensor,
    steps: int,
    stats: CallStats | None = None,
    model: str = "llm",
) -> torch.Tensor:
    """Greedy LLM: prefill the prompt, then decode steps; token ids ``[B, steps]`` (int64, CPU)."""
    return run_greedy(backend, model, prefill, decode, prompt, steps, stats)
