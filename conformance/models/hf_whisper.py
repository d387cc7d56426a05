"""A tiny Whisper (``transformers.WhisperForConditionalGeneration``) as ``encoder`` + ``decoder`` methods.

Hugging Face's own architecture from a config written here, with seeded random weights (no download): two
stride-1/stride-2 conv1d layers over log-mel features and a positional table, pre-LayerNorm encoder layers,
a decoder with causal self-attention (HF's masking utilities), cross-attention over the encoder's output and
an output projection tied to the token embedding. The methods keep the contract of the zoo's own ``asr``
(``asr.py``), so the greedy loop, the pipelines and the token oracle drive both unchanged:

* ``encoder(features [B, mels, 2·S_src]) → hidden [B, S_src, D]``;
* ``decoder(tokens [B, L] int64, hidden) → logits [B, L, V]`` (the whole growing sequence each step, no
  cache: ``L`` is dynamic, 2..``HF_WHISPER_MAX_TOKENS``).
"""

from __future__ import annotations

import torch
from torch import nn

from conformance.models._seeded import finish, seeded_init, seeded_normal, seeded_tokens

__all__ = [
    "HF_WHISPER_BOS",
    "HF_WHISPER_MAX_TOKENS",
    "HfWhisperDecoder",
    "HfWhisperEncoder",
    "build_hf_whisper",
    "hf_whisper_config",
]

Methods = dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]

VOCAB, DIM, HEADS, FFN, LAYERS, MELS, SOURCE = 96, 32, 4, 64, 2, 16, 16
HF_WHISPER_MAX_TOKENS = 32
"""Longest token sequence the decoder's positional table covers (``max_target_positions``)."""
HF_WHISPER_BOS = 1
"""``decoder_start_token_id``."""
FRAMES = 2 * SOURCE
"""Whisper's encoder insists on exactly ``max_source_positions · 2`` input frames (conv2: stride 2)."""
BATCH, TOKENS = 2, 4


def hf_whisper_config() -> object:
    from transformers import WhisperConfig

    config = WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=MELS,
        d_model=DIM,
        encoder_layers=LAYERS,
        decoder_layers=LAYERS,
        encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS,
        encoder_ffn_dim=FFN,
        decoder_ffn_dim=FFN,
        max_source_positions=SOURCE,
        max_target_positions=HF_WHISPER_MAX_TOKENS,
        pad_token_id=0,
        bos_token_id=HF_WHISPER_BOS,
        eos_token_id=2,
        decoder_start_token_id=HF_WHISPER_BOS,
        suppress_tokens=None,
        begin_suppress_tokens=None,
        tie_word_embeddings=True,
        use_cache=False,
    )
    # HF's eager attention (matmul, mask, softmax), not SDPA: with SDPA, exporting the decoder for CUDA in
    # float32 failed on an H100 (torch 2.11) with "Constraints violated (tokens)" — a guard on its dynamic
    # length, while float16/bfloat16 and the CPU exported. Under torch.export HF hands SDPA an explicit
    # causal mask; our reading (not yet confirmed on the GPU) is that float32, having no flash kernel, takes
    # the memory-efficient kernel, which pads that mask to a multiple of 16. Eager attention has no guard.
    config._attn_implementation = "eager"
    return config


class HfWhisperEncoder(nn.Module):
    """features [B, mels, frames] → the encoder's last hidden state [B, frames / 2, D]."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model.model.encoder(input_features=features).last_hidden_state


class HfWhisperDecoder(nn.Module):
    """tokens [B, L] int64 + encoder hidden [B, S, D] → logits [B, L, V] (tied output projection)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        decoded = self.model.model.decoder(input_ids=tokens, encoder_hidden_states=hidden, use_cache=False)
        return self.model.proj_out(decoded.last_hidden_state)


def build_hf_whisper(dtype: torch.dtype, device: torch.device | str) -> Methods:
    from transformers import WhisperForConditionalGeneration

    torch.manual_seed(0)  # HF's own init runs first; every parameter is then overwritten from seed 111
    model = finish(seeded_init(WhisperForConditionalGeneration(hf_whisper_config()), seed=111), dtype, device)
    features = seeded_normal((BATCH, MELS, FRAMES), 112, dtype, device)
    hidden = seeded_normal((BATCH, SOURCE, DIM), 113, dtype, device)
    tokens = seeded_tokens((BATCH, TOKENS), 114, VOCAB, device)
    return {
        "encoder": (HfWhisperEncoder(model).eval(), (features,)),
        "decoder": (HfWhisperDecoder(model).eval(), (tokens, hidden)),
    }
