"""Broken backends for the multi-method chapter's pipelines: byte counters that a pipeline's real inputs and
outputs show wrong, and half-precision programs that lose accuracy the greedy tokens alone might hide.
Each wraps the reference and slips the way a real backend does; every failing case needs CUDA (on CPU the
self-tests skip them with the reason), so ``.ci/gpu/followup.sh`` runs them on the GPU machine.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from reference_impl import BACKEND as REFERENCE
from tests.broken.chapter import MULTI_METHOD, Forwarding
from tests.rule_coverage import Breaks

#: The byte counters' slots: the author's first model had two inputs (token ids and a position).
COUNTED_INPUTS = 2


def _host_bytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t.device.type == "cpu")


class CountsTwoInputSlots(Forwarding):
    """Keeps per-input upload counts in a fixed array of two slots: inputs past the second are copied to
    the GPU like the others but never counted. An LLM decode step's KV caches (inputs 3 and 4) vanish
    from ``h2d_bytes`` whenever they come from the host (breaks ``multi_method/h2d-bytes``)."""

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        result = REFERENCE.execute(handle, inputs, outputs)
        if handle.device.type == "cuda":
            stats = dict(handle._stats)
            stats["h2d_bytes"] -= _host_bytes(inputs[COUNTED_INPUTS:])
            handle._stats = stats
        return result


class LeavesTheLogitsCopyUncounted(Forwarding):
    """Copies output 0 (the logits, in every model its author tried) to the host with a call of its own
    that does not add to ``d2h_bytes``; the other outputs are counted. The host gets every byte, the
    counter misses the first output's (breaks ``multi_method/d2h-bytes``)."""

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        result = REFERENCE.execute(handle, inputs, outputs)
        if handle.device.type == "cuda" and result:
            stats = dict(handle._stats)
            stats["d2h_bytes"] -= _host_bytes(result[:1])
            handle._stats = stats
        return result


def fake_quantise_int4(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` rounded to 4-bit integers with one symmetric scale per output row, in its own dtype."""
    scale = weight.detach().abs().amax(dim=-1, keepdim=True).float().clamp_min(1e-12) / 7
    return ((weight.float() / scale).round().clamp(-8, 7) * scale).to(weight.dtype)


class QuantisesHalfPrograms(Forwarding):
    """Lowers float16 and bfloat16 models with weight-only int4 quantisation of every ``nn.Linear`` (on a
    copy: the caller's modules are untouched), a deployment default some mobile backends ship. The greedy
    tokens often survive; the logits are off by several per cent (breaks ``multi_method/first-step-logits``;
    float32 programs are lowered as they are)."""

    def lower(self, methods: Mapping[str, tuple[Any, ...]], *, device: str, **kwargs: Any) -> bytes:
        quantised = {name: (self._quantised(spec[0]), *spec[1:]) for name, spec in methods.items()}
        return REFERENCE.lower(quantised, device=device, **kwargs)

    @staticmethod
    def _quantised(module: nn.Module) -> nn.Module:
        dtypes = {p.dtype for p in module.parameters()}
        if not dtypes & {torch.float16, torch.bfloat16}:
            return module
        module = copy.deepcopy(module)
        with torch.no_grad():
            for layer in module.modules():
                if isinstance(layer, nn.Linear):
                    layer.weight.copy_(fake_quantise_int4(layer.weight))
        return module


# ========================================================================================= declarations

COUNTS_TWO_INPUT_SLOTS = CountsTwoInputSlots(
    "counts-two-input-slots",
    Breaks(
        ("multi_method/h2d-bytes",),
        MULTI_METHOD,
        ("-k", "llm_kv_cache_stays_on_gpu and float32-llm]"),
        cuda=True,
    ),
)
LEAVES_THE_LOGITS_COPY_UNCOUNTED = LeavesTheLogitsCopyUncounted(
    "leaves-the-logits-copy-uncounted",
    Breaks(
        ("multi_method/d2h-bytes",),
        MULTI_METHOD,
        ("-k", "(llm_kv_cache_stays_on_gpu and float32-llm]) or (asr_decoder_consumes and float32-asr])"),
        cuda=True,
    ),
)
QUANTISES_HALF_PROGRAMS = QuantisesHalfPrograms(
    "quantises-half-programs",
    Breaks(
        ("multi_method/first-step-logits",),
        MULTI_METHOD,
        ("-k", "pipeline_tokens_match_eager and (cuda-float16 or cuda-bfloat16) and not hf_"),
        cuda=True,
    ),
)
