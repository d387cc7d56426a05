"""The model zoo: every model builds and runs in every dtype, deterministically, and exports; greedy loops."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from conformance.models import (
    DTYPES,
    HF_KINDS,
    HF_MODELS,
    HF_UNAVAILABLE,
    HF_VERSION,
    ZOO,
    asr_greedy,
    get_model,
    greedy,
    llm_greedy,
)

ROOT = Path(__file__).resolve().parents[2]
needs_hf = pytest.mark.skipif(HF_UNAVAILABLE is not None, reason=HF_UNAVAILABLE or "")


def _flat(output: Any) -> list[torch.Tensor]:
    return list(output) if isinstance(output, (list, tuple)) else [output]


@torch.no_grad()
def _run(model: str, dtype: torch.dtype) -> dict[str, list[torch.Tensor]]:
    return {name: _flat(module(*inputs)) for name, (module, inputs) in ZOO[model].build(dtype, "cpu").items()}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("model", sorted(ZOO))
@pytest.mark.proof
def test_builds_runs_and_is_deterministic(model: str, dtype: torch.dtype) -> None:
    methods = ZOO[model].build(dtype, "cpu")
    assert tuple(methods) == ZOO[model].methods
    for module, inputs in methods.values():
        assert not module.training
        assert all(p.dtype == dtype for p in module.parameters())
        assert all(t.dtype in (dtype, torch.int64) for t in inputs)
    first, second = _run(model, dtype), _run(model, dtype)
    for method, outputs in first.items():
        for a, b in zip(outputs, second[method], strict=True):
            assert a.dtype == dtype
            assert torch.isfinite(a).all(), f"{model}.{method} produced non-finite values in {dtype}"
            assert torch.equal(a, b), f"{model}.{method} differs between two builds"


def test_methods_of_one_model_share_weights() -> None:
    methods = ZOO["llm"].build(torch.float32, "cpu")
    prefill, decode = methods["prefill"][0], methods["decode"][0]
    assert prefill.core is decode.core


@pytest.mark.parametrize("model", sorted(ZOO))
@pytest.mark.proof
def test_fp32_exports_and_matches_eager(model: str) -> None:
    for method, (module, inputs) in ZOO[model].build(torch.float32, "cpu").items():
        exported = torch.export.export(module, inputs, strict=False)
        with torch.no_grad():
            expected, got = _flat(module(*inputs)), _flat(exported.module()(*inputs))
        for e, g in zip(expected, got, strict=True):
            torch.testing.assert_close(g, e, msg=f"{model}.{method}")


def test_asr_decoder_exports_with_a_dynamic_token_length() -> None:
    zoo = get_model("asr")
    decoder, (tokens, hidden) = zoo.build(torch.float32, "cpu")["decoder"]
    exported = torch.export.export(
        decoder, (tokens, hidden), dynamic_shapes=zoo.dynamic_shapes_for("decoder"), strict=False
    )
    for length in (2, 7):
        grown = torch.arange(length).remainder(96).repeat(2, 1)
        with torch.no_grad():
            torch.testing.assert_close(exported.module()(grown, hidden), decoder(grown, hidden))


def test_asr_greedy_is_deterministic_and_well_formed() -> None:
    runs = []
    for _ in range(2):
        methods = ZOO["asr"].build(torch.float32, "cpu")
        (encoder, (features,)), (decoder, _) = methods["encoder"], methods["decoder"]
        runs.append(asr_greedy(encoder, decoder, features, steps=5))
    assert runs[0].shape == (2, 5)
    assert runs[0].dtype == torch.int64
    assert torch.equal(runs[0], runs[1])
    assert ((runs[0] >= 0) & (runs[0] < 96)).all()


def test_llm_greedy_is_deterministic_and_matches_full_prefill() -> None:
    runs = []
    for _ in range(2):
        methods = ZOO["llm"].build(torch.float32, "cpu")
        (prefill, (prompt,)), (decode, _) = methods["prefill"], methods["decode"]
        runs.append(llm_greedy(prefill, decode, prompt, steps=6))
    tokens = runs[0]
    assert tokens.shape == (2, 6)
    assert torch.equal(tokens, runs[1])
    # Decoding through the KV cache must pick what a full prefill of the sequence picks (teacher forcing).
    with torch.no_grad():
        logits = prefill(torch.cat([prompt, tokens[:, :-1]], dim=1))[0]
    assert torch.equal(logits[:, prompt.shape[1] - 1 :].argmax(-1), tokens)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_greedy_helpers_run_in_half_precision(dtype: torch.dtype) -> None:
    asr, llm = ZOO["asr"].build(dtype, "cpu"), ZOO["llm"].build(dtype, "cpu")
    assert asr_greedy(asr["encoder"][0], asr["decoder"][0], asr["encoder"][1][0], steps=3).shape == (2, 3)
    assert llm_greedy(llm["prefill"][0], llm["decode"][0], llm["prefill"][1][0], steps=3).shape == (2, 3)


def test_greedy_helpers_refuse_impossible_lengths() -> None:
    llm = ZOO["llm"].build(torch.float32, "cpu")
    with pytest.raises(ValueError, match="steps must be in"):
        llm_greedy(llm["prefill"][0], llm["decode"][0], llm["prefill"][1][0], steps=100)
    asr = ZOO["asr"].build(torch.float32, "cpu")
    with pytest.raises(ValueError, match="steps must be in"):
        asr_greedy(asr["encoder"][0], asr["decoder"][0], asr["encoder"][1][0], steps=0)


def test_unknown_model_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="slicing_block"):
        get_model("resnet")


# ================================================================================ Hugging Face entries
# Eager and export-level checks only: no AOTInductor compile here (each costs 20-30 s on the CPU); the
# conformance chapters lower them (``pytest conformance -k hf_``).


def test_hf_extra_pins_the_version_the_zoo_names() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'hf = ["transformers=={HF_VERSION}"]' in pyproject
    assert f"transformers=={HF_VERSION}" in (ROOT / "README.md").read_text()


@pytest.mark.proof
def test_without_transformers_the_hf_entries_are_absent_and_say_why() -> None:
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "transformers":
            raise ModuleNotFoundError(name)
sys.meta_path.insert(0, Block())
from conformance.models import ZOO, HF_MODELS, HF_UNAVAILABLE, get_model
from conformance.common.pipelines import PIPELINE_MODELS, pipeline_params
assert not set(HF_MODELS) & set(ZOO), list(ZOO)
assert set(PIPELINE_MODELS) == {"asr", "llm"}, list(PIPELINE_MODELS)
assert "transformers" in HF_UNAVAILABLE and "[hf]" in HF_UNAVAILABLE
skipped = [p for p in pipeline_params() if p.marks]
assert [p.values[0] for p in skipped] == list(HF_MODELS)
assert all(m.kwargs["reason"] == HF_UNAVAILABLE for p in skipped for m in p.marks)
try:
    get_model("hf_llm")
except KeyError as exc:
    assert "transformers" in str(exc)
else:
    raise AssertionError("get_model('hf_llm') without transformers")
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


@needs_hf
def test_hf_entries_are_in_the_zoo_with_greedy_kinds() -> None:
    assert {"hf_whisper", "hf_llm"} <= set(ZOO)
    assert ZOO["hf_whisper"].methods == ("encoder", "decoder")
    assert ZOO["hf_whisper"].greedy is not None
    assert ZOO["hf_whisper"].greedy.kind == "asr"
    assert ZOO["hf_llm"].methods == ("prefill", "decode")
    assert ZOO["hf_llm"].greedy is not None
    assert ZOO["hf_llm"].greedy.kind == "llm"
    import transformers

    from conformance.models import hf_llm, hf_whisper

    # The zoo repeats these constants so it imports without transformers: they must agree.
    assert ZOO["hf_llm"].greedy.max_len == hf_llm.HF_LLM_MAX_SEQ
    assert ZOO["hf_whisper"].greedy.max_len == hf_whisper.HF_WHISPER_MAX_TOKENS
    assert ZOO["hf_whisper"].greedy.bos == hf_whisper.HF_WHISPER_BOS
    if transformers.__version__ != HF_VERSION:
        pytest.skip(
            f"transformers {transformers.__version__} installed; the zoo is checked against {HF_VERSION}"
        )


@needs_hf
def test_hf_llm_is_a_real_qwen3_with_tied_embeddings_and_a_static_cache() -> None:
    from transformers import Qwen3ForCausalLM

    methods = ZOO["hf_llm"].build(torch.float32, "cpu")
    (prefill, (prompt,)), (decode, inputs) = methods["prefill"], methods["decode"]
    assert isinstance(prefill.model, Qwen3ForCausalLM)
    assert prefill.model is decode.model
    assert prefill.model.lm_head.weight is prefill.model.get_input_embeddings().weight
    with torch.no_grad():
        logits, k_cache, v_cache = prefill(prompt)
        # The cache-free HF forward gives the same logits: the static cache and its mask change nothing.
        plain = prefill.model(input_ids=prompt, use_cache=False).logits
        torch.testing.assert_close(logits, plain)
        assert k_cache.shape == v_cache.shape == (2, 2, 2, 16, 8)
        assert not k_cache[:, :, :, prompt.shape[1] :].any()
        before = [t.clone() for t in inputs]
        decode(*inputs)
    assert all(torch.equal(a, b) for a, b in zip(before, inputs, strict=True)), "decode mutated its inputs"


@needs_hf
def test_hf_llm_greedy_through_the_cache_matches_full_prefill() -> None:
    methods = ZOO["hf_llm"].build(torch.float32, "cpu")
    (prefill, (prompt,)), (decode, _) = methods["prefill"], methods["decode"]
    tokens = greedy(ZOO["hf_llm"].greedy, prefill, decode, prompt, 8)
    again = ZOO["hf_llm"].build(torch.float32, "cpu")
    assert torch.equal(
        tokens, greedy(ZOO["hf_llm"].greedy, again["prefill"][0], again["decode"][0], prompt, 8)
    )
    assert tokens.shape == (2, 8)
    with torch.no_grad():
        logits = prefill.model(input_ids=torch.cat([prompt, tokens[:, :-1]], dim=1), use_cache=False).logits
    assert torch.equal(logits[:, prompt.shape[1] - 1 :].argmax(-1), tokens)
    with pytest.raises(ValueError, match="steps must be in"):
        greedy(ZOO["hf_llm"].greedy, prefill, decode, prompt, 13)


@needs_hf
@pytest.mark.proof
def test_hf_whisper_matches_the_hf_model_and_exports_with_a_dynamic_length() -> None:
    from transformers import WhisperForConditionalGeneration

    zoo = get_model("hf_whisper")
    methods = zoo.build(torch.float32, "cpu")
    (encoder, (features,)), (decoder, (tokens, hidden)) = methods["encoder"], methods["decoder"]
    assert isinstance(encoder.model, WhisperForConditionalGeneration)
    assert encoder.model.proj_out.weight is encoder.model.get_input_embeddings().weight
    with torch.no_grad():
        whole = encoder.model(input_features=features, decoder_input_ids=tokens).logits
        torch.testing.assert_close(decoder(tokens, encoder(features)), whole)
    exported = torch.export.export(
        decoder, (tokens, hidden), dynamic_shapes=zoo.dynamic_shapes_for("decoder"), strict=False
    )
    for length in (2, 9):
        grown = torch.arange(length).remainder(96).repeat(2, 1)
        with torch.no_grad():
            torch.testing.assert_close(exported.module()(grown, hidden), decoder(grown, hidden))
    first = greedy(zoo.greedy, encoder, decoder, features, 6)
    again = zoo.build(torch.float32, "cpu")
    assert torch.equal(first, greedy(zoo.greedy, again["encoder"][0], again["decoder"][0], features, 6))


def test_hf_model_names_are_stable() -> None:
    assert HF_MODELS == ("hf_whisper", "hf_llm")


@needs_hf
def test_hf_kinds_are_the_zoo_entries_kinds() -> None:
    """HF_KINDS speaks for the entries when transformers is absent: it must say what they are."""
    assert {name: ZOO[name].greedy.kind for name in HF_KINDS} == dict(HF_KINDS)
