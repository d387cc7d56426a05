"""The model zoo: every model the suite lowers, built in code with seeded weights (no downloads)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from conformance.models.asr import ASR_MAX_TOKENS, build_asr
from conformance.models.llm import build_llm
from conformance.models.simple import (
    build_add,
    build_add_mul,
    build_conv1d,
    build_linear,
    build_residual_block,
    build_sdpa,
)
from conformance.models.slicing import build_slicing_block

__all__ = ["DTYPES", "ZOO", "Methods", "ZooModel", "get_model"]

Methods = dict[str, tuple[nn.Module, tuple[Any, ...]]]
"""method name → (module, example inputs). Methods of one model share weights."""

DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)


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
    ),
    ZooModel(
        "llm",
        build_llm,
        "prefill: tokens [2, 5] int64 → logits [2, 5, 128], k/v caches [2, 2, 4, 16, 8]; "
        "decode: token [2, 1], position [1] int64, caches → logits [2, 1, 128], caches",
        methods=("prefill", "decode"),
    ),
)

ZOO: Mapping[str, ZooModel] = {model.name: model for model in _MODELS}


def get_model(name: str) -> ZooModel:
    try:
        return ZOO[name]
    except KeyError:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(ZOO)}") from None
