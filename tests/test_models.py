"""The model zoo: every model builds and runs in every dtype, deterministically, and exports; greedy loops."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from conformance.models import DTYPES, ZOO, asr_greedy, get_model, llm_greedy


def _flat(output: Any) -> list[torch.Tensor]:
    return list(output) if isinstance(output, (list, tuple)) else [output]


@torch.no_grad()
def _run(model: str, dtype: torch.dtype) -> dict[str, list[torch.Tensor]]:
    return {name: _flat(module(*inputs)) for name, (module, inputs) in ZOO[model].build(dtype, "cpu").items()}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("model", sorted(ZOO))
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
