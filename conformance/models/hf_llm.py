"""A tiny Qwen3 (``transformers.Qwen3ForCausalLM``) as ``prefill`` + ``decode`` over a static KV cache.

The architecture is Hugging Face's own code, built from a config written here with seeded random weights
(no download): RoPE, grouped-query attention (4 query heads, 2 key/value heads), per-head q/k RMSNorm computed
in float32 whatever the model's dtype, tied input/output embeddings, and HF's ``StaticCache`` with its
masking utilities. The methods keep the multi-method contract of the zoo's own ``llm`` (``llm.py``), so the
greedy loop, the pipelines and the token oracle drive both unchanged:

* ``prefill(tokens [B, P] int64) → (logits [B, P, V], k_cache, v_cache [layers, B, H_kv, S_max, Dh])``,
  caches zero beyond ``P``;
* ``decode(token [B, 1], position [1] int64, k_cache, v_cache) → (logits [B, 1, V], caches)``.

The caches are explicit tensors in and out: each call builds a ``StaticCache`` whose layers hold (copies of)
the incoming tensors, lets the HF model write the new keys and values into it in place (``index_copy_``, as
upstream's static-cache export does), and returns the layers stacked. The copies keep the inputs unmutated,
so ``torch.export`` sees a functional graph and the caches can stay on the device between calls.
"""

from __future__ import annotations

import torch
from torch import nn

from conformance.models._seeded import finish, seeded_init, seeded_normal, seeded_tokens

__all__ = ["HF_LLM_MAX_SEQ", "HfLlmDecode", "HfLlmPrefill", "build_hf_llm", "hf_llm_config"]

Methods = dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 128, 32, 2, 4, 2, 8, 64
HF_LLM_MAX_SEQ = 16
"""S_max: static cache length, so prompt length + generated tokens must stay within it."""
BATCH, PROMPT = 2, 5


def hf_llm_config() -> object:
    """The Qwen3 config, in code (the shapes above; float32 master weights, SDPA attention)."""
    from transformers import Qwen3Config

    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        use_cache=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    config._attn_implementation = "sdpa"
    return config


def _static_cache(
    config: object, k_cache: torch.Tensor, v_cache: torch.Tensor, length: torch.Tensor
) -> object:
    """A ``StaticCache`` whose layers hold copies of the given caches, ``length`` tokens already written."""
    from transformers import StaticCache

    cache = StaticCache(config=config, max_cache_len=k_cache.shape[3])
    for index, layer in enumerate(cache.layers):
        layer.dtype, layer.device = k_cache.dtype, k_cache.device
        layer.batch_size, layer.num_heads = k_cache.shape[1], k_cache.shape[2]
        layer.k_head_dim, layer.v_head_dim = k_cache.shape[4], v_cache.shape[4]
        layer.keys, layer.values = k_cache[index].clone(), v_cache[index].clone()
        layer.cumulative_length = length.clone()
        layer.is_initialized = True
    return cache


def _stacked(cache: object) -> tuple[torch.Tensor, torch.Tensor]:
    return (
        torch.stack([layer.keys for layer in cache.layers]),  # type: ignore[attr-defined]
        torch.stack([layer.values for layer in cache.layers]),  # type: ignore[attr-defined]
    )


class HfLlmPrefill(nn.Module):
    """prompt tokens [B, P] → (logits [B, P, V], k/v caches [layers, B, H_kv, S_max, Dh] filled up to P)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        config = self.model.config
        dtype = self.model.get_input_embeddings().weight.dtype
        shape = (LAYERS, tokens.shape[0], KV_HEADS, HF_LLM_MAX_SEQ, HEAD_DIM)
        empty = torch.zeros(shape, dtype=dtype, device=tokens.device)
        cache = _static_cache(config, empty, empty, torch.zeros((), dtype=torch.int64, device=tokens.device))
        positions = torch.arange(tokens.shape[1], device=tokens.device).unsqueeze(0)
        out = self.model(input_ids=tokens, position_ids=positions, past_key_values=cache, use_cache=True)
        return (out.logits, *_stacked(cache))


class HfLlmDecode(nn.Module):
    """token [B, 1], position [1] int64, caches → (logits [B, 1, V], caches with ``position`` written)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, token: torch.Tensor, position: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cache = _static_cache(self.model.config, k_cache, v_cache, position.reshape(()))
        out = self.model(
            input_ids=token, position_ids=position.view(1, 1), past_key_values=cache, use_cache=True
        )
        return (out.logits, *_stacked(cache))


def build_hf_llm(dtype: torch.dtype, device: torch.device | str) -> Methods:
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)  # HF's own init runs first; every parameter is then overwritten from seed 101
    model = finish(seeded_init(Qwen3ForCausalLM(hf_llm_config()), seed=101), dtype, device)
    cache_shape = (LAYERS, BATCH, KV_HEADS, HF_LLM_MAX_SEQ, HEAD_DIM)
    filled = torch.arange(HF_LLM_MAX_SEQ, device=device).view(1, 1, 1, -1, 1) < PROMPT
    decode_inputs = (
        seeded_tokens((BATCH, 1), 105, VOCAB, device),
        torch.tensor([PROMPT], dtype=torch.int64, device=device),
        seeded_normal(cache_shape, 103, dtype, device) * filled,
        seeded_normal(cache_shape, 104, dtype, device) * filled,
    )
    return {
        "prefill": (HfLlmPrefill(model).eval(), (seeded_tokens((BATCH, PROMPT), 122, VOCAB, device),)),
        "decode": (HfLlmDecode(model).eval(), decode_inputs),
    }
