"""The oracle for multi-method pipelines: eager PyTorch's greedy tokens, and the rule that judges a backend's.

float32 tokens must equal eager's exactly. In float16 and bfloat16 a row may first differ from eager only on a
**near-tie**: in float64, with the common prefix teacher-forced, the logits of the two candidate tokens differ
by at most ``NEAR_TIE_FACTOR · tol · ‖logits‖₂`` (see ``test_multi_method.py`` for why). Shared by the
chapters that run the pipelines (``multi_method``, ``device_placement``).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from conformance.common.checks import fail
from conformance.common.pipelines import PIPELINE_MODELS, STEPS_BY_KIND
from conformance.common.programs import LoweredModel
from conformance.common.rules import rule_id
from conformance.common.tolerances import MODEL_TOLERANCES
from conformance.models import greedy

ASR_STEPS, LLM_STEPS = STEPS_BY_KIND["asr"], STEPS_BY_KIND["llm"]
#: Per pipeline model (``conformance.common.pipelines.PIPELINE_MODELS``): greedy steps and its two methods.
STEPS = {name: p.steps for name, p in PIPELINE_MODELS.items()}
METHODS = {name: p.methods for name, p in PIPELINE_MODELS.items()}
#: A legitimate half-precision flip: float64 logits of the two tokens within 2·tol·‖logits‖₂.
NEAR_TIE_FACTOR = 2.0

# The rules this module checks (conformance/catalogue/rule_table.py).
TOKENS = rule_id("multi_method/tokens")


Methods = dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]


def host_inputs(eager: Methods, method: str) -> list[torch.Tensor]:
    """The example inputs as an application holds them: host tensors."""
    return [t.detach().cpu() for t in eager[method][1]]


def eager_tokens(model: str, eager: Methods) -> torch.Tensor:
    """The oracle: the same greedy loop on the eager modules, SDPA's math kernel (as the lowering uses)."""
    p = PIPELINE_MODELS[model]
    first, second = (eager[m][0] for m in p.methods)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        return greedy(p.greedy, first, second, eager[p.methods[0]][1][0], p.steps)


def float64_module(eager: Methods, method: str) -> nn.Module:
    return copy.deepcopy(eager[method][0]).to(device="cpu", dtype=torch.float64).eval()


def as_float64(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu()
    return t.double() if t.is_floating_point() else t


def float64_path_logits(model: str, eager: Methods, tokens: torch.Tensor) -> torch.Tensor:
    """Teacher-forced float64 logits ``[B, steps, V]``: step s sees the prompt and ``tokens[:, :s]``.

    The modules run in float64 as far as they go: Hugging Face's RMSNorm and RoPE compute in float32 by
    design whatever the dtype, so for ``hf_llm`` those steps are float32-accurate (far below any bound here).
    """
    steps = tokens.shape[1]
    p = PIPELINE_MODELS[model]
    first_name, second_name = p.methods
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        if p.kind == "asr":
            hidden = float64_module(eager, first_name)(as_float64(eager[first_name][1][0]))
            bos = torch.full((tokens.shape[0], 1), p.greedy.bos, dtype=torch.int64)
            sequence = torch.cat([bos, tokens[:, : steps - 1].cpu()], dim=1)
            return float64_module(eager, second_name)(sequence, hidden)
        prefill, decode = float64_module(eager, first_name), float64_module(eager, second_name)
        prompt = as_float64(eager[first_name][1][0])
        logits, k_cache, v_cache = prefill(prompt)
        rows = [logits[:, -1]]
        for s in range(1, steps):
            where = torch.tensor([prompt.shape[1] + s - 1], dtype=torch.int64)
            logits, k_cache, v_cache = decode(tokens[:, s - 1 : s].cpu(), where, k_cache, v_cache)
            rows.append(logits[:, -1])
        return torch.stack(rows, dim=1)


def first_difference(got: torch.Tensor, want: torch.Tensor, row: int) -> int | None:
    diff = (got[row] != want[row]).nonzero()
    return int(diff[0]) if len(diff) else None


def check_tokens(
    model: str, lm: LoweredModel, got: torch.Tensor, want: torch.Tensor, call: str
) -> list[tuple[int, int, float, float]]:
    """float32: ``got == want`` exactly. Half precision: each row's first difference is a near-tie.
    Returns the accepted near-tie flips as (row, step, gap, bound)."""
    if got.shape != want.shape or got.dtype != torch.int64:
        fail(TOKENS, call, f"tokens {got.dtype}{list(got.shape)}, want int64{list(want.shape)}")
    flips: list[tuple[int, int, float, float]] = []
    for row in range(got.shape[0]):
        step = first_difference(got, want, row)
        if step is None:
            continue
        a, b = int(want[row, step]), int(got[row, step])
        if lm.dtype == torch.float32:
            fail(
                TOKENS,
                call,
                f"row {row} differs from eager first at step {step}: token {b}, eager {a} "
                f"(backend {got[row].tolist()}, eager {want[row].tolist()}); float32 must match exactly",
            )
        logits = float64_path_logits(model, lm.eager, want)[row, step]
        gap = float((logits[a] - logits[b]).abs())
        bound = NEAR_TIE_FACTOR * MODEL_TOLERANCES[lm.dtype] * float(logits.norm())
        if gap > bound:
            fail(
                TOKENS,
                call,
                f"row {row} differs from eager first at step {step}: token {b}, eager {a}; their float64 "
                f"logits differ by {gap:.4g} > {bound:.4g} (= {NEAR_TIE_FACTOR:g}·tol·‖logits‖): not a "
                f"rounding near-tie (backend {got[row].tolist()}, eager {want[row].tolist()})",
            )
        flips.append((row, step, gap, bound))
    return flips
