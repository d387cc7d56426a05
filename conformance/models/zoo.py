"""The model zoo: every model the suite lowers, built in code with seeded weights (no downloads)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from conformance.models.asr import ASR_BOS, ASR_MAX_TOKENS, build_asr
from conformance.models.llm import LLM_MAX_SEQ, build_llm
from conformance.models.simple import (
    build_add,
    build_add_mul,
    build_conv1d,
    build_linear,
    build_residual_block,
    build_sdpa,
)
from conformance.models.slicing import build_slicing_block

__all__ = [
    "DTYPES",
    "HF_KINDS",
    "HF_MODELS",
    "HF_UNAVAILABLE",
    "HF_VERSION",
    "ZOO",
    "Greedy",
    "Methods",
    "ZooModel",
    "get_model",
]

Methods = dict[str, tuple[nn.Module, tuple[Any, ...]]]
"""method name → (module, example inputs). Methods of one model share weights."""

DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)

HF_VERSION = "5.17.0"
"""The ``transformers`` release the Hugging Face entries are written and checked against (extra ``hf``)."""


@dataclass(frozen=True)
class Greedy:
    """How a two-method model decodes greedily (``conformance.models.greedy``).

    ``kind`` ``"asr"``: ``first(features)`` once, then ``second(tokens, hidden)`` on the growing sequence that
    starts with ``bos`` (at most ``max_len`` tokens). ``kind`` ``"llm"``: ``first(prompt)`` → logits and
    caches, then ``second(token, position, k_cache, v_cache)``; prompt + generated tokens ≤ ``max_len``.
    """

    kind: str
    max_len: int
    bos: int = 0


@dataclass(frozen=True)
class ZooModel:
    """One zoo entry. ``build(dtype, device)`` returns fresh modules and inputs, identical on every call."""

    name: str
    build: Callable[[torch.dtype, torch.device | str], Methods]
    doc: str
    methods: tuple[str, ...] = ("forward",)
    # Per method, the ``dynamic_shapes`` argument for ``torch.export`` when a method is meant to take varying
    # sizes (the ASR decoder's growing token sequence); made lazily because ``Dim`` objects are per export.
    dynamic_shapes: Mapping[str, Callable[[], Any]] = field(default_factory=dict)
    # Two-method models that decode greedily (the pipelines): how; None for single-call models.
    greedy: Greedy | None = None

    def dynamic_shapes_for(self, method: str) -> Any:
        factory = self.dynamic_shapes.get(method)
        return factory() if factory is not None else None


def _asr_decoder_dynamic() -> Any:
    # The sequence grows from one token, but export specializes size 1: one token needs a static export.
    tokens = torch.export.Dim("tokens", min=2, max=ASR_MAX_TOKENS)
    return {"tokens": {1: tokens}, "hidden": None}


_MODELS = (
    ZooModel("linear", build_linear, "x [4, 32] → nn.Linear(32, 16) → [4, 16]"),
    ZooModel("add", build_add, "x, y [4, 32] → x + y"),
    ZooModel("add_mul", build_add_mul, "x, y, z [4, 32] → x * y + z"),
    ZooModel("conv1d", build_conv1d, "x [2, 4, 16] → Conv1d(4, 8, k=3, pad=1) → [2, 8, 16]"),
    ZooModel("sdpa", build_sdpa, "q, k, v [2, 4, 8, 16] → F.scaled_dot_product_attention → [2, 4, 8, 16]"),
    ZooModel(
        "residual_block",
        build_residual_block,
        "x [2, 16, 12] → conv/GroupNorm/ReLU twice plus the input → [2, 16, 12]",
    ),
    ZooModel(
        "slicing_block",
        build_slicing_block,
        "x [2, 3, 32], k_cache, v_cache [2, 4, 12, 8] (5 valid) → (out [2, 3, 32], k_cache with x's keys)",
    ),
    ZooModel(
        "asr",
        build_asr,
        "encoder: features [2, 20, 16] → hidden [2, 10, 32]; "
        "decoder: tokens [2, L] int64 + hidden → logits [2, L, 96]",
        methods=("encoder", "decoder"),
        dynamic_shapes={"decoder": _asr_decoder_dynamic},
        greedy=Greedy("asr", ASR_MAX_TOKENS, ASR_BOS),
    ),
    ZooModel(
        "llm",
        build_llm,
        "prefill: tokens [2, 5] int64 → logits [2, 5, 128], k/v caches [2, 2, 4, 16, 8]; "
        "decode: token [2, 1], position [1] int64, caches → logits [2, 1, 128], caches",
        methods=("prefill", "decode"),
        greedy=Greedy("llm", LLM_MAX_SEQ),
    ),
)


# ============================================================================== Hugging Face architectures
# Built from ``transformers`` configs written in code, seeded random weights, no download. ``transformers``
# is the optional extra ``hf``: without it these entries are absent from ``ZOO`` and ``HF_UNAVAILABLE`` says
# why (chapters that name them skip with that reason). Found without importing it (importing costs seconds).

#: The Hugging Face entries and their greedy kind, whether or not ``transformers`` is installed.
HF_KINDS: Mapping[str, str] = {"hf_whisper": "asr", "hf_llm": "llm"}
#: The Hugging Face entries' names.
HF_MODELS: tuple[str, ...] = tuple(HF_KINDS)


def _hf_unavailable() -> str | None:
    try:
        found = importlib.util.find_spec("transformers") is not None
    except (ImportError, ValueError):  # blocked, or a broken half-import
        found = False
    if not found:
        return (
            f"transformers is not installed (the Hugging Face zoo entries {', '.join(HF_MODELS)} need the "
            f"optional extra: pip install '.[hf]', transformers=={HF_VERSION})"
        )
    return None


HF_UNAVAILABLE: str | None = _hf_unavailable()
"""Why the Hugging Face entries are absent from ``ZOO``; None when they are there."""


def _build_hf_whisper(dtype: torch.dtype, device: torch.device | str) -> Methods:
    from conformance.models.hf_whisper import build_hf_whisper

    return build_hf_whisper(dtype, device)


def _build_hf_llm(dtype: torch.dtype, device: torch.device | str) -> Methods:
    from conformance.models.hf_llm import build_hf_llm

    return build_hf_llm(dtype, device)


def _hf_whisper_decoder_dynamic() -> Any:
    tokens = torch.export.Dim("tokens", min=2, max=HF_WHISPER_MAX_TOKENS)
    return {"tokens": {1: tokens}, "hidden": None}


# Shapes repeated here (not imported) so the zoo imports without transformers; the modules assert them.
HF_WHISPER_MAX_TOKENS, HF_WHISPER_BOS, HF_LLM_MAX_SEQ = 32, 1, 16

_HF_ENTRIES = (
    ZooModel(
        "hf_whisper",
        _build_hf_whisper,
        "transformers WhisperForConditionalGeneration (2+2 layers, d 32, 4 heads, vocab 96, tied proj_out): "
        "encoder: features [2, 16 mels, 32] → hidden [2, 16, 32]; "
        "decoder: tokens [2, L] int64 + hidden → logits [2, L, 96]",
        methods=("encoder", "decoder"),
        dynamic_shapes={"decoder": _hf_whisper_decoder_dynamic},
        greedy=Greedy("asr", HF_WHISPER_MAX_TOKENS, HF_WHISPER_BOS),
    ),
    ZooModel(
        "hf_llm",
        _build_hf_llm,
        "transformers Qwen3ForCausalLM (2 layers, hidden 32, 4 q / 2 kv heads, RoPE, q/k RMSNorm, tied "
        "embeddings, StaticCache): prefill: tokens [2, 5] int64 → logits [2, 5, 128], k/v caches "
        "[2, 2, 2, 16, 8]; decode: token [2, 1], position [1] int64, caches → logits [2, 1, 128], caches",
        methods=("prefill", "decode"),
        greedy=Greedy("llm", HF_LLM_MAX_SEQ),
    ),
)
if HF_UNAVAILABLE is None:
    _MODELS = (*_MODELS, *_HF_ENTRIES)

ZOO: Mapping[str, ZooModel] = {model.name: model for model in _MODELS}


def get_model(name: str) -> ZooModel:
    try:
        return ZOO[name]
    except KeyError:
        if name in HF_MODELS and HF_UNAVAILABLE is not None:
            raise KeyError(f"zoo model {name!r} is unavailable: {HF_UNAVAILABLE}") from None
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(ZOO)}") from None
